"""The binder (dra_driver/controller/binder.py): the writes that follow a decision, over ``FakeKube``.

Finalizer, then allocation, both guarded by the resourceVersion just read, then the gate lifted
with our annotations; conflicts retried on the re-read object, other failures reported with what
the API holds; a deposed replica writes no allocation; the pod's condition and events; fencing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from dra_driver.contract import ALLOCATED_CONDITION, DeviceId
from dra_driver.controller import FINALIZER, GATE_NAME
from dra_driver.controller.allocation import node_selector
from dra_driver.controller.allocator import Unschedulable
from dra_driver.controller.binder import FENCE_ANNOTATION, Binder
from dra_driver.controller.decision_record import decision_annotation, placement_summary
from dra_driver.controller.hami_annotation import ANNOTATION as HAMI_ALLOCATED
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Obj, Resource
from dra_driver.resource.objects import ClaimView, ObjectView, PodView
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.worlds import NODE, World, other_class, slices_for, tenant, two_claims_pod
from tests.kube_validate import assert_valid


def written_first(
    world: World, method: str, resource: Resource, name: str, edit: Callable[[Obj], object]
) -> None:
    """Someone else writes object ``name`` (``edit``) just before our next ``method`` write of
    ``resource``: ours then carries a stale resourceVersion, and the API answers 409."""
    update = world.kube.update
    raced: list[bool] = []

    def racing(target: Resource, obj: Obj, *, status: bool = False) -> Obj:
        if not raced and target == resource and method == ("update/status" if status else "update"):
            raced.append(True)
            current = world.kube.stored(resource, NS, name)
            edit(current)
            update(resource, current)
        return update(target, obj, status=status)

    world.kube.update = racing  # type: ignore[method-assign]


def touched(obj: Obj) -> None:
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"


# --- the writes of a placement ----------------------------------------------------------------------


def test_a_bind_writes_the_finalizer_then_the_allocation_then_lifts_the_gate() -> None:
    world = World()
    tenant(world, "a")
    result = world.place("a-pod")
    assert result.outcome == "bound"
    assert [c for c in world.kube.writes() if c[1] != "events"] == [
        ("update", "resourceclaims", "a"),
        ("update/status", "resourceclaims", "a"),
        ("patch", "pods", "a-pod"),
    ]
    written = world.claim("a")
    assert FINALIZER in written["metadata"]["finalizers"]
    allocation = written["status"]["allocation"]
    assert allocation["nodeSelector"] == node_selector(NODE)
    (share,) = allocation["devices"]["results"]
    assert (share["driver"], share["pool"], share["consumedCapacity"]["memory"]) == (DRIVER, NODE, "1Gi")
    gated = world.pod("a-pod")
    assert GATE_NAME not in [g["name"] for g in gated["spec"].get("schedulingGates") or ()]
    assert HAMI_ALLOCATED in gated["metadata"]["annotations"]
    assert world.metrics.allocations._value.get() == 1
    # The ledger counts what was written: the next claim sees the card's memory in use.
    (use,) = world.cache.ledger.claims()[written["metadata"]["uid"]]
    assert (use.device, use.memory) == (DeviceId(DRIVER, NODE, share["device"]), 1024**3)


def test_a_claim_finalized_at_admission_costs_two_writes_on_the_path() -> None:
    """The chart's admission puts our finalizer on a new claim of our classes: the bind then makes
    the allocation (with reservedFor) and the gate its only writes, and keeps the finalizer."""
    world = World()
    obj = claim("a", request())
    obj["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(obj)
    world.add_pod(pod("a-pod", {"gpu": "claim:a"}))
    assert world.place("a-pod").outcome == "bound"
    assert [c for c in world.kube.writes() if c[1] != "events"] == [
        ("update/status", "resourceclaims", "a"),
        ("patch", "pods", "a-pod"),
    ]
    written = world.claim("a")
    assert written["metadata"]["finalizers"] == [FINALIZER]
    assert [r["name"] for r in written["status"]["reservedFor"]] == ["a-pod"]


def test_the_writes_keep_other_finalizers_annotations_and_gates() -> None:
    world = World()
    obj = claim("a", request())
    obj["metadata"]["finalizers"] = ["someone.else/keep"]
    world.add_claim(obj)
    gated = pod("a-pod", {"gpu": "claim:a"}, annotations={"team": "x"})
    gated["spec"]["schedulingGates"].append({"name": "someone.else/gate"})
    world.add_pod(gated)
    assert world.place("a-pod").outcome == "bound"
    assert world.claim("a")["metadata"]["finalizers"] == ["someone.else/keep", FINALIZER]
    after = world.pod("a-pod")
    assert after["spec"]["schedulingGates"] == [{"name": "someone.else/gate"}]
    assert (
        after["metadata"]["annotations"]["team"] == "x" and HAMI_ALLOCATED in after["metadata"]["annotations"]
    )


def test_a_placement_with_nothing_to_write_only_lifts_the_gate() -> None:
    world = World()
    world.add_class(other_class())
    world.add_claim(claim("foreign", request(klass="other")))
    world.add_pod(pod("p", {"gpu": "claim:foreign"}))
    job = world.planned("p")
    assert job.writes == []
    world.controller.apply(world.binder.bind(job))
    assert not world.pod("p")["spec"].get("schedulingGates")
    assert "allocation" not in world.claim("foreign").get("status", {})


# --- conflicts and failures -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["update", "update/status"], ids=["finalizer", "allocation"])
def test_a_claim_write_that_meets_a_conflict_is_retried_once_on_the_re_read_claim(method: str) -> None:
    """Retrying the stale copy would fail again; the re-read one keeps what the other writer wrote."""
    world = World()
    tenant(world, "a")
    written_first(world, method, RESOURCE_CLAIMS, "a", touched)
    result = world.place("a-pod")
    assert result.outcome == "bound" and world.devices("a")
    assert world.metrics.conflicts._value.get() == 1
    assert ("get", "resourceclaims", "a") in world.kube.calls
    assert world.claim("a")["metadata"]["labels"] == {"touched": "yes"}


def someone_writes(world: World, name: str, edit: Callable[[Obj], object]) -> None:
    """Another component writes pod ``name`` (``edit``) after our decision: kube-controller-manager's
    status write of ``resourceClaimStatuses``, nearly always, or a user's label."""
    current = world.kube.stored(PODS, NS, name)
    edit(current)
    world.kube.put(PODS, current)


