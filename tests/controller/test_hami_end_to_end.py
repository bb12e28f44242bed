"""HAMi workloads unchanged on the real control plane: the webhook translates, our controller makes the pod's
templates, kcm's claim controller stamps claims owned by the pod, our controller places them by
HAMi's annotations, the real kubelet plugin
writes HAMi-core's limits into the CDI spec, and the pod is told its card HAMi's way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.controller.hami_annotation import ANNOTATION as ALLOCATED
from dra_driver.controller.hami_templates import TEMPLATES, HamiTemplates, KubeNamespaces
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Kube, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL, TRANSLATED_ANNOTATION
from dra_driver.webhook.optin import namespace_gate
from tests.controller.harness import DRIVER, NS, Harness, device_class, wait_for
from tests.controller.plane_driver import PlaneNode
from tests.controller.test_end_to_end import e2e as e2e
from tests.webhook.test_hami_resources import seed_pod

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)


@pytest.fixture
def hami(e2e: tuple[Harness, PlaneNode]) -> Iterator[tuple[Harness, PlaneNode]]:
    h, node = e2e
    h.kube.patch(NAMESPACES, None, NS, {"metadata": {"labels": {NAMESPACE_LABEL: "enabled"}}})
    h.create_class(device_class(DRIVER, {"policy": "spread", "nodePolicy": "binpack"}))
    kube = Kube(h.server.api_client())
    gate = namespace_gate("namespaces", {}, KubeNamespaces(kube))
    controller = h.start_controller(hami_templates=HamiTemplates(kube, DRIVER, DRIVER, gate))
    wait_for(lambda: "node-1" in controller.cache.ledger.inventory, timeout=30, what="slices published")
    try:
        yield h, node
    finally:  # the plane's next test finds the namespace as it was
        h.kube.patch(NAMESPACES, None, NS, {"metadata": {"labels": {NAMESPACE_LABEL: None}}})


def hami_pod(name: str, limits: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod = seed_pod(**annotations)
    pod["metadata"]["name"] = name
    pod["metadata"]["namespace"] = NS
    if not annotations:
        pod["metadata"]["annotations"] = {}
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


def claim_of(h: Harness, pod_name: str) -> dict[str, Any]:
    claim: dict[str, Any] = wait_for(lambda: _claim(h, pod_name), timeout=20, what=f"claim of {pod_name}")
    return claim


def _claim(h: Harness, pod_name: str) -> dict[str, Any] | None:
    statuses = (h.get_pod(pod_name).get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = h.kube.get(RESOURCE_CLAIMS, NS, statuses[0]["resourceClaimName"])
    return claim if (claim.get("status") or {}).get("allocation") else None


def device(claim: dict[str, Any]) -> str:
    return str(claim["status"]["allocation"]["devices"]["results"][0]["device"])


@pytest.mark.slow
def test_the_seed_pod_verbatim_runs_with_hamis_limits_and_annotation(
    hami: tuple[Harness, PlaneNode],
) -> None:
    h, node = hami
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}
    policy = {"hami.io/gpu-scheduler-policy": "mutex,binpack,numa"}
    created = h.create_pod(hami_pod("inference-latency-tier", limits, **policy))
    assert "nvidia.com/gpu" not in json.dumps(created["spec"]["containers"]), "HAMi's names are gone"
    template = json.loads(created["metadata"]["annotations"][TRANSLATED_ANNOTATION])["app"]["template"]
    assert template.startswith("hami-1gpu-8000mi-0cores-"), "a template of the pod's own"
    wait_for(lambda: h.bound_node("inference-latency-tier"), what="bound")
    claim = claim_of(h, "inference-latency-tier")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"], "owned by the pod"
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"]["memory"] == "8000Mi"
    assert device(claim) == "gpu-0", "idle node: mutex keeps all four, binpack ties, index wins"
    spec_path = node.cdi_dir / CdiNames(DRIVER).spec_file_name(claim["metadata"]["uid"])
    text = wait_for(
        lambda: spec_path.read_text() if spec_path.is_file() else None, timeout=20, what="CDI spec"
    )
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8000m" in text
    allocated = h.get_pod("inference-latency-tier")["metadata"]["annotations"][ALLOCATED]
    uuid, vendor, memory, cores = allocated.rstrip(":;").split(",")
    assert (vendor, memory, cores) == ("NVIDIA", "8000", "0") and uuid.startswith("GPU-")


@pytest.mark.slow
def test_the_seed_lab_written_with_hami_resources_gives_gpu_2(hami: tuple[Harness, PlaneNode]) -> None:
    h, _ = hami
    tenants = [
        ("tenant-a", "binpack", "gpu-0"),
        ("tenant-b", "binpack", "gpu-0"),
        ("tenant-c", "spread", "gpu-1"),
    ]
    for name, policy, expected in tenants:
        h.create_pod(hami_pod(name, {"nvidia.com/gpumem": 1000}, **{"hami.io/gpu-scheduler-policy": policy}))
        wait_for(lambda name=name: h.bound_node(name), what=f"{name} bound")
        assert device(claim_of(h, name)) == expected, name
    h.create_pod(
        hami_pod("latency", {"nvidia.com/gpumem": 1000}, **{"hami.io/gpu-scheduler-policy": "mutex,binpack"})
    )
    wait_for(lambda: h.bound_node("latency"), what="latency bound")
    assert device(claim_of(h, "latency")) == "gpu-2"
    # A whole card (nvidia.com/gpu alone = 100 cores) needs an idle one: gpu-3 is the last.
    h.create_pod(hami_pod("whole", {"nvidia.com/gpu": 1}))
    wait_for(lambda: h.bound_node("whole"), what="whole bound")
    assert device(claim_of(h, "whole")) == "gpu-3"
    assert (
        claim_of(h, "whole")["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["cores"]
        == "100"
    )
    h.create_pod(hami_pod("whole-2", {"nvidia.com/gpu": 1}))
    # The whole card does not fit any card already in use (HAMi checks memory first: the whole card).
    wait_for(lambda: any("4/4 CardInsufficientMemory" in e for e in h.events("whole-2")), what="4/4 in use")
    assert not h.bound_node("whole-2")


@pytest.mark.slow
def test_card_type_and_uuid_annotations_filter_as_in_hami(hami: tuple[Harness, PlaneNode]) -> None:
    h, _ = hami
    h.create_pod(hami_pod("no-t4", {"nvidia.com/gpumem": 1000}, **{"nvidia.com/nouse-gputype": "t4"}))
    wait_for(lambda: any("CardTypeMismatch" in e for e in h.events("no-t4")), what="CardTypeMismatch")
    h.create_pod(hami_pod("only-t4", {"nvidia.com/gpumem": 1000}, **{"nvidia.com/use-gputype": "t4"}))
    wait_for(lambda: h.bound_node("only-t4"), what="only-t4 bound")
    h.create_pod(hami_pod("bad-uuid", {"nvidia.com/gpumem": 1000}, **{"nvidia.com/use-gpuuuid": "GPU-none"}))
    wait_for(lambda: any("CardUuidMismatch" in e for e in h.events("bad-uuid")), what="CardUuidMismatch")


@pytest.mark.slow
def test_percentages_are_per_card(hami: tuple[Harness, PlaneNode]) -> None:
    h, _ = hami
    h.create_pod(hami_pod("quarter", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}))
    wait_for(lambda: h.bound_node("quarter"), what="bound")
    consumed = claim_of(h, "quarter")["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert consumed["memory"] == "3741Mi", "25% of a T4's published 14967 MiB, floored to whole MiB"


@pytest.mark.slow
def test_deleted_pods_take_their_claims_and_bad_requests_are_refused(
    hami: tuple[Harness, PlaneNode],
) -> None:
    h, _ = hami
    h.create_pod(hami_pod("short", {"nvidia.com/gpumem": 1000}))
    wait_for(lambda: h.bound_node("short"), what="bound")
    name = claim_of(h, "short")["metadata"]["name"]
    template = h.get_pod("short")["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert h.kube.get(TEMPLATES, NS, template)["metadata"]["ownerReferences"][0]["name"] == "short"
    h.kube.delete(PODS, NS, "short")

    def gone(resource: Resource, name: str) -> bool:
        try:
            h.kube.get(resource, NS, name)
        except KubeError as err:
            return err.not_found
        return False

    wait_for(lambda: gone(RESOURCE_CLAIMS, name), timeout=30, what="the pod's claim deleted with it")
    wait_for(lambda: gone(TEMPLATES, template), timeout=30, what="the pod's template deleted with it")
    with pytest.raises(KubeError) as err:
        h.create_pod(hami_pod("too-much", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150}))
    assert "nvidia.com/gpumem-percentage must be within 0..100, got 150" in err.value.message
