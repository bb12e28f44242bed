"""The worker (dra_driver/controller/controller.py): what it does between the modules.

``decide`` assumes a placement in the cache (the next pod is planned with it) or fences the pod's
claims and reports why it waits, once; folding a bind's result leaves the cache as the API holds
it; events of deleted objects make the reports and the fences forget them. Over ``FakeKube``.

The ``slow`` tier runs the worker with its informers and writer threads against the sandbox API
server, with writes held in flight, to check what only real concurrency shows.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.controller import FINALIZER
from dra_driver.controller.allocator import Placed, Unschedulable
from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from dra_driver.resource.uses import claim_uses
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
from tests.controller.worlds import World, edited, other_class, tenant

# --- decide: allocate, then assume or report --------------------------------------------------------


def test_the_next_pod_is_planned_with_the_allocation_still_in_flight() -> None:
    world = World(gpus=1)
    world.add_class(device_class("gpu-mutex", {"policy": "mutex"}))
    tenant(world, "first", klass="gpu-mutex")
    tenant(world, "second", klass="gpu-mutex")
    job = world.planned("first-pod")
    assert world.cache.assumed.writing(f"{NS}/first")
    outcome = world.decide("second-pod")
    assert isinstance(outcome, Unschedulable)  # the assumed use of the one card blocks a second mutex claim
    assert "ExclusiveDeviceAllocateConflict" in world.events()[-1]
    world.controller.apply(world.binder.bind(job))
    assert not world.cache.assumed.in_flight


def test_a_pending_pod_has_its_claims_fenced_then_is_reported_once() -> None:
    world = World()
    waiting = claim("x", request(memory="100Gi"))
    waiting["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(waiting)
    world.add_pod(pod("x-pod", {"gpu": "claim:x"}))
    outcome = world.decide("x-pod")
    assert isinstance(outcome, Unschedulable)
    assert world.claim("x")["metadata"]["annotations"][FENCE_ANNOTATION].startswith("test ")
    found = world.condition("x-pod")
    assert found is not None and found["status"] == "False"
    assert (found["reason"], found["message"]) == (outcome.reason, outcome.message)
    assert world.events() == [outcome.message] and "2/2 CardInsufficientMemory" in outcome.message
    # The failure metric is labelled by HAMi's first reason.
    assert world.metrics.failures.labels("CardInsufficientMemory")._value.get() == 1
    # Asked again with nothing changed: no second fence, event or condition write.
    writes = len(world.kube.writes())
    world.sync()
    assert isinstance(world.decide("x-pod"), Unschedulable)
    assert len(world.kube.writes()) == writes


def test_a_pod_with_nothing_left_to_allocate_clears_its_pending_report() -> None:
    world = World()
    world.add_class(other_class())
    world.add_claim(claim("foreign", request(klass="other")))
    waiting = world.add_pod(pod("p", {"gpu": "claim:foreign"}))
    world.reports.record(waiting, "Unschedulable", "earlier reason")
    reported = world.binder.report_pending(waiting, "Unschedulable", "earlier reason")
    assert reported is not None
    job = world.controller.decide(reported)
    assert isinstance(job, Placed) and job.pod.allocated_condition == "False"
    world.controller.apply(world.binder.bind(job))
    found = world.condition("p")
    assert found is not None and found["status"] == "True"
    assert waiting.uid not in world.reports


def test_the_assumed_uses_are_what_the_written_allocation_gives() -> None:
    """No serialise-and-reparse: the plan's uses equal the uses read back from the written claim,
    so the informer event of our own write changes nothing in the ledger."""
    world = World()
    world.add_claim(claim("c", request(name="a", memory="1500Mi", cores=25), request(name="b", memory="1Gi")))
    world.add_pod(pod("p", {"gpu": "claim:c"}))
    job = world.planned("p")
    uid = world.claim("c")["metadata"]["uid"]
    assumed = world.cache.ledger.claims()[uid]
    generation = world.cache.ledger.generation
    world.controller.apply(world.binder.bind(job))
    assert claim_uses(world.claim("c"), DRIVER) == assumed
    world.sync()
    assert world.cache.ledger.generation == generation  # nothing to change


def test_no_step_edits_a_cached_object_in_place() -> None:
    world = World(gpus=1)
    tenant(world, "a")
    orphan = claim("orphan", request(memory="20Gi"))
    orphan["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(orphan)
    world.add_pod(pod("orphan-pod", {"gpu": "claim:orphan"}))
    originals = [*world.cache.claims.values(), *world.cache.pods.values()]
    snapshot = copy.deepcopy(originals)
    job = world.planned("a-pod")
    world.binder.bind(job)
    world.decide("orphan-pod")  # fenced, pending
    assert originals == snapshot  # replaced in the caches where they changed, never edited
    allocated = world.claim("a")
    cached = copy.deepcopy(allocated)
    world.releaser.deallocate(allocated)
    assert allocated == cached


# --- events in --------------------------------------------------------------------------------------


def test_a_deleted_pod_or_claim_is_forgotten_by_the_reports_and_the_fences() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    ours = world.pod_view("a-pod")
    newer = edited(ours, lambda p: p["metadata"].update(resourceVersion=str(int(ours.resource_version) + 1)))
    world.reports.record(ours, "Unschedulable", "stale")
    world.controller.apply_wake(world.cache.apply_event("Pod", dict(ours), dict(newer)))
    assert ours.uid in world.reports  # an update is not a deletion
    assert world.reports.new_warnings(ours.uid, ["a warning"]) == ["a warning"]
    world.controller.apply_wake(world.cache.apply_event("Pod", dict(newer), None))
    assert ours.uid not in world.reports
    assert world.reports.new_warnings(ours.uid, ["a warning"]) == ["a warning"]  # forgotten with the pod
    cached = world.cache.claims[f"{NS}/a"]
    world.binder.fenced[cached.key] = cached.resource_version
    world.controller.apply_wake(world.cache.apply_event("ResourceClaim", dict(cached), None))
    assert cached.key not in world.binder.fenced


# --- the worker with its threads, on the sandbox API server (slow) ----------------------------------


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


@pytest.mark.slow
def test_a_claim_shared_by_two_gated_pods_is_planned_once_while_it_is_written(harness: Harness) -> None:
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
    wait_for(lambda: len(controller.binding.keys()) == 4, what="a-pod and d0..d2 planned (b-pod waits)")
    release.set()
    names = ["a-pod", "b-pod", "d0-pod", "d1-pod", "d2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    placed = [device for name in ["shared", "d0", "d1", "d2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


@pytest.mark.slow
def test_a_claim_referenced_twice_by_one_pod_is_counted_once_while_it_is_written(harness: Harness) -> None:
    """Two pod entries naming one ResourceClaim: one allocation, and the ledger keeps the one written."""
    harness.create_claim(claim("dup", request(klass="gpu-mutex", memory="1Gi")))
    harness.create_pod(pod("a-dup-pod", {"g1": "claim:dup", "g2": "claim:dup"}))
    for i in range(3):
        harness.create_claim(claim(f"e{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"e{i}-pod", {"gpu": f"claim:e{i}"}))
    release = threading.Event()
    harness.server.faults.inject(r"/resourceclaims/dup$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(write_workers=1)
    wait_for(lambda: len(controller.binding.keys()) == 4, what="every pod planned while dup's write is held")
    release.set()
    names = ["a-dup-pod", "e0-pod", "e1-pod", "e2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    assert len(harness.devices_of("dup")) == 1
    placed = [device for name in ["dup", "e0", "e1", "e2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


@pytest.mark.slow
def test_a_writer_failure_does_not_leave_the_claim_in_flight_forever(harness: Harness) -> None:
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
    wait_for(lambda: "default/wedged-pod" not in controller.cache.pods, what="pod gone from the cache")
    controller.wait_idle()
    harness.server.faults.clear()

    def released() -> bool:
        listed = _listed_claim(harness, "wedged")
        return listed is not None and FINALIZER not in listed["metadata"].get("finalizers", [])

    wait_for(released, what="our finalizer removed once the pod is gone")
    harness.kube.delete(RESOURCE_CLAIMS, NS, "wedged")
    wait_for(lambda: _listed_claim(harness, "wedged") is None, what="claim deleted (our finalizer removed)")
    assert not controller.cache.assumed.in_flight


@pytest.mark.slow
def test_a_failed_write_keeps_the_allocation_someone_else_made_in_the_ledger(harness: Harness) -> None:
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
        uses = controller.cache.ledger.claims().get(uid, ())
        return [use.device.device for use in uses] == ["gpu-2"] and uses[0].memory is None

    wait_for(counted, timeout=5, what="the exclusive result on gpu-2 counted in the ledger")
    assert controller.cache.ledger.state.nodes["node-1"].usage[2].tenants == 10