def test_the_gate_is_lifted_by_one_patch_without_a_read_after_another_component_wrote_the_pod() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    someone_writes(world, "a-pod", touched)
    someone_writes(world, "a-pod", lambda obj: obj.setdefault("status", {}).update(phase="Pending"))
    calls = len(world.kube.calls)
    assert world.binder.bind(job).outcome == "bound"
    pod_calls = [c for c in world.kube.calls[calls:] if c[1] == "pods"]
    assert pod_calls == [("patch", "pods", "a-pod")]
    after = world.pod("a-pod")
    assert not after["spec"].get("schedulingGates")
    assert after["metadata"]["labels"] == {"touched": "yes"} and after["status"]["phase"] == "Pending"
    assert HAMI_ALLOCATED in after["metadata"]["annotations"]
    assert world.metrics.conflicts._value.get() == 0


def test_annotations_written_to_a_pod_that_had_none_are_kept_beside_ours() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    assert not job.pod.annotations
    someone_writes(world, "a-pod", lambda obj: obj["metadata"].update(annotations={"team/owner": "x"}))
    assert world.binder.bind(job).outcome == "bound"
    annotations = world.pod("a-pod")["metadata"]["annotations"]
    assert annotations["team/owner"] == "x" and HAMI_ALLOCATED in annotations
    assert world.metrics.conflicts._value.get() == 1  # the test of "no annotations" failed once
    assert [c for c in world.kube.calls if c[1] == "pods" and c[0] != "list"] == [
        ("patch", "pods", "a-pod"),
        ("get", "pods", "a-pod"),
        ("patch", "pods", "a-pod"),
    ]


