"""The kubelet simulator driving the real plugin: slice wipe, registration, pod lifecycle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.kubelet import KubeletProtocol, KubeletSimulator
from tests.client_faults import ClientFaults
from tests.kubeletplugin.conftest import NODE, Dirs, create_claim, plugin_options
from tests.kubeletplugin.helpers import DRIVER, claim, result
from tests.waiting import wait_for


def foreign_slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "stale-other-driver"},
        "spec": {
            "driver": "other.example.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


@pytest.fixture
def node(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> Iterator[tuple[KubeletSimulator, KubeletPlugin]]:
    k8s.ResourceV1Api(api_client).create_resource_slice(foreign_slice(), _preload_content=False)
    kubelet = KubeletSimulator(NODE, dirs.registry, api_client, protocol, interval=0.05)
    kubelet.start()
    plugin = KubeletPlugin(
        plugin_options(dirs, publish=True), profile_gpus("t4", node_name=NODE, gpus=2), api_client
    )
    plugin.start()
    try:
        yield kubelet, plugin
    finally:
        plugin.stop()
        kubelet.stop()


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


def test_kubelet_simulator_end_to_end(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, dirs: Dirs
) -> None:
    kubelet, plugin = node
    api = k8s.ResourceV1Api(api_client)
    core = k8s.CoreV1Api(api_client)

    def slice_names() -> list[str]:
        on_node = f"spec.nodeName={NODE}"  # the shared server also holds other tests' nodes
        listed = api.list_resource_slice(field_selector=on_node, _preload_content=False)
        items = json.loads(listed.data)["items"]
        return [s["metadata"]["name"] for s in items]

    # kubelet wiped the foreign slice at start-up; our plugin registered and (re-)published its pool
    wait_for(lambda: DRIVER in kubelet.plugins)
    assert "stale-other-driver" not in slice_names()
    wait_for(lambda: [n for n in slice_names() if DRIVER in n])
    assert plugin.registration.registered.is_set()

    created = json.loads(core.create_namespaced_pod("default", pod("p1", "c1"), _preload_content=False).data)
    pod_uid = created["metadata"]["uid"]
    c = claim("c1", [result("gpu-1", memory="1Gi", cores=10)])
    c = create_claim(api_client, c)
    status = dict(c["status"], reservedFor=[{"resource": "pods", "name": "p1", "uid": pod_uid}])
    c["status"] = status
    api.replace_namespaced_resource_claim_status("c1", "default", c, _preload_content=False)

    ids = wait_for(lambda: kubelet.cdi_ids(pod_uid))
    claim_uid = c["metadata"]["uid"]
    assert ids[0].startswith(f"k8s.gpu.hami.io/gpu={claim_uid}-gpu-1-")
    assert (dirs.cdi / f"k8s.gpu.hami.io-gpu_{claim_uid}.json").exists()
    assert wait_for(lambda: kubelet.health.get((DRIVER, NODE, "gpu-1"))) == "HEALTHY"

    # prepared -> kubelet reports the pod Running
    def read_pod() -> dict[str, Any]:
        return dict(json.loads(core.read_namespaced_pod("p1", "default", _preload_content=False).data))

    running = wait_for(lambda: read_pod() if read_pod()["status"].get("phase") == "Running" else None)
    assert [s["ready"] for s in running["status"]["containerStatuses"]] == [True]

    # pod finishes -> kubelet unprepares -> the CDI spec and checkpoint entry are gone
    running["status"] = {"phase": "Succeeded"}
    core.replace_namespaced_pod_status("p1", "default", running, _preload_content=False)
    # The plugin removes the CDI spec, then the checkpoint entry: wait for both.
    wait_for(
        lambda: (
            not (dirs.cdi / f"k8s.gpu.hami.io-gpu_{claim_uid}.json").exists()
            and plugin.preparer.prepared() == {}
        )
    )
    assert not kubelet.errors, kubelet.errors


def test_pod_not_in_reserved_for_is_not_prepared(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, dirs: Dirs
) -> None:
    kubelet, _ = node
    core = k8s.CoreV1Api(api_client)
    create_claim(api_client, claim("c2", [result("gpu-0")]))
    created = json.loads(core.create_namespaced_pod("default", pod("p2", "c2"), _preload_content=False).data)
    state = wait_for(lambda: kubelet.pods.get(created["metadata"]["uid"]))
    assert "not allowed to use ResourceClaim c2" in state.error
    assert not list(dirs.cdi.glob("*.json"))


def test_pod_waits_for_a_claim_that_does_not_exist_yet(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, dirs: Dirs
) -> None:
    kubelet, _ = node
    core = k8s.CoreV1Api(api_client)
    api = k8s.ResourceV1Api(api_client)
    created = json.loads(core.create_namespaced_pod("default", pod("p3", "c3"), _preload_content=False).data)
    pod_uid = created["metadata"]["uid"]
    state = wait_for(lambda: kubelet.pods.get(pod_uid))
    assert "ResourceClaim c3 not found" in state.error
    c = create_claim(api_client, claim("c3", [result("gpu-0")]))
    c["status"] = dict(c["status"], reservedFor=[{"resource": "pods", "name": "p3", "uid": pod_uid}])
    api.replace_namespaced_resource_claim_status("c3", "default", c, _preload_content=False)
    assert wait_for(lambda: kubelet.cdi_ids(pod_uid))
    assert not kubelet.errors, kubelet.errors


def _running_pod_with_claim(api_client: Any, name: str, claim_name: str, device: str) -> tuple[str, str]:
    core, api = k8s.CoreV1Api(api_client), k8s.ResourceV1Api(api_client)
    created = json.loads(
        core.create_namespaced_pod("default", pod(name, claim_name), _preload_content=False).data
    )
    c = create_claim(api_client, claim(claim_name, [result(device, memory="1Gi", cores=10)]))
    c["status"] = dict(
        c["status"], reservedFor=[{"resource": "pods", "name": name, "uid": created["metadata"]["uid"]}]
    )
    api.replace_namespaced_resource_claim_status(claim_name, "default", c, _preload_content=False)
    return created["metadata"]["uid"], c["metadata"]["uid"]


def test_a_failed_status_report_is_retried(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, faults: ClientFaults
) -> None:
    kubelet, _ = node
    fault = faults.inject(r"/pods/p4/status$", status=500, count=2, methods={"PATCH"})
    _running_pod_with_claim(api_client, "p4", "c4", "gpu-0")
    core = k8s.CoreV1Api(api_client)

    def phase() -> str | None:
        return json.loads(core.read_namespaced_pod("p4", "default", _preload_content=False).data)[
            "status"
        ].get("phase")

    wait_for(lambda: phase() == "Running", 10, "the pod reported Running after the failed patches")
    assert fault.hits == 2 and any("cannot report pod p4 Running: 500" in e for e in kubelet.errors)


def test_an_unprepare_the_plugin_missed_is_retried_once_it_is_back(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, dirs: Dirs, protocol: KubeletProtocol
) -> None:
    kubelet, plugin = node
    pod_uid, claim_uid = _running_pod_with_claim(api_client, "p5", "c5", "gpu-1")
    wait_for(lambda: kubelet.cdi_ids(pod_uid), 10, "prepared")
    spec = dirs.cdi / f"k8s.gpu.hami.io-gpu_{claim_uid}.json"
    plugin.stop()  # the plugin is down ...
    k8s.CoreV1Api(api_client).delete_namespaced_pod("p5", "default", grace_period_seconds=0)
    wait_for(lambda: pod_uid in kubelet.unprepare_pending, 10, "the unprepare failed and is pending")
    assert spec.exists()
    back = KubeletPlugin(
        plugin_options(dirs, publish=True), profile_gpus("t4", node_name=NODE, gpus=2), api_client
    )
    back.start()  # ... and back: kubelet's retry unprepares the claim
    try:
        wait_for(
            lambda: not spec.exists() and pod_uid not in kubelet.unprepare_pending, 15, "unprepared on retry"
        )
        assert claim_uid not in back.preparer.prepared()
    finally:
        back.stop()


def test_a_pod_deleted_gracefully_is_unprepared_then_removed_as_kubelet_confirms_its_end(
    node: tuple[KubeletSimulator, KubeletPlugin], api_client: Any, dirs: Dirs
) -> None:
    """kube-apiserver keeps a deleted pod of a node, Terminating, until its kubelet deletes it
    with grace period 0 once the containers stopped: the claim is unprepared first."""
    kubelet, plugin = node
    core = k8s.CoreV1Api(api_client)
    pod_uid, claim_uid = _running_pod_with_claim(api_client, "p6", "c6", "gpu-1")
    wait_for(lambda: kubelet.cdi_ids(pod_uid), 10, "prepared")
    core.delete_namespaced_pod("p6", "default", _preload_content=False)  # the pod's default grace

    def gone() -> bool:
        listed = core.list_namespaced_pod(
            "default", field_selector="metadata.name=p6", _preload_content=False
        )
        return not json.loads(listed.data)["items"]

    wait_for(gone, 15, "the terminating pod removed by its kubelet")
    assert claim_uid not in plugin.preparer.prepared()
    assert not (dirs.cdi / f"k8s.gpu.hami.io-gpu_{claim_uid}.json").exists()
    assert not kubelet.errors, kubelet.errors
