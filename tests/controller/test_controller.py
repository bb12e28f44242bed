"""The worker (dra_driver/controller/controller.py): what it does between the modules.

``decide`` assumes a placement in the cache (the next pod is planned with it) or hands the failure
to the failure handler, which fences the pod's claims and reports why it waits, once, after the
pass (``World.decide`` does both; the handler alone is in test_failure.py); folding a bind's
result leaves the cache as the API holds it; events of deleted objects make the reports and the
fences forget them. Over ``FakeKube``.

The worker with its informers and writer threads, against the real control plane with writes held
in flight (what only real concurrency shows), is in test_plane_failures.py.
"""

from __future__ import annotations

import copy

from dra_driver.controller import FINALIZER
from dra_driver.controller.allocator import Placed, Unschedulable
from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.controller.cache import Wake
from dra_driver.controller.pod_queue import Step
from dra_driver.controller.reasons import Reason
from dra_driver.resource.uses import claim_uses
from tests.controller.harness import (
    DRIVER,
    NS,
    claim,
    device_class,
    pod,
    request,
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
    world.reports.record(waiting, Reason.UNSCHEDULABLE, "earlier reason")
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
    world.reports.record(ours, Reason.UNSCHEDULABLE, "stale")
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


# --- schedule_one and the pass ----------------------------------------------------------------------


def test_a_pod_waiting_for_its_template_claim_waits_quietly_without_hami_translation() -> None:
    world = World()
    world.add_pod(pod("t-pod", {"gpu": "template:t"}))
    assert world.controller.hami_templates is None
    assert world.controller.schedule_one(world.pod_view("t-pod")) is Step.WAITING
    world.controller.failures.handle()
    assert world.condition("t-pod") is None and world.kube.writes() == []


def test_a_bind_without_writer_threads_is_folded_back_within_the_pass() -> None:
    world = World()
    tenant(world, "a")
    assert world.controller.schedule_one(world.pod_view("a-pod")) is Step.BINDING
    assert not world.cache.assumed.in_flight and not world.controller.binding
    assert world.controller.queue.in_flight == set()


def test_a_wake_adds_claims_to_the_releasers_queue() -> None:
    world = World()
    world.releaser.queue = {f"{NS}/queued"}
    world.controller.apply_wake(Wake(claims={f"{NS}/woken"}))
    assert world.releaser.queue == {f"{NS}/queued", f"{NS}/woken"}