def test_a_gate_that_moved_is_lifted_at_its_new_place_after_one_read() -> None:
    world = World()
    tenant(world, "a")
    gated = world.pod("a-pod")
    gated["spec"]["schedulingGates"].insert(0, {"name": "someone.else/first"})
    world.kube.put(PODS, gated)
    world.sync()
    job = world.planned("a-pod")
    someone_writes(world, "a-pod", lambda obj: obj["spec"]["schedulingGates"].pop(0))
    someone_writes(world, "a-pod", lambda obj: obj["spec"]["schedulingGates"].append({"name": "x/last"}))
    assert world.binder.bind(job).outcome == "bound"
    assert world.pod("a-pod")["spec"]["schedulingGates"] == [{"name": "x/last"}]


def test_a_gate_lifted_already_is_bound_without_a_write() -> None:
    """Our own patch whose answer was lost (a timeout) landed: the re-read shows the gate gone."""
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    someone_writes(world, "a-pod", lambda obj: obj["spec"].update(schedulingGates=[]))
    world.kube.fail("patch", "pods", 0, "timed out")
    result = world.binder.bind(job)
    assert result.outcome == "bound" and result.pod is not None and not result.pod.gated
    assert [c for c in world.kube.calls if c[1] == "pods" and c[0] != "list"] == [
        ("patch", "pods", "a-pod"),
        ("get", "pods", "a-pod"),
    ]


def test_a_gate_patch_that_fails_twice_is_retried_on_a_later_pass() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    world.kube.fail("patch", "pods", 500, times=2)
    assert world.binder.bind(job).outcome == "retry"
    assert GATE_NAME in [g["name"] for g in world.pod("a-pod")["spec"]["schedulingGates"]]
    world.kube.fail("get", "pods", 500)
    world.kube.fail("patch", "pods", 500)
    assert world.binder.bind(job).outcome == "retry"
    assert GATE_NAME in [g["name"] for g in world.pod("a-pod")["spec"]["schedulingGates"]]


