"""Races found in review: shared claims planned twice, writer failures, stale state after a failed write."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.controller import FINALIZER
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from dra_driver.sandbox import SandboxServer
from tests.controller.harness import (
    DRIVER,
    NS,
    Harness,
    claim,
    device_class,
    pod,
    request,
    running_harness,
    wait_for,
)


@pytest.fixture
def harness(sandbox: SandboxServer) -> Iterator[Harness]:
    with running_harness(sandbox) as h:
        h.publish("node-1", "t4", 4)
        h.create_class(device_class(DRIVER))
        h.create_class(device_class("gpu-mutex", {"policy": "mutex,binpack"}))
        yield h


def _listed_claim(h: Harness, name: str) -> dict[str, Any] | None:
    """Read a claim through the list path (GETs of the claim itself may carry injected faults)."""
    for item in h.kube.list(RESOURCE_CLAIMS).get("items") or ():
        if item["metadata"]["name"] == name:
            item.setdefault("apiVersion", "resource.k8s.io/v1")
            item.setdefault("kind", "ResourceClaim")
            return dict(item)
    return None


def test_claim_shared_by_two_gated_pods_is_planned_once(harness: Harness) -> None:
    """Pod B must not re-plan a claim whose allocation pod A is still writing.

    Otherwise B's plan replaces A's assumed use in the ledger, A's write wins, and the card A
    took looks free to the next pod: two exclusive claims on one card.
    """
    # A whole card: a claim with memory/cores limits may serve only one pod (GpuLimitsConflict).
    harness.create_claim(claim("shared", request(klass="gpu-mutex")))
    harness.create_pod(pod("a-pod", {"gpu": "claim:shared"}))
    harness.create_pod(pod("b-pod", {"gpu": "claim:shared"}))
    for i in range(3):
        harness.create_claim(claim(f"d{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"d{i}-pod", {"gpu": f"claim:d{i}"}))
    # Keep the shared claim's first write in flight until every pod is planned in one pass.
    release = threading.Event()
    harness.server.faults.inject(r"/resourceclaims/shared$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(write_workers=1)
    wait_for(lambda: len(controller._in_flight) == 4, what="a-pod and d0..d2 planned (b-pod waits)")
    release.set()
    names = ["a-pod", "b-pod", "d0-pod", "d1-pod", "d2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    placed = [device for name in ["shared", "d0", "d1", "d2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


def test_writer_failure_does_not_leave_the_claim_in_flight_forever(harness: Harness) -> None:
    """A conflict whose re-read fails must not wedge the claim: it is released when its pod goes."""
    status_conflict = harness.server.faults.inject(
        r"/resourceclaims/wedged/status$", status=409, count=None, methods={"PUT"}
    )
    reread = harness.server.faults.inject(r"/resourceclaims/wedged$", status=500, count=None, methods={"GET"})
    controller = harness.start_controller()
    harness.create_claim(claim("wedged", request(memory="1Gi")))
    harness.create_pod(pod("wedged-pod", {"gpu": "claim:wedged"}))
    wait_for(lambda: status_conflict.hits >= 1 and reread.hits >= 1, what="conflict and failed re-read")
    harness.kube.delete(PODS, NS, "wedged-pod")
    wait_for(lambda: "default/wedged-pod" not in controller.reconciler.pods, what="pod gone from the cache")
    controller.wait_idle()
    harness.server.faults.clear()

    def released() -> bool:
        listed = _listed_claim(harness, "wedged")
        return listed is not None and FINALIZER not in listed["metadata"].get("finalizers", [])

    wait_for(released, what="our finalizer removed once the pod is gone")
    harness.kube.delete(RESOURCE_CLAIMS, NS, "wedged")
    wait_for(lambda: _listed_claim(harness, "wedged") is None, what="claim deleted (our finalizer removed)")
    assert not controller.reconciler.assumed.in_flight


def test_failed_write_keeps_the_allocation_someone_else_made_in_the_ledger(harness: Harness) -> None:
    """Another allocator takes the claim while our write fails and cannot be re-read: count theirs."""
    release = threading.Event()
    slow = harness.server.faults.inject(
        r"/resourceclaims/taken$", status=500, hold=release, count=1, methods={"PUT"}
    )
    harness.server.faults.inject(r"/resourceclaims/taken$", status=500, count=1, methods={"GET"})
    # The gate stays (its removal keeps failing): no later write of the claim corrects the ledger.
    ungate = harness.server.faults.inject(r"/pods/taken-pod$", status=500, count=None, methods={"PUT"})
    controller = harness.start_controller()
    harness.create_claim(claim("taken", request(memory="1Gi")))
    harness.create_pod(pod("taken-pod", {"gpu": "claim:taken"}))
    wait_for(lambda: slow.hits >= 1, what="our finalizer write in flight")
    current = _listed_claim(harness, "taken")
    assert current is not None
    current["status"] = {
        "allocation": {
            "allocationTimestamp": "2026-01-01T00:00:00Z",
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-2"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                ]
            },
        }
    }
    harness.kube.update(RESOURCE_CLAIMS, current, status=True)  # e.g. kube-scheduler, first fit
    release.set()  # only now does our write fail
    wait_for(lambda: ungate.hits >= 1, what="gate removal tried with the other allocation")
    uid = current["metadata"]["uid"]

    def counted() -> bool:
        uses = controller.reconciler.ledger.claims().get(uid, ())
        return [use.device.device for use in uses] == ["gpu-2"] and uses[0].memory is None

    wait_for(counted, timeout=5, what="the exclusive result on gpu-2 counted in the ledger")
    assert controller.reconciler.ledger.state.nodes["node-1"].usage[2].tenants == 10


def test_deposed_leader_writes_no_allocation(harness: Harness) -> None:
    """Leadership lost while a commit is in flight: the old leader must not go on to write the
    allocation (the new leader, whose ledger lacks it, may already be placing other pods)."""
    leading = {"value": True}
    release = threading.Event()
    slow = harness.server.faults.inject(r"/resourceclaims/handover$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(is_leader=lambda: leading["value"])
    harness.create_claim(claim("handover", request(memory="1Gi")))
    harness.create_pod(pod("handover-pod", {"gpu": "claim:handover"}))
    wait_for(lambda: slow.hits >= 1, what="finalizer write in flight")
    leading["value"] = False  # the lease was lost while the finalizer update is on the wire
    release.set()
    controller.wait_idle()
    assert not harness.allocated("handover")
    leading["value"] = True
    controller.wake()
    wait_for(lambda: harness.bound_node("handover-pod"), what="allocated once leading again")
    assert len(harness.devices_of("handover")) == 1


@pytest.mark.parametrize(
    ("capacity", "fragment"),
    [({"memory": "1Gi", "bogus": "1"}, "bogus"), ({"memory": "1Gi", "slots": "3"}, "slots")],
)
def test_capacity_requests_we_cannot_honour_keep_the_pod_pending(
    harness: Harness, capacity: dict[str, str], fragment: str
) -> None:
    """kube-scheduler finds no device for a capacity our devices do not publish, and consumes the
    slots asked for: allocating with them ignored (consumedCapacity slots "1") would be wrong."""
    harness.start_controller()
    body = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": capacity}}}
    harness.create_claim(claim("odd", body))
    harness.create_pod(pod("odd-pod", {"gpu": "claim:odd"}))
    wait_for(lambda: harness.events("odd-pod"), what="pending event")
    assert fragment in harness.events("odd-pod")[0]
    assert not harness.allocated("odd")


def test_claim_referenced_twice_by_one_pod_is_planned_once(harness: Harness) -> None:
    """Two pod entries naming one ResourceClaim: one allocation, and the ledger keeps the one written."""
    harness.create_claim(claim("dup", request(klass="gpu-mutex", memory="1Gi")))
    harness.create_pod(pod("a-dup-pod", {"g1": "claim:dup", "g2": "claim:dup"}))
    for i in range(3):
        harness.create_claim(claim(f"e{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"e{i}-pod", {"gpu": f"claim:e{i}"}))
    release = threading.Event()
    harness.server.faults.inject(r"/resourceclaims/dup$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(write_workers=1)
    wait_for(lambda: len(controller._in_flight) == 4, what="every pod planned while dup's write is held")
    release.set()
    names = ["a-dup-pod", "e0-pod", "e1-pod", "e2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    assert len(harness.devices_of("dup")) == 1
    placed = [device for name in ["dup", "e0", "e1", "e2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


def test_a_conflicting_allocation_write_is_retried_once_with_the_fresh_claim(harness: Harness) -> None:
    """The retry after a 409 must use the object it re-read: retrying the stale one fails again."""
    release = threading.Event()
    held = harness.server.faults.inject(
        r"/resourceclaims/busy/status$", hold=release, count=1, methods={"PUT"}
    )
    controller = harness.start_controller()
    harness.create_claim(claim("busy", request(memory="1Gi")))
    harness.create_pod(pod("busy-pod", {"gpu": "claim:busy"}))
    wait_for(lambda: held.hits == 1, what="the allocation write in flight")
    current = _listed_claim(harness, "busy")
    assert current is not None
    current["metadata"].setdefault("labels", {})["touched"] = "yes"  # someone else writes the claim
    harness.kube.update(RESOURCE_CLAIMS, current)
    release.set()  # our write now carries a stale resourceVersion: a real 409
    wait_for(lambda: harness.allocated("busy"), what="allocated after the conflict")
    assert controller.reconciler.metrics.conflicts._value.get() == 1
    assert harness.get_claim("busy")["metadata"]["labels"] == {"touched": "yes"}


def test_a_conflicting_gate_removal_is_retried_once_with_the_fresh_pod(harness: Harness) -> None:
    release = threading.Event()
    held = harness.server.faults.inject(r"/pods/gated-pod$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller()
    harness.create_claim(claim("gated", request(memory="1Gi")))
    harness.create_pod(pod("gated-pod", {"gpu": "claim:gated"}))
    wait_for(lambda: held.hits == 1, what="the gate removal in flight")
    current = harness.get_pod("gated-pod")
    current["metadata"].setdefault("labels", {})["touched"] = "yes"
    harness.kube.update(PODS, current)
    release.set()
    wait_for(lambda: harness.bound_node("gated-pod"), what="ungated and bound after the conflict")
    assert controller.reconciler.metrics.conflicts._value.get() == 1
    assert harness.get_pod("gated-pod")["metadata"]["labels"] == {"touched": "yes"}
