"""GpuQuota enforcement by the controller, on the real control plane with kube-scheduler and
kube-controller-manager (tests/controller/harness.py ``plane_harness``; the CRD installed once)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.kube.api import GPU_QUOTAS, RESOURCE_CLAIMS, RESOURCE_QUOTAS, Kube
from dra_driver.quantity import MIB, parse_quantity
from dra_driver.quota import crd
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.apiserver_fixtures import install_crd
from tests.controller.harness import (
    DRIVER,
    NS,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)
from tests.kube_validate import assert_valid


def gpu_quota(
    name: str, namespace: str = NS, classes: list[str] | None = None, **hard: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if classes is not None:
        spec["deviceClassNames"] = classes
    return {
        "apiVersion": "gpu.hami.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def plane(controller_plane: ControlPlane) -> ControlPlane:
    """The controller tier with our GpuQuota CRD served."""
    api_client = controller_plane.api_client()
    try:
        install_crd(Kube(api_client), crd.manifest())
    finally:
        api_client.close()
    return controller_plane


@pytest.fixture
def harness(plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(plane) as h:
        h.publish("node-1", "t4", 4)  # 4 x 15360Mi
        h.create_class(device_class(DRIVER))
        h.create_class(device_class("gpu-binpack", {"policy": "binpack"}))
        yield h


def tenant(h: Harness, name: str, memory: str, klass: str = DRIVER, cores: int | None = None) -> None:
    h.create_claim(claim(name, request(klass=klass, memory=memory, cores=cores)))
    h.create_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def quota_status(h: Harness, name: str) -> dict[str, Any]:
    used: dict[str, Any] = (h.kube.get(GPU_QUOTAS, NS, name).get("status") or {}).get("used") or {}
    return used


def condition(h: Harness, pod_name: str) -> dict[str, Any] | None:
    for item in (h.get_pod(pod_name).get("status") or {}).get("conditions") or ():
        if item["type"] == "gpu.hami.io/Allocated":
            return dict(item)
    return None


def test_memory_quota_holds_a_pod_pending_until_usage_drops(harness: Harness) -> None:
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("team-a", memory="8Gi"))
    harness.start_controller()
    tenant(harness, "a", "6Gi")
    wait_for(lambda: harness.bound_node("a-pod"), what="a bound")
    tenant(harness, "b", "4Gi")
    expected = "GpuQuotaExceeded: default/team-a memory: used 6Gi + requested 4Gi > hard 8Gi"
    wait_for(lambda: expected in harness.events("b-pod"), what="quota event")
    # The event is recorded first, then the pod's condition: wait for that as well.
    found = wait_for(lambda: condition(harness, "b-pod"), what="the pending condition")
    assert found["reason"] == "GpuQuotaExceeded" and found["message"] == expected
    assert not harness.allocated("b") and harness.bound_node("b-pod") is None
    # A share without a cores request runs without an SM limit: it is charged a whole card's 100.
    wait_for(lambda: quota_status(harness, "team-a") == {"memory": "6Gi", "cores": 100, "devices": 1})
    # Another pod of the namespace goes: its claim is released and b fits.
    harness.delete_pod("a-pod")
    harness.kube.delete(RESOURCE_CLAIMS, NS, "a")
    wait_for(lambda: harness.bound_node("b-pod"), what="b placed after a left")
    wait_for(lambda: quota_status(harness, "team-a") == {"memory": "4Gi", "cores": 100, "devices": 1})
    assert_valid(harness.kube.get(GPU_QUOTAS, NS, "team-a"))


def test_raising_the_quota_releases_the_pending_pod(harness: Harness) -> None:
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("team-a", memory="2Gi"))
    harness.start_controller()
    tenant(harness, "big", "3Gi")
    wait_for(lambda: any("GpuQuotaExceeded" in m for m in harness.events("big-pod")), what="pending")
    current = harness.kube.get(GPU_QUOTAS, NS, "team-a")
    current["spec"]["hard"]["memory"] = "3Gi"
    harness.kube.update(GPU_QUOTAS, current)
    wait_for(lambda: harness.bound_node("big-pod"), what="placed once the quota was raised")
    wait_for(lambda: quota_status(harness, "team-a").get("memory") == "3Gi")


def test_two_quotas_the_tighter_wins(harness: Harness) -> None:
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("loose", memory="40Gi", cores=300))
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("tight", cores=50))
    harness.start_controller()
    tenant(harness, "a", "1Gi", cores=40)
    wait_for(lambda: harness.bound_node("a-pod"))
    tenant(harness, "b", "1Gi", cores=20)
    expected = "GpuQuotaExceeded: default/tight cores: used 40 + requested 20 > hard 50"
    wait_for(lambda: expected in harness.events("b-pod"), what="the tighter quota named")
    wait_for(lambda: quota_status(harness, "loose") == {"memory": "1Gi", "cores": 40, "devices": 1})


def test_a_share_without_cores_is_charged_a_whole_card_under_a_cores_quota(harness: Harness) -> None:
    # Issue 34: two coreless 1Gi shares were charged 0 cores and ran unthrottled (200 % of a GPU)
    # under cores: 50, while a 60-core share was refused.
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("team-a", cores=50))
    harness.start_controller()
    tenant(harness, "free", "1Gi")
    expected = "GpuQuotaExceeded: default/team-a cores: used 0 + requested 100 > hard 50"
    wait_for(lambda: expected in harness.events("free-pod"), what="the coreless share refused")
    assert not harness.allocated("free") and harness.bound_node("free-pod") is None
    tenant(harness, "limited", "1Gi", cores=40)  # an SM limit HAMi-core enforces: charged 40
    wait_for(lambda: harness.bound_node("limited-pod"), what="the limited share placed")
    wait_for(lambda: quota_status(harness, "team-a") == {"memory": "1Gi", "cores": 40, "devices": 1})
    assert harness.bound_node("free-pod") is None


def test_device_count_and_class_filter(harness: Harness) -> None:
    # Only gpu-binpack claims count; devices are distinct GPUs, so binpacked claims share one.
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("cards", classes=["gpu-binpack"], devices=1))
    harness.start_controller()
    for name in ("p1", "p2"):
        tenant(harness, name, "2Gi", klass="gpu-binpack")
        wait_for(lambda name=name: harness.bound_node(f"{name}-pod"), what=f"{name} bound")
    assert len(set(harness.devices_of("p1") + harness.devices_of("p2"))) == 1
    tenant(harness, "other", "14Gi")  # another class: not counted, lands on a second card
    wait_for(lambda: harness.bound_node("other-pod"))
    tenant(harness, "p3", "14Gi", klass="gpu-binpack")  # needs a second card: over devices=1
    expected = "GpuQuotaExceeded: default/cards devices: used 1 + requested 1 > hard 1"
    wait_for(lambda: expected in harness.events("p3-pod"), what="device quota")
    wait_for(lambda: quota_status(harness, "cards") == {"memory": "4Gi", "cores": 200, "devices": 1})


def test_hami_resource_quota_names_are_honoured(harness: Harness) -> None:
    harness.kube.create(
        RESOURCE_QUOTAS,
        NS,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu-quota", "namespace": NS},
            # Each coreless share is charged 100 cores (no SM limit): three of them fit in 300.
            "spec": {"hard": {"limits.nvidia.com/gpumem": "3000", "limits.nvidia.com/gpucores": "300"}},
        },
    )
    harness.start_controller()
    tenant(harness, "a", "2000Mi")
    wait_for(lambda: harness.bound_node("a-pod"))
    tenant(harness, "b", "1001Mi")
    expected = (
        "GpuQuotaExceeded: default/gpu-quota (ResourceQuota) memory: "
        "used 2000Mi + requested 1001Mi > hard 3000Mi"
    )
    wait_for(lambda: expected in harness.events("b-pod"), what="HAMi quota enforced")
    tenant(harness, "c", "1000Mi")  # exactly at the limit: allowed
    wait_for(lambda: harness.bound_node("c-pod"))


def test_controller_without_the_crd_runs_without_quotas(plane: ControlPlane) -> None:
    """A controller started where GpuQuotas are not served still places pods (and says why)."""
    with plane_harness(plane) as h:
        h.publish("node-1", "t4", 1)
        h.create_class(device_class(DRIVER))
        original = h.kube.list

        def list_without_quotas(resource: Any, **kwargs: Any) -> Any:
            if resource is GPU_QUOTAS:
                from dra_driver.kube.errors import KubeError

                raise KubeError(404, "the server could not find the requested resource")
            return original(resource, **kwargs)

        controller = h.start_controller()
        assert not controller.informers["GpuQuota"].absent
        controller.stop()
        kube = h.kube
        kube.list = list_without_quotas  # type: ignore[method-assign]
        from dra_driver.controller.controller import Controller

        blind = Controller(kube, DRIVER)
        blind.start()
        try:
            assert blind.informers["GpuQuota"].absent
            tenant(h, "a", "1Gi")
            wait_for(lambda: h.bound_node("a-pod"), what="placed without quotas")
        finally:
            blind.stop()


def test_restart_mid_burst_keeps_status_used_exact(harness: Harness) -> None:
    harness.kube.create(GPU_QUOTAS, NS, gpu_quota("team-a", memory="20Gi"))
    first = harness.start_controller()
    for i in range(8):
        tenant(harness, f"r{i}", "3Gi")
    wait_for(lambda: sum(harness.allocated(f"r{i}") for i in range(8)) >= 2, what="part of the burst placed")
    first.halt()  # the crash: writes in flight finish, nothing else
    first.stop()
    harness.controllers.remove(first)
    harness.start_controller()
    wait_for(lambda: sum(harness.allocated(f"r{i}") for i in range(8)) == 6, what="six of 3Gi fit in 20Gi")

    def recount() -> dict[str, Any]:
        """A full recount from the API: every allocated result in the namespace."""
        total, cores, cards = 0, 0, set()
        for item in harness.kube.list(RESOURCE_CLAIMS).get("items") or ():
            allocation = (item.get("status") or {}).get("allocation") or {}
            for result in allocation.get("devices", {}).get("results", []):
                total += int(parse_quantity(result["consumedCapacity"]["memory"]))
                asked = int(parse_quantity(result["consumedCapacity"].get("cores", "0")))
                cores += asked if 0 < asked < 100 else 100  # no SM limit: a whole card's compute
                cards.add((result["pool"], result["device"]))
        return {"memory": f"{total // (1024 * MIB)}Gi", "cores": cores, "devices": len(cards)}

    assert recount()["memory"] == "18Gi"
    wait_for(lambda: quota_status(harness, "team-a") == recount(), what="status.used = recount")


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=6, max_size=10), seed=st.integers(0, 2**16))
def test_concurrent_pods_never_overshoot(plane: ControlPlane, sizes: list[int], seed: int) -> None:
    """Pods of random sizes created concurrently, in random order: allocated memory <= hard."""
    hard_gib = 9
    with plane_harness(plane) as h:
        h.publish("node-1", "t4", 4)
        h.create_class(device_class(DRIVER))
        h.kube.create(GPU_QUOTAS, NS, gpu_quota("cap", memory=f"{hard_gib}Gi"))
        h.start_controller()
        order = list(enumerate(sizes))
        random.Random(seed).shuffle(order)
        threads = [threading.Thread(target=tenant, args=(h, f"c{i}", f"{size}Gi")) for i, size in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        def settled() -> bool:
            decided = 0
            for i in range(len(sizes)):
                if h.allocated(f"c{i}") or any("GpuQuotaExceeded" in m for m in h.events(f"c{i}-pod")):
                    decided += 1
            return decided == len(sizes)

        wait_for(settled, timeout=60, what="every pod placed or held by the quota")
        used = sum(size for i, size in enumerate(sizes) if h.allocated(f"c{i}"))
        assert used <= hard_gib
        # Nothing is held back that would fit: the smallest pending pod is over what is left.
        pending = [size for i, size in enumerate(sizes) if not h.allocated(f"c{i}")]
        assert not pending or min(pending) > hard_gib - used
