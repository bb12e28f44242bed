"""A predecessor's allocation write that lands after a restart must not overcommit a GPU.

Reproduction (the data-safety issue): the controller's UpdateStatus for pod A (mutex) hangs; it
places pod B (binpack) on the same card meanwhile; it is killed; its successor sees A's claim with
our finalizer and no allocation, leaves A pending and places pod D on that card; then A's old
write lands. Without a fence it succeeds (the claim's resourceVersion never changed): the card
holds more memory than it has and a mutex claim shares it. The successor fences such claims
(a write that bumps the resourceVersion) before leaving them unallocated, so the old write fails.

On the real control plane (kube-scheduler, kube-controller-manager: tests/controller/harness.py
``plane_harness``); A's write is held on the killed controller's client (``ClientFaults``) and
then sent as it was, so the real kube-apiserver decides whether it lands.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.controller.controller import Controller
from dra_driver.kube.api import RESOURCE_CLAIMS
from dra_driver.quantity import parse_bytes
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import (
    DRIVER,
    GATE,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)

#: A simulated T4's published memory: nvidia-smi's 15360 MiB total minus 393 MiB reserved.
T4_MEMORY = (15360 - 393) * 2**20


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane) as h:
        h.publish("node-1", "t4", 4)
        h.create_class(device_class("gpu-mutex", {"policy": "mutex"}))
        h.create_class(device_class("gpu-binpack", {"policy": "binpack"}))
        yield h


def kill(controller: Controller) -> None:
    """Stop reconciling at once, as SIGKILL would: an in-flight write is not waited for.

    The request already sent stays with the API server; a killed process sends nothing after it,
    so its writer thread (still alive here) must not retry: it is told it no longer leads.
    """
    controller.binder.still_leading = lambda: False
    controller.halt()


def memory_by_device(harness: Harness) -> dict[str, dict[str, int]]:
    """Consumed memory per device, by claim name."""
    used: dict[str, dict[str, int]] = {}
    for item in harness.kube.list(RESOURCE_CLAIMS).get("items") or ():
        allocation = (item.get("status") or {}).get("allocation") or {}
        for result in allocation.get("devices", {}).get("results", []):
            memory = parse_bytes(result["consumedCapacity"]["memory"])
            used.setdefault(f"{result['pool']}/{result['device']}", {})[item["metadata"]["name"]] = memory
    return used


def place(harness: Harness, name: str, klass: str, memory: str) -> None:
    harness.create_claim(claim(name, request(klass=klass, memory=memory)))
    harness.create_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def test_late_write_of_a_killed_controller_cannot_land(harness: Harness) -> None:
    first = harness.start_controller(write_workers=2)
    for i in range(3):  # three cards taken whole by mutex tenants
        place(harness, f"filler{i}", "gpu-mutex", "14000Mi")
    wait_for(lambda: all(harness.allocated(f"filler{i}") for i in range(3)), what="fillers placed")
    release = threading.Event()
    hung = harness.faults.inject(r"/resourceclaims/a/status$", hold=release, count=1, methods={"PUT"})
    place(harness, "a", "gpu-mutex", "4000Mi")
    wait_for(lambda: hung.hits == 1, what="A's allocation write in flight")
    place(harness, "b", "gpu-binpack", "8000Mi")
    wait_for(lambda: harness.allocated("b"), what="B placed while A's write hangs")
    assert harness.devices_of("b") == ["node-1/gpu-3"]
    kill(first)

    second = harness.start_controller()
    wait_for(lambda: any("ExclusiveDeviceAllocateConflict" in m for m in harness.events("a-pod")),
             what="A pending under the successor")  # fmt: skip
    wait_for(lambda: FENCE_ANNOTATION in harness.get_claim("a")["metadata"].get("annotations", {}),
             what="A's claim fenced")  # fmt: skip
    place(harness, "d", "gpu-binpack", "4000Mi")
    wait_for(lambda: harness.allocated("d"), what="D placed")
    assert harness.devices_of("d") == ["node-1/gpu-3"]

    release.set()  # the killed controller's write lands now, with the resourceVersion it carried
    assert hung.released.wait(30), "the held write was never answered"
    second.wait_idle()
    assert not harness.allocated("a"), "the predecessor's late write landed"
    used = memory_by_device(harness)
    assert all(sum(claims.values()) <= T4_MEMORY for claims in used.values()), used


def test_an_observed_overcommit_is_reported_and_the_newest_unstarted_claim_deallocated(
    harness: Harness,
) -> None:
    controller = harness.start_controller()
    place(harness, "running", "gpu-binpack", "12000Mi")
    wait_for(lambda: harness.bound_node("running-pod"), what="the first pod bound")
    wait_for(lambda: harness.get_claim("running")["status"].get("reservedFor"), what="reserved")
    (device,) = harness.devices_of("running")
    pool, name = device.split("/")
    # A claim allocated behind our back onto the same card (a late write, a hand-written status),
    # whose pod has not started: it is held by another gate, so nobody binds it.
    late = harness.create_claim(claim("late", request(klass="gpu-binpack", memory="8000Mi")))
    waiting_pod = pod("late-pod", {"gpu": "claim:late"}, gated=False)
    waiting_pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    harness.create_pod(waiting_pod)
    late["metadata"]["finalizers"] = [GATE]
    late = harness.kube.update(RESOURCE_CLAIMS, late)
    late["status"] = {
        "allocation": {
            "allocationTimestamp": "2026-01-01T00:00:00Z",
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": pool, "device": name,
                     "shareID": "7d4c1e3a-5b6f-4a8e-9c2d-1f0e3b5a7c9d",
                     "consumedCapacity": {"memory": "8000Mi", "cores": "0", "slots": "1"}}
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
        }
    }  # fmt: skip
    harness.kube.update(RESOURCE_CLAIMS, late, status=True)
    wait_for(lambda: not harness.allocated("late"), what="the newest unstarted claim deallocated")
    assert harness.devices_of("running") == [device], "the started claim is left alone"
    # Always recorded on the claim; on its pod once the controller has seen that pod (no order
    # between the claim and pod watches), so the claim's event is the one to wait for.
    wait_for(lambda: any("was overcommitted" in m for m in harness.events("late")), what="event")
    metric = controller.metrics.overcommits.labels("deallocated")._value.get()
    assert metric == 1