def test_a_claim_allocated_by_someone_else_meanwhile_is_not_written_over() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    foreign = world.claim("a")
    foreign["status"] = {"allocation": copy.deepcopy(job.writes[0].allocation)}
    foreign["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    world.kube.update(RESOURCE_CLAIMS, foreign, status=True)
    world.kube.fail("update", "resourceclaims", 409)  # our finalizer write sees the new version
    result = world.binder.bind(job)
    assert result.outcome == "retry" and not result.written
    world.controller.apply(result)
    assert world.devices("a") == ["gpu-1"]
    (use,) = world.cache.ledger.claims()[foreign["metadata"]["uid"]]
    assert use.device.device == "gpu-1"  # the ledger counts the other allocator's choice
    assert world.pod("a-pod")["spec"]["schedulingGates"]  # gate kept: planned again next pass


@pytest.mark.parametrize("deposed", ["before-the-writes", "after-the-finalizer"])
def test_a_deposed_replica_writes_no_allocation_and_allocates_once_leading_again(
    deposed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leadership lost while a bind is in flight: the new leader, whose ledger lacks the allocation,
    may already be placing other pods; so leadership is checked again after the finalizer write."""
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    if deposed == "before-the-writes":
        world.leading = False
    else:
        update = world.kube.update

        def losing(resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
            written = update(resource, obj, status=status)
            world.leading = False  # the lease was lost while the finalizer update was on the wire
            return written

        monkeypatch.setattr(world.kube, "update", losing)
    result = world.binder.bind(job)
    assert result.outcome == "retry"
    finalizer = [("update", "resourceclaims", "a")] if deposed == "after-the-finalizer" else []
    assert world.kube.writes("resourceclaims") == finalizer
    assert "allocation" not in world.claim("a").get("status", {})
    world.controller.apply(result)
    monkeypatch.undo()
    world.sync()
    world.leading = True
    assert world.place("a-pod").outcome == "bound" and len(world.devices("a")) == 1


def test_a_server_error_leaves_the_claim_as_the_api_has_it() -> None:
    world = World()
    tenant(world, "a")
    world.kube.fail("update/status", "resourceclaims", 500)
    result = world.place("a-pod")
    assert result.outcome == "retry"
    assert not world.devices("a")
    assert world.cache.ledger.claims() == {}
    assert not world.cache.assumed.in_flight


def test_a_non_conflict_write_error_reports_what_the_api_holds_or_our_copy() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    world.kube.fail("update", "resourceclaims", 500)
    result = world.binder.bind(job)
    ((_, current),) = result.failed
    assert current is not None
    assert current["metadata"]["resourceVersion"] == world.claim("a")["metadata"]["resourceVersion"]
    world.controller.apply(result)
    world.kube.fail("update", "resourceclaims", 500)
    world.kube.fail("get", "resourceclaims", 500)
    job2 = world.planned("a-pod")
    ((_, fallback),) = world.binder.bind(job2).failed
    assert fallback is not None and fallback["metadata"]["name"] == "a"  # the re-read failed: our copy


def test_the_second_claim_is_not_written_when_the_first_failed() -> None:
    world = World()
    two_claims_pod(world)
    job = world.planned("p")
    assert len(job.writes) == 2
    world.kube.fail("update/status", "resourceclaims", 500)
    result = world.binder.bind(job)
    assert result.outcome == "retry" and len(result.failed) == 1
    world.controller.apply(result)
    assert world.cache.ledger.claims() == {}  # neither assumption survives
    assert not world.cache.assumed.in_flight
    assert ("update", "resourceclaims", "c2") not in world.kube.calls


def test_a_claim_deleted_while_it_was_written_leaves_the_ledger() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    assert world.cache.ledger.claims()  # assumed while being written
    del world.kube.objects[("resourceclaims", NS, "a")]
    result = world.binder.bind(job)
    assert result.outcome == "retry" and result.failed == [(job.writes[0].claim, None)]
    world.controller.apply(result)
    assert world.cache.ledger.claims() == {}


def test_a_vanished_pod_ends_the_bind_quietly() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    del world.kube.objects[("pods", NS, "a-pod")]
    assert world.binder.bind(job).outcome == "gone"


# --- the pod's condition and events -----------------------------------------------------------------


def test_a_pod_reported_pending_is_marked_allocated_once_placed() -> None:
    world = World(gpus=1)
    tenant(world, "big", memory="20Gi")
    assert isinstance(world.decide("big-pod"), Unschedulable)
    world.sync()
    world.cache.refresh_inventory(slices_for([NODE], 1, "a100-80gb"))
    assert world.place("big-pod").outcome == "bound"
    found = world.condition("big-pod")
    assert found is not None
    assert (found["status"], found["reason"], found["message"]) == (
        "True",
        "Allocated",
        "all GPU claims are allocated",
    )


def test_a_pending_report_is_a_complete_warning_event_and_a_false_condition() -> None:
    world = World()
    created = world.add_pod(pod("x-pod", {}))
    written = world.binder.report_pending(created, "Unschedulable", "2/2 CardInsufficientMemory")
    assert written is not None and written.allocated_condition == "False"
    found = world.condition("x-pod")
    assert found is not None
    assert (found["status"], found["reason"], found["message"]) == (
        "False", "Unschedulable", "2/2 CardInsufficientMemory"
    )  # fmt: skip
    # An events.k8s.io/v1 Event (the recorder's part: tests/kube/test_events.py), read here through
    # core/v1 as kubectl describe does: who reported it and when, no deprecated count/source/
    # timestamps (a repeat counts on its series).
    (event,) = world.event_objects()
    assert_valid(event)
    assert event["metadata"]["name"].startswith("x-pod.") and event["metadata"]["namespace"] == NS
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "x-pod", "namespace": NS, "uid": created.uid,
    }  # fmt: skip
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "FailedAllocation", "Allocate")
    assert (event["reportingComponent"], event["reportingInstance"]) == (f"{DRIVER}/controller", "test")
    assert event["eventTime"] and "series" not in event
    assert not {"count", "source", "firstTimestamp", "lastTimestamp"} & event.keys()
    assert event["message"] == "2/2 CardInsufficientMemory"


def test_the_condition_is_one_status_patch_that_keeps_other_conditions_and_a_failure_is_none() -> None:
    world = World()
    created = world.add_pod(pod("p", {}))
    someone_writes(world, "p", lambda obj: obj.setdefault("status", {}).update(
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    ))  # fmt: skip
    calls = len(world.kube.calls)
    written = world.binder.set_condition(created, "False", "R", "m")
    assert written is not None and world.kube.calls[calls:] == [("patch/status", "pods", "p")]
    # In kube-apiserver's order: a condition new to the pod first, one it has in its place.
    assert [(c["type"], c["reason"]) for c in written["status"]["conditions"]] == [
        (ALLOCATED_CONDITION, "R"),
        ("PodScheduled", "SchedulingGated"),
    ]
    written = world.binder.set_condition(created, "True", "Allocated", "ok")
    assert written is not None and [c["type"] for c in written["status"]["conditions"]] == [
        ALLOCATED_CONDITION,
        "PodScheduled",
    ]
    world.kube.fail("patch/status", "pods", 500)
    assert world.binder.set_condition(world.pod("p"), "False", "R2", "m") is None


def test_the_condition_of_a_pod_recreated_under_its_name_is_not_written() -> None:
    world = World()
    created = world.add_pod(pod("p", {}))
    again = world.kube.stored(PODS, NS, "p")
    del world.kube.objects[("pods", NS, "p")]
    del again["metadata"]["uid"]
    world.kube.put(PODS, again)
    assert world.binder.set_condition(created, "False", "R", "m") is None
    assert world.condition("p") is None


# --- fencing ----------------------------------------------------------------------------------------


def test_an_unallocated_claim_with_our_finalizer_is_fenced_once_per_version() -> None:
    world = World(gpus=1)
    orphan = claim("orphan", request(memory="20Gi"))
    orphan["metadata"]["finalizers"] = [FINALIZER]
    before = world.add_claim(orphan).resource_version
    world.add_pod(pod("orphan-pod", {"gpu": "claim:orphan"}))
    world.fence(world.pod_view("orphan-pod"))
    fenced = world.claim("orphan")
    assert fenced["metadata"]["resourceVersion"] != before
    assert fenced["metadata"]["annotations"][FENCE_ANNOTATION].startswith("test ")
    world.sync()
    world.fence(world.pod_view("orphan-pod"))
    assert world.kube.writes("resourceclaims") == [("update", "resourceclaims", "orphan")]


def test_a_fence_that_meets_a_landed_allocation_counts_it() -> None:
    world = World(gpus=1)
    orphan = claim("late", request(memory="20Gi"))
    orphan["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(orphan)
    world.add_pod(pod("late-pod", {"gpu": "claim:late"}))
    landed = world.claim("late")
    landed["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}}}  # fmt: skip
    world.kube.update(RESOURCE_CLAIMS, landed, status=True)  # the predecessor's write lands first
    world.fence(world.pod_view("late-pod"))
    (use,) = world.cache.ledger.claims()[landed["metadata"]["uid"]]
    assert (use.device.device, use.memory) == ("gpu-0", None)  # the whole card, counted


# --- what a bind reports, and the binder's defaults ---------------------------------------------------


def test_a_bind_records_a_normal_allocated_event_that_summarizes_the_decision() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    record = world.pod("a-pod")["metadata"]["annotations"][decision_annotation(DRIVER)]
    (event,) = world.event_objects()
    assert (event["type"], event["reason"], event["action"]) == ("Normal", "Allocated", "Allocate")
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Pod", "a-pod")
    assert event["message"] == placement_summary(record)


def test_a_placed_pod_is_returned_with_its_allocated_condition_or_as_lifted_when_that_write_fails() -> None:
    for fails in (False, True):
        world = World(gpus=1)
        tenant(world, "big", memory="20Gi")
        assert isinstance(world.decide("big-pod"), Unschedulable)
        world.sync()
        world.cache.refresh_inventory(slices_for([NODE], 1, "a100-80gb"))
        placed = world.planned("big-pod")
        assert placed.pod.allocated_condition == "False"
        if fails:
            world.kube.fail("patch/status", "pods", 500)
        result = world.binder.bind(placed)
        assert result.outcome == "bound" and result.pod is not None
        assert result.pod.allocated_condition == ("False" if fails else "True")
        assert not result.pod.gated


def test_a_failed_pending_report_returns_none_and_a_written_condition_carries_its_time() -> None:
    world = World()
    created = world.add_pod(pod("x-pod", {}))
    world.kube.fail("patch/status", "pods", 500)
    assert world.binder.report_pending(created, "Unschedulable", "m") is None
    assert world.condition("x-pod") is None
    assert world.binder.report_pending(world.pod_view("x-pod"), "Unschedulable", "m") is not None
    found = world.condition("x-pod")
    assert found is not None and found["lastTransitionTime"].endswith("Z")


def test_a_binder_built_with_defaults_reports_as_the_controller_and_writes_allocations() -> None:
    world = World()
    tenant(world, "a")
    binder = Binder(world.kube, DRIVER, ControllerMetrics())
    assert binder.bind(world.planned("a-pod")).outcome == "bound"
    assert world.devices("a")
    (event,) = world.event_objects()
    assert event["reportingInstance"] == "hami-dra-controller"


def test_an_event_names_the_kind_its_object_carries_else_the_kind_of_its_view() -> None:
    """A view of no known kind without a kind of its own names nothing: no event (not a guessed Pod)."""
    world = World()
    bare = {"metadata": {"name": "o", "namespace": NS, "uid": "u1"}}
    widget = {"apiVersion": "example.io/v2", "kind": "Widget", "metadata": {"name": "w", "namespace": NS}}
    world.binder.event(ClaimView(bare, DRIVER), "Normal", "R", "claim")
    world.binder.event(PodView(bare), "Normal", "R", "pod")
    world.binder.event(ObjectView(bare), "Normal", "R", "object")
    world.binder.event(ObjectView(widget), "Normal", "R", "widget")
    about = {e["message"]: e["involvedObject"] for e in world.event_objects()}
    assert {m: (o["apiVersion"], o["kind"]) for m, o in about.items()} == {
        "claim": ("resource.k8s.io/v1", "ResourceClaim"),
        "pod": ("v1", "Pod"),
        "widget": ("example.io/v2", "Widget"),
    }
    assert about["claim"]["uid"] == "u1"


def test_fencing_skips_allocated_and_foreign_claims_and_goes_on_past_each_claim() -> None:
    world = World(gpus=1)
    for name, finalizers in (("a-foreign", []), ("b-ours", [FINALIZER]), ("c-ours", [FINALIZER])):
        obj = claim(name, request())
        obj["metadata"]["finalizers"] = finalizers
        world.add_claim(obj)
    allocated = claim("a-allocated", request())
    allocated["metadata"]["finalizers"] = [FINALIZER]
    allocated["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}}}  # fmt: skip
    world.add_claim(allocated)
    keys = ("a-allocated", "a-foreign", "b-ours", "c-ours")

    def fence() -> list[str]:
        seen = world.binder.fence([world.cache.claims[f"{NS}/{k}"] for k in keys])
        world.sync()
        return [view.name for view in seen]

    world.kube.fail("update", "resourceclaims", 500)  # b's fence fails: c is fenced all the same
    assert fence() == ["b-ours", "c-ours"]
    assert [c[2] for c in world.kube.writes("resourceclaims")] == ["b-ours", "c-ours"]
    assert fence() == ["b-ours"]  # c is fenced at its current version: only b is written again
    assert fence() == []
    assert [c[2] for c in world.kube.writes("resourceclaims")] == ["b-ours", "c-ours", "b-ours"]


def recreated_first(world: World, method: str, resource: Resource, name: str) -> None:
    """Just before our next ``method`` write of ``resource``, object ``name`` is deleted and one of
    the same name created (a new UID; a tenant swapping a claim or a pod while we write): ours
    then meets a 409 and the re-read by name finds the new object."""
    update = world.kube.update
    raced: list[bool] = []

    def racing(target: Resource, obj: Obj, *, status: bool = False) -> Obj:
        if not raced and target == resource and method == ("update/status" if status else "update"):
            raced.append(True)
            again = world.kube.stored(resource, NS, name)
            del world.kube.objects[(resource.plural, NS, name)]
            del again["metadata"]["uid"]
            world.kube.put(resource, again)
        return update(target, obj, status=status)

    world.kube.update = racing  # type: ignore[method-assign]


@pytest.mark.parametrize("method", ["update", "update/status"], ids=["finalizer", "allocation"])
def test_a_claim_recreated_under_its_name_during_a_conflict_is_not_written(method: str) -> None:
    """After a 409 the re-read by name may find another claim (deleted and created again, e.g. with
    a bigger request or one that tolerates everything): the plan was made for the old one, so
    nothing is written to the new one and the old one leaves the ledger."""
    world = World()
    tenant(world, "a")
    planned_uid = world.claim("a")["metadata"]["uid"]
    job = world.planned("a-pod")
    recreated_first(world, method, RESOURCE_CLAIMS, "a")
    result = world.binder.bind(job)
    assert result.outcome == "retry" and result.failed == [(job.writes[0].claim, None)]
    assert "allocation" not in world.claim("a").get("status", {})
    assert world.claim("a")["metadata"]["uid"] != planned_uid
    world.controller.apply(result)
    assert planned_uid not in world.cache.ledger.claims()
    assert world.pod("a-pod")["spec"]["schedulingGates"]  # planned again, for the new claim


def test_a_pod_recreated_under_its_name_keeps_its_gate() -> None:
    world = World()
    tenant(world, "a")
    job = world.planned("a-pod")
    again = world.kube.stored(PODS, NS, "a-pod")
    del world.kube.objects[("pods", NS, "a-pod")]
    del again["metadata"]["uid"]
    world.kube.put(PODS, again)
    assert world.binder.bind(job).outcome == "gone"
    assert GATE_NAME in [g["name"] for g in world.pod("a-pod")["spec"]["schedulingGates"]]
    assert ("get", "pods", "a-pod") in world.kube.calls  # the test of the uid failed: read once


def test_a_pod_kept_slim_round_trips_through_a_decision_and_its_patches() -> None:
    """The cache holds our pods as slim.py keeps them; the binder's patches name what they change,
    so everything the slim copy leaves out is still on the pod after the bind and the reports."""
    world = World(gpus=1)
    world.add_claim(claim("a", request(memory="1Gi")))
    whole = pod(
        "a-pod", {"gpu": "claim:a"}, annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    )
    whole["metadata"]["labels"] = {"app": "a"}
    whole["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y"}]
    whole["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    whole["spec"]["schedulingGates"].append({"name": "someone.else/gate"})
    whole["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    cached = world.add_pod(whole)
    assert "env" not in cached.raw["spec"]["containers"][0] and "volumes" not in cached.raw["spec"]
    assert cached.annotations == {} and "labels" not in cached.raw["metadata"]
    before = world.pod("a-pod")
    world.binder.report_pending(cached, "Unschedulable", "waiting")
    world.sync()
    assert world.pod_view("a-pod").allocated_condition == "False"
    result = world.place("a-pod")
    assert result.outcome == "bound" and result.pod is not None
    assert "env" not in result.pod.raw["spec"]["containers"][0]  # folded into the cache slim
    after = world.pod("a-pod")
    assert after["spec"]["schedulingGates"] == [{"name": "someone.else/gate"}]
    assert set(after["metadata"]["annotations"]) == {
        "kubectl.kubernetes.io/last-applied-configuration",
        HAMI_ALLOCATED,
        decision_annotation(DRIVER),
    }
    # kube-apiserver's order: our condition was new to the pod, so it comes first.
    assert [(c["type"], c["status"]) for c in after["status"]["conditions"]] == [
        (ALLOCATED_CONDITION, "True"),
        ("PodScheduled", "False"),
    ]
    for part in ("spec", "metadata", "status"):
        unchanged = {
            k: v
            for k, v in before[part].items()
            if k not in ("schedulingGates", "annotations", "resourceVersion", "conditions")
        }
        assert {k: after[part][k] for k in unchanged} == unchanged, part
