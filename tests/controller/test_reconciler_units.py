"""The reconciler driven directly over ``FakeKube``: plan -> commit -> apply, releases, repairs.

Each test sets up caches the way ``Controller._drain`` feeds them and checks the writes the
reconciler makes (order, resourceVersion guards, retries) and what it reports.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.config import ControllerDefaults
from dra_driver.contract import DeviceId
from dra_driver.controller import FINALIZER, GATE_NAME
from dra_driver.controller.allocation import node_selector
from dra_driver.controller.hami_annotation import ANNOTATION as HAMI_ALLOCATED
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.objects import ClaimView, PodView
from dra_driver.controller.pods import NodeView
from dra_driver.controller.reconciler import (
    CONDITION_TYPE,
    FENCE_ANNOTATION,
    CommitJob,
    CommitResult,
    Reconciler,
)
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import DEVICE_CLASSES, GPU_QUOTAS, NODES, PODS, RESOURCE_CLAIMS, Obj
from dra_driver.kube.errors import KubeError
from dra_driver.kubeletplugin.slices import build_resource_slices
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request

NODE = "node-1"


def edited(pod_view: PodView, edit: Callable[[Obj], object]) -> PodView:
    """A changed copy of a pod, parsed again (a view is never edited in place)."""
    raw = copy.deepcopy(dict(pod_view))
    edit(raw)
    return PodView.parse(raw)


class World:
    """FakeKube plus a reconciler whose caches follow every object put or written."""

    def __init__(self, gpus: int = 2, *, leading: bool = True) -> None:
        self.kube = FakeKube()
        self.metrics = ControllerMetrics()
        self.leading = leading
        self.reconciler = Reconciler(
            self.kube, DRIVER, ControllerDefaults(), self.metrics, identity="test",
            still_leading=lambda: self.leading,
        )  # fmt: skip
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"allocatable": {}}}
        self.reconciler.nodes[NODE] = NodeView.parse(self.kube.put(NODES, node))
        slices = build_resource_slices(
            profile_gpus("t4", node_name=NODE, gpus=gpus), node_name=NODE, driver_name=DRIVER
        )
        self.reconciler.refresh_inventory(slices)
        self.add_class(device_class(DRIVER))

    def add_class(self, obj: Obj) -> None:
        self.reconciler.class_event(obj["metadata"]["name"], self.kube.put(DEVICE_CLASSES, obj))

    def add_claim(self, obj: Obj) -> ClaimView:
        stored = self.kube.put(RESOURCE_CLAIMS, obj)
        return self.observe_claim(stored)

    def observe_claim(self, obj: Obj) -> ClaimView:
        """What the informer boundary does: parse the claim once, cache it, observe the change."""
        view = self.reconciler.claim_view(obj)
        old = self.reconciler.claims.get(view.key)
        self.reconciler.claims[view.key] = view
        self.reconciler.observe_claim(old, view)
        return view

    def add_pod(self, obj: Obj) -> PodView:
        stored = self.kube.put(PODS, obj)
        view = self.reconciler.pods[f"{NS}/{obj['metadata']['name']}"] = PodView.parse(stored)
        self.reconciler.observe_pod(None, view)
        return view

    def edited_pod(self, name: str, edit: Callable[[Obj], object]) -> PodView:
        return edited(self.reconciler.pods[f"{NS}/{name}"], edit)

    def sync(self) -> None:
        """What the informers would deliver: the API's current claims and pods."""
        for (plural, _, _), obj in list(self.kube.objects.items()):
            if plural == "resourceclaims":
                self.observe_claim(copy.deepcopy(obj))
            elif plural == "pods":
                self.reconciler.pods[f"{NS}/{obj['metadata']['name']}"] = PodView.parse(copy.deepcopy(obj))

    def place(self, pod_name: str) -> CommitResult:
        outcome = self.reconciler.reconcile_pod(self.reconciler.pods[f"{NS}/{pod_name}"])
        assert isinstance(outcome, CommitJob), outcome
        result = self.reconciler.commit(outcome)
        self.reconciler.apply(result)
        self.sync()
        return result

    def claim(self, name: str) -> Obj:
        return self.kube.stored(RESOURCE_CLAIMS, NS, name)

    def pod(self, name: str) -> Obj:
        return self.kube.stored(PODS, NS, name)

    def events(self) -> list[str]:
        return [
            str(o.get("message")) for (plural, _, _), o in self.kube.objects.items() if plural == "events"
        ]


def tenant(world: World, name: str, memory: str = "1Gi", klass: str = DRIVER, **kwargs: Any) -> None:
    world.add_claim(claim(name, request(klass=klass, memory=memory, **kwargs)))
    world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def devices(world: World, name: str) -> list[str]:
    allocation = world.claim(name).get("status", {}).get("allocation") or {}
    return [r["device"] for r in allocation.get("devices", {}).get("results", [])]


def shared_on_gpu0(share_id: str, memory: str, cores: str = "0") -> Obj:
    """``status.allocation`` with one shared result on gpu-0, as another allocator writes it."""
    result = {
        "request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": share_id,
        "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
    }  # fmt: skip
    return {"devices": {"results": [result]}}


def condition(world: World, pod_name: str) -> Obj | None:
    for item in world.pod(pod_name).get("status", {}).get("conditions") or ():
        if item["type"] == CONDITION_TYPE:
            return dict(item)
    return None


# --- placing ---------------------------------------------------------------------------------------


def test_a_placement_writes_finalizer_then_allocation_then_the_gate() -> None:
    world = World()
    tenant(world, "a")
    result = world.place("a-pod")
    assert result.outcome == "done"
    assert [c for c in world.kube.writes() if c[1] != "events"] == [
        ("update", "resourceclaims", "a"),
        ("update/status", "resourceclaims", "a"),
        ("update", "pods", "a-pod"),
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
    (use,) = world.reconciler.ledger.claims()[written["metadata"]["uid"]]
    assert (use.device, use.memory) == (DeviceId(DRIVER, NODE, share["device"]), 1024**3)


def test_the_next_pod_is_planned_with_the_allocation_still_in_flight() -> None:
    world = World(gpus=1)
    world.add_class(device_class("gpu-mutex", {"policy": "mutex"}))
    tenant(world, "first", klass="gpu-mutex")
    tenant(world, "second", klass="gpu-mutex")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/first-pod"])
    assert isinstance(job, CommitJob)
    assert world.reconciler.assumed.writing(f"{NS}/first")
    outcome = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/second-pod"])
    assert outcome == "pending"  # the assumed use of the one card blocks a second mutex claim
    assert "ExclusiveDeviceAllocateConflict" in world.events()[-1]
    world.reconciler.apply(world.reconciler.commit(job))
    assert not world.reconciler.assumed.in_flight


def test_a_conflict_on_the_finalizer_write_is_retried_with_the_re_read_claim() -> None:
    world = World()
    tenant(world, "a")
    world.kube.fail("update", "resourceclaims", 409, "conflict")
    result = world.place("a-pod")
    assert result.outcome == "done" and devices(world, "a")
    assert world.metrics.conflicts._value.get() == 1
    assert ("get", "resourceclaims", "a") in world.kube.calls


def test_a_claim_allocated_by_someone_else_meanwhile_is_not_written_over() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    foreign = world.claim("a")
    foreign["status"] = {"allocation": copy.deepcopy(job.writes[0][1])}
    foreign["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    world.kube.update(RESOURCE_CLAIMS, foreign, status=True)
    world.kube.fail("update", "resourceclaims", 409)  # our finalizer write sees the new version
    result = world.reconciler.commit(job)
    assert result.outcome == "retry" and not result.written
    world.reconciler.apply(result)
    assert devices(world, "a") == ["gpu-1"]
    (use,) = world.reconciler.ledger.claims()[foreign["metadata"]["uid"]]
    assert use.device.device == "gpu-1"  # the ledger counts the other allocator's choice
    assert world.pod("a-pod")["spec"]["schedulingGates"]  # gate kept: planned again next pass


def test_a_deposed_replica_writes_no_allocation() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    world.leading = False
    result = world.reconciler.commit(job)
    assert result.outcome == "retry"
    assert not [c for c in world.kube.writes("resourceclaims")]


def test_a_server_error_leaves_the_claim_as_the_api_has_it() -> None:
    world = World()
    tenant(world, "a")
    world.kube.fail("update/status", "resourceclaims", 500)
    result = world.place("a-pod")
    assert result.outcome == "retry"
    assert not devices(world, "a")
    assert world.reconciler.ledger.claims() == {}
    assert not world.reconciler.assumed.in_flight


def test_a_vanished_pod_ends_the_commit_quietly() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    del world.kube.objects[("pods", NS, "a-pod")]
    assert world.reconciler.commit(job).outcome == "skip"


def test_a_gate_conflict_is_retried_on_the_re_read_pod() -> None:
    world = World()
    tenant(world, "a")
    world.kube.fail("update", "pods", 409)
    assert world.place("a-pod").outcome == "done"
    assert not world.pod("a-pod")["spec"].get("schedulingGates")


# --- pending ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "reason", "message"),
    [
        (
            lambda w: w.add_claim(claim("x", request(klass="nope"))),
            "DeviceClassNotFound",
            "DeviceClass nope not found",
        ),
        (lambda w: w.add_claim(claim("x", request(memory="-1Gi"))), "InvalidRequest", "claim default/x: "),
        (
            lambda w: w.add_claim(claim("x", request(memory="100Gi"))),
            "Unschedulable",
            "CardInsufficientMemory",
        ),
    ],
    ids=["missing-class", "invalid-request", "too-big"],
)
def test_a_pod_that_cannot_be_placed_says_why(build: Any, reason: str, message: str) -> None:
    world = World()
    build(world)
    world.add_pod(pod("x-pod", {"gpu": "claim:x"}))
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/x-pod"]) == "pending"
    found = condition(world, "x-pod")
    assert found is not None and found["status"] == "False" and found["reason"] == reason
    assert message in found["message"] and message in world.events()[-1]
    # Asked again with nothing changed: no second event, no second condition write.
    writes = len(world.kube.writes())
    world.sync()
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/x-pod"]) == "pending"
    assert len(world.kube.writes()) == writes


def test_once_placed_the_pending_condition_turns_true() -> None:
    world = World(gpus=1)
    tenant(world, "big", memory="20Gi")
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/big-pod"]) == "pending"
    world.sync()
    slices = build_resource_slices(profile_gpus("a100-80gb", node_name=NODE, gpus=1), node_name=NODE,
                                   driver_name=DRIVER)  # fmt: skip
    world.reconciler.refresh_inventory(slices)
    assert world.place("big-pod").outcome == "done"
    found = condition(world, "big-pod")
    assert found is not None and (found["status"], found["reason"]) == ("True", "Allocated")


def test_a_quota_blocks_the_placement_with_the_numbers() -> None:
    world = World()
    quota = world.kube.put(
        GPU_QUOTAS,
        {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "1536Mi"}}},
    )
    world.reconciler.quotas.set_gpu_quota(f"{NS}/cap", quota)
    tenant(world, "a")
    assert world.place("a-pod").outcome == "done"
    tenant(world, "b")
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/b-pod"]) == "pending"
    found = condition(world, "b-pod")
    assert found is not None and found["reason"] == "GpuQuotaExceeded"
    assert found["message"] == "GpuQuotaExceeded: default/cap memory: used 1Gi + requested 1Gi > hard 1536Mi"
    world.reconciler.quotas.sync(world.kube, force=True)
    assert world.kube.stored(GPU_QUOTAS, NS, "cap")["status"]["used"] == {
        "memory": "1Gi",
        "cores": 0,
        "devices": 1,
    }


# --- fencing, releasing, repairing -----------------------------------------------------------------


def test_an_unallocated_claim_with_our_finalizer_is_fenced_once() -> None:
    world = World(gpus=1)
    orphan = claim("orphan", request(memory="20Gi"))
    orphan["metadata"]["finalizers"] = [FINALIZER]
    before = world.add_claim(orphan)["metadata"]["resourceVersion"]
    world.add_pod(pod("orphan-pod", {"gpu": "claim:orphan"}))
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/orphan-pod"]) == "pending"
    fenced = world.claim("orphan")
    assert fenced["metadata"]["resourceVersion"] != before
    assert fenced["metadata"]["annotations"][FENCE_ANNOTATION].startswith("test ")
    world.sync()
    world.reconciler.pending.clear()
    world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/orphan-pod"])
    assert [c for c in world.kube.writes("resourceclaims")] == [("update", "resourceclaims", "orphan")]


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
    world.reconciler.fence_unallocated(world.reconciler.pods[f"{NS}/late-pod"])
    (use,) = world.reconciler.ledger.claims()[landed["metadata"]["uid"]]
    assert (use.device.device, use.memory) == ("gpu-0", None)  # the whole card, counted


def test_an_unused_claim_is_released_and_a_reserved_one_kept() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    allocated = world.claim("a")
    allocated["status"]["reservedFor"] = [{"resource": "pods", "name": "a-pod", "uid": "u"}]
    world.kube.update(RESOURCE_CLAIMS, allocated, status=True)
    world.sync()
    assert world.reconciler.reconcile_claim(world.reconciler.claims[f"{NS}/a"]) == "in-use"
    del world.kube.objects[("pods", NS, "a-pod")]
    world.reconciler.observe_pod(world.reconciler.pods.pop(f"{NS}/a-pod"), None)
    cleared = world.claim("a")
    cleared["status"].pop("reservedFor")
    world.kube.update(RESOURCE_CLAIMS, cleared, status=True)
    world.sync()
    assert world.reconciler.reconcile_claim(world.reconciler.claims[f"{NS}/a"]) == "released"
    released = world.claim("a")
    assert "allocation" not in released.get("status", {}) and FINALIZER not in released["metadata"].get(
        "finalizers", []
    )
    assert world.metrics.deallocations._value.get() == 1
    assert world.reconciler.reconcile_claim(world.reconciler.claim_view(released)) == "skip"


def test_a_claim_of_a_live_pod_is_not_released_and_a_gone_claim_is_reported() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    assert world.reconciler.reconcile_claim(world.reconciler.claims[f"{NS}/a"]) == "in-use"
    assert [r["name"] for r in world.claim("a")["status"]["reservedFor"]] == ["a-pod"]
    unreserved = copy.deepcopy(dict(world.reconciler.claims[f"{NS}/a"]))
    unreserved["status"].pop("reservedFor")  # the pod goes: kube-controller-manager drops its entry
    stale = world.reconciler.claim_view(unreserved)
    world.reconciler.observe_pod(world.reconciler.pods.pop(f"{NS}/a-pod"), None)
    world.kube.fail("update/status", "resourceclaims", 500)
    with pytest.raises(KubeError):
        world.reconciler.reconcile_claim(stale)  # an API error is the caller's to retry, not hidden
    assert devices(world, "a")
    del world.kube.objects[("resourceclaims", NS, "a")]
    assert world.reconciler.reconcile_claim(stale) == "gone"


def test_an_overcommitted_card_loses_its_newest_unstarted_claim() -> None:
    world = World(gpus=1)
    for name, stamp in (("old", "2026-12-01T00:00:01Z"), ("new", "2026-12-01T00:00:02Z")):
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {"allocation": shared_on_gpu0(name, "10Gi")}
        world.kube.put(RESOURCE_CLAIMS, obj)
        world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))
    world.sync()
    assert world.reconciler.repair_overcommit(world.reconciler.claims[f"{NS}/old"]) == "deallocated"
    assert devices(world, "old") == ["gpu-0"] and devices(world, "new") == []
    assert any("GPU node-1/gpu-0 was overcommitted" in message for message in world.events())
    assert world.metrics.overcommits.labels("deallocated")._value.get() == 1
    world.sync()
    assert world.reconciler.repair_overcommit(world.reconciler.claims[f"{NS}/old"]) is None


@pytest.mark.parametrize(("gated", "outcome"), [(True, "deallocated"), (False, "reported")])
def test_a_claim_we_reserved_is_repaired_only_while_its_pod_is_still_gated(gated: bool, outcome: str) -> None:
    """We reserve with the allocation, before lifting the gate: a gated pod cannot be bound yet,
    an ungated one may be bound by kube-scheduler at any moment (no PreBind write would conflict)."""
    world = World(gpus=1)
    for name, stamp in (("old", "2026-12-01T00:00:01Z"), ("new", "2026-12-01T00:00:02Z")):
        added = world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=gated))
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {
            "allocation": shared_on_gpu0(name, "10Gi"),
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": added["metadata"]["uid"]}],
        }
        world.kube.put(RESOURCE_CLAIMS, obj)
    world.sync()
    assert world.reconciler.repair_overcommit(world.reconciler.claims[f"{NS}/old"]) == outcome
    assert devices(world, "new") == ([] if gated else ["gpu-0"])


def test_an_overcommit_by_started_claims_is_only_reported() -> None:
    world = World(gpus=1)
    for name in ("x", "y"):
        obj = claim(name, request(memory="10Gi"))
        obj["status"] = {
            "allocation": shared_on_gpu0(name, "10Gi"),
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": name}],
        }
        world.add_claim(obj)
    assert world.reconciler.repair_overcommit(world.reconciler.claims[f"{NS}/x"]) == "reported"
    assert devices(world, "x") == devices(world, "y") == ["gpu-0"]
    assert world.metrics.overcommits.labels("reported")._value.get() == 1


# --- what a pod's claims decide before planning -----------------------------------------------------


def other_class(name: str = "other") -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "x"'}}]},
    }


def test_a_template_claim_not_created_yet_waits_and_is_found_by_its_owner_later() -> None:
    world = World()
    created = world.add_pod(pod("tpl-pod", {"gpu": "template:one"}))
    assert world.reconciler.reconcile_pod(created) == "waiting"
    owned = claim("tpl-pod-gpu-x", request())
    owned["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "tpl-pod", "uid": created["metadata"]["uid"]}
    ]
    world.add_claim(owned)
    assert world.place("tpl-pod").outcome == "done"  # before kcm filled resourceClaimStatuses
    assert devices(world, "tpl-pod-gpu-x")


def test_a_claim_shared_with_a_pod_being_written_is_retried() -> None:
    world = World()
    world.add_claim(claim("shared", request()))
    for name in ("p1", "p2"):
        world.add_pod(pod(name, {"gpu": "claim:shared"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p1"])
    assert isinstance(job, CommitJob)
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p2"]) == "retry"


def test_claims_pinned_to_two_nodes_are_a_conflict() -> None:
    world = World()
    for name, node in (("c1", "node-a"), ("c2", "node-b")):
        obj = claim(name, request())
        obj["status"] = {"allocation": {"nodeSelector": node_selector(node), "devices": {"results": []}}}
        world.add_claim(obj)
    world.add_pod(pod("p", {"one": "claim:c1", "two": "claim:c2"}))
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"]) == "pending"
    found = condition(world, "p")
    assert found is not None and found["reason"] == "NodeConflict"
    assert "['node-a', 'node-b']" in found["message"]


def test_a_claim_mixing_drivers_is_refused() -> None:
    world = World()
    world.add_class(other_class())
    world.add_claim(claim("mixed", request(name="ours"), request(name="theirs", klass="other")))
    world.add_pod(pod("p", {"gpu": "claim:mixed"}))
    assert world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"]) == "pending"
    found = condition(world, "p")
    assert found is not None and found["reason"] == "MixedClaim" and "(theirs)" in found["message"]


def test_a_pod_with_nothing_of_ours_to_allocate_is_let_go() -> None:
    world = World()
    world.add_class(other_class())
    world.add_claim(claim("foreign", request(klass="other")))
    world.add_pod(pod("p", {"gpu": "claim:foreign"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    assert isinstance(job, CommitJob) and job.writes == []
    world.reconciler.apply(world.reconciler.commit(job))
    assert not world.pod("p")["spec"].get("schedulingGates")
    assert "allocation" not in world.claim("foreign").get("status", {})


def test_an_allocation_cleared_by_kube_scheduler_is_made_again_for_an_ungated_pod() -> None:
    world = World()
    cleared = claim("again", request())
    cleared["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(cleared)
    ungated = world.add_pod(pod("p", {"gpu": "claim:again"}, gated=False))
    assert world.reconciler.is_candidate(ungated)
    job = world.reconciler.reconcile_pod(ungated)
    assert isinstance(job, CommitJob) and len(job.writes) == 1
    assert not world.reconciler.is_candidate(edited(ungated, lambda p: p["spec"].update(nodeName=NODE)))


def test_a_claim_deleted_while_it_was_written_leaves_the_ledger() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    assert world.reconciler.ledger.claims()  # assumed while being written
    del world.kube.objects[("resourceclaims", NS, "a")]
    result = world.reconciler.commit(job)
    assert result.outcome == "retry" and result.failed == [(job.writes[0][0], None)]
    world.reconciler.apply(result)
    assert world.reconciler.ledger.claims() == {}


def two_claims_job(world: World) -> CommitJob:
    """Pod ``p`` with claims c1 and c2, planned: its job writes both."""
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    world.add_pod(pod("p", {"one": "claim:c1", "two": "claim:c2"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    assert isinstance(job, CommitJob) and len(job.writes) == 2
    return job


def test_the_second_claim_is_not_written_when_the_first_failed() -> None:
    world = World()
    job = two_claims_job(world)
    world.kube.fail("update/status", "resourceclaims", 500)
    result = world.reconciler.commit(job)
    assert result.outcome == "retry" and len(result.failed) == 1
    world.reconciler.apply(result)
    assert world.reconciler.ledger.claims() == {}  # neither assumption survives
    assert not world.reconciler.assumed.in_flight
    assert ("update", "resourceclaims", "c2") not in world.kube.calls


def test_cpu_requests_keep_a_pod_off_a_full_node() -> None:
    world = World()
    full = world.kube.stored(NODES, None, NODE)
    full["status"]["allocatable"] = {"cpu": "1"}
    world.reconciler.nodes[NODE] = NodeView.parse(full)
    busy = pod("busy", {})
    busy["spec"]["nodeName"] = NODE
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "800m"}}
    busy["spec"].pop("schedulingGates")
    world.add_pod(busy)
    tenant(world, "a")

    def wanting(cpu: str) -> PodView:
        return world.edited_pod("a-pod", lambda p: p["spec"]["containers"][0]["resources"].update(
            requests={"cpu": cpu}))  # fmt: skip

    assert world.reconciler.allowed_nodes(wanting("500m")) == frozenset()
    assert world.reconciler.allowed_nodes(wanting("200m")) == frozenset({NODE})


def test_a_fractional_consumed_amount_is_counted_up_not_down() -> None:
    from dra_driver.controller.ledger import claim_uses

    obj = claim("half", request())
    obj["status"] = {"allocation": shared_on_gpu0("s", "1.5", cores="0.5")}
    (use,) = claim_uses(obj, DRIVER)
    assert (use.memory, use.cores, use.slots) == (2, 1, 1)


# --- the pieces: events, decision lines, versions, indexes -------------------------------------------


def test_a_pending_pod_gets_a_complete_warning_event() -> None:
    from tests.kube_validate import assert_valid

    world = World()
    world.add_claim(claim("x", request(memory="100Gi")))
    created = world.add_pod(pod("x-pod", {"gpu": "claim:x"}))
    world.reconciler.reconcile_pod(created)
    (event,) = [o for (plural, _, _), o in world.kube.objects.items() if plural == "events"]
    assert_valid(event)
    assert event["metadata"]["generateName"] == "x-pod." and event["metadata"]["namespace"] == NS
    uid = created["metadata"]["uid"]
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "x-pod", "namespace": NS, "uid": uid,
    }  # fmt: skip
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "FailedAllocation", 1)
    assert event["source"] == {"component": "hami-dra-controller"}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("gpu.hami.io/controller", "test")
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert "2/2 CardInsufficientMemory" in event["message"]
    # The failure metric is labelled by HAMi's first reason.
    assert world.metrics.failures.labels("CardInsufficientMemory")._value.get() == 1


def test_a_long_message_is_cut_to_what_the_api_accepts() -> None:
    world = World()
    world.reconciler._event(world.add_pod(pod("p", {})), "Warning", "Test", "x" * 5000)
    (event,) = [o for (plural, _, _), o in world.kube.objects.items() if plural == "events"]
    assert len(event["message"]) == 1024


def test_an_event_the_api_refuses_is_dropped_without_failing_the_pass() -> None:
    world = World()
    world.kube.fail("create", "events", 403)
    world.reconciler._event(world.add_pod(pod("p", {})), "Warning", "Test", "m")
    assert not [o for (plural, _, _), o in world.kube.objects.items() if plural == "events"]


def test_the_decision_line_lists_every_card_and_the_choice() -> None:
    from dra_driver.controller.reconciler import format_decision
    from dra_driver.engine import parse_node_policy, parse_policy_chain
    from dra_driver.engine.model import CandidateCard, Decision, DeviceShare, Placement
    from dra_driver.engine.reasons import Reason

    def card(index: int, score: float, eligible: bool, chosen: bool, reason: Reason | None) -> CandidateCard:
        return CandidateCard("n1", index, "T4", 0, 0, 0, 0, 1, score, eligible, chosen, reason)

    cards = (
        card(0, 3.302083, False, False, Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        card(1, 0.0, True, True, None),
        card(2, 0.0, False, False, None),
    )
    chain, node_policy = parse_policy_chain("mutex,binpack"), parse_node_policy("binpack")
    placed = Decision("r", chain, node_policy, Placement("n1", (DeviceShare(1, 1, 0),)), None, cards, ())
    assert format_decision("claim a", placed, "policy=mutex,binpack") == (
        "claim a: policy=mutex,binpack -> n1 gpu-1; scores: "
        "n1/gpu-0=3.302083(ExclusiveDeviceAllocateConflict) n1/gpu-1=0.000000* n1/gpu-2=0.000000(ineligible)"
    )
    pending = Decision("r", chain, node_policy, None, "1/1 CardInsufficientMemory", (), ())
    assert (
        format_decision("claim b", pending, "c")
        == "claim b: c -> pending: 1/1 CardInsufficientMemory; scores: -"
    )


def test_an_assumed_claim_is_kept_until_the_cache_catches_up_or_it_expires() -> None:
    from dra_driver.controller.assumed import ASSUME_SECONDS, ClaimAssumptions

    world = World()
    now = [1000.0]
    world.reconciler.assumed = ClaimAssumptions(world.reconciler.ledger, DRIVER, clock=lambda: now[0])
    tenant(world, "a")
    stale = copy.deepcopy(world.reconciler.claims[f"{NS}/a"])
    world.place("a-pod")
    written = world.claim("a")
    world.reconciler.assumed.wrote(written)  # what commit's apply records
    world.reconciler.claims[f"{NS}/a"] = stale  # the informer has not delivered our write yet
    assert world.reconciler.claim(NS, "a") == written
    now[0] += ASSUME_SECONDS - 1
    assert world.reconciler.claim(NS, "a") == written  # still inside the window
    now[0] += 2
    assert world.reconciler.claim(NS, "a") == stale  # given up on: the cache is the truth again
    world.reconciler.assumed.wrote(written)
    recreated = copy.deepcopy(dict(stale))
    recreated["metadata"]["uid"] = "another-object"
    world.reconciler.claims[f"{NS}/a"] = world.reconciler.claim_view(recreated)
    assert world.reconciler.claim(NS, "a") == recreated  # a new object of the same name
    world.reconciler.assumed.wrote(written)
    world.reconciler.claims[f"{NS}/a"] = world.reconciler.claim_view(written)
    assert world.reconciler.claim(NS, "a") == written and not world.reconciler.assumed.is_assumed(f"{NS}/a")


def test_the_pod_index_follows_updates_and_deletions() -> None:
    world = World()
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    first = world.add_pod(pod("p", {"gpu": "claim:c1"}))
    uid = first["metadata"]["uid"]
    assert (
        world.reconciler.consumers[f"{NS}/c1"] == {f"{NS}/p"}
        and world.reconciler.pods_by_uid[uid] == f"{NS}/p"
    )
    moved = world.edited_pod(
        "p", lambda p: p["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimName": "c2"}])
    )
    generation = world.reconciler.bound_generation
    world.reconciler.observe_pod(first, moved)
    assert world.reconciler.consumers[f"{NS}/c1"] == set() and world.reconciler.consumers[f"{NS}/c2"] == {
        f"{NS}/p"
    }
    assert world.reconciler.bound_generation == generation  # not bound: CPU use did not change
    bound = edited(moved, lambda p: p["spec"].update(nodeName=NODE))
    world.reconciler.observe_pod(moved, bound)
    assert world.reconciler.bound_generation == generation + 1
    world.reconciler.observe_pod(bound, None)
    assert world.reconciler.bound_generation == generation + 2
    assert uid not in world.reconciler.pods_by_uid and world.reconciler.consumers[f"{NS}/c2"] == set()


@pytest.mark.parametrize(
    ("change", "candidate"),
    [
        (lambda p: None, True),
        (lambda p: p["spec"].update(nodeName=NODE), False),
        (lambda p: p["metadata"].update(deletionTimestamp="2026-12-01T00:00:00Z"), False),
        (lambda p: p.update(status={"phase": "Succeeded"}), False),
        (lambda p: p["spec"].pop("schedulingGates"), False),
    ],
    ids=["gated", "bound", "deleting", "finished", "ungated"],
)
def test_which_pods_the_controller_plans(change: Any, candidate: bool) -> None:
    world = World()
    world.add_claim(claim("c", request()))
    world.add_pod(pod("p", {"gpu": "claim:c"}))
    assert world.reconciler.is_candidate(world.edited_pod("p", change)) is candidate


def test_an_ungated_pod_whose_claim_is_allocated_or_someone_elses_is_not_planned() -> None:
    world = World()
    ours = claim("ours", request())
    ours["metadata"]["finalizers"] = [FINALIZER]
    ours["status"] = {"allocation": {"devices": {"results": []}}}
    world.add_claim(ours)
    world.add_claim(claim("theirs", request()))
    for name in ("ours", "theirs"):
        ungated = world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False))
        assert not world.reconciler.is_candidate(ungated)
    other_gate = edited(
        world.add_pod(pod("other-gate", {"gpu": "claim:ours"}, gated=False)),
        lambda p: p["spec"].update(schedulingGates=[{"name": "someone.else/gate"}]),
    )
    cleared = world.kube.stored(RESOURCE_CLAIMS, NS, "ours")
    cleared["status"] = {}
    world.observe_claim(cleared)
    assert not world.reconciler.is_candidate(other_gate)  # another gate: not ours to lift


# --- releasing ---------------------------------------------------------------------------------------


def allocated_claim(world: World, name: str, **status: Any) -> ClaimView:
    obj = claim(name, request())
    obj["metadata"]["finalizers"] = ["someone.else/keep", FINALIZER]
    obj["status"] = {"allocation": shared_on_gpu0("s", "1Gi"), **status}
    return world.add_claim(obj)


def test_a_claim_reserved_by_a_pod_not_seen_yet_is_kept() -> None:
    world = World()
    obj = allocated_claim(world, "r", reservedFor=[{"resource": "pods", "name": "unknown", "uid": "u"}])
    assert world.reconciler.reconcile_claim(obj) == "in-use"
    assert devices(world, "r") == ["gpu-0"]


def test_a_release_keeps_other_finalizers_and_rechecks_after_a_conflict() -> None:
    world = World()
    obj = allocated_claim(world, "r")
    reserved = world.claim("r")
    reserved["status"]["reservedFor"] = [{"resource": "pods", "name": "late", "uid": "u"}]
    world.kube.update(RESOURCE_CLAIMS, reserved, status=True)  # reserved since our copy was read
    assert world.reconciler.reconcile_claim(obj) == "in-use"  # the re-read after the 409 shows it
    assert world.metrics.conflicts._value.get() == 1
    cleared = world.claim("r")
    cleared["status"].pop("reservedFor")
    world.kube.update(RESOURCE_CLAIMS, cleared, status=True)
    assert world.reconciler.reconcile_claim(world.reconciler.claim_view(world.claim("r"))) == "released"
    assert world.claim("r")["metadata"]["finalizers"] == ["someone.else/keep"]


def test_a_claim_being_deleted_is_released_even_with_a_live_pod() -> None:
    world = World()
    obj = allocated_claim(world, "d")
    world.add_pod(pod("d-pod", {"gpu": "claim:d"}))
    assert world.reconciler.reconcile_claim(obj) == "in-use"
    deleting = world.claim("d")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    world.kube.objects[("resourceclaims", NS, "d")]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert world.reconciler.reconcile_claim(world.reconciler.claim_view(deleting)) == "released"


def test_a_pod_owning_a_template_claim_keeps_it_while_active() -> None:
    world = World()
    owner = world.add_pod(pod("owner", {"gpu": "template:t"}))
    owned = claim("owner-gpu", request())
    owned["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "owner",
                                             "uid": owner["metadata"]["uid"]}]  # fmt: skip
    owned["metadata"]["finalizers"] = [FINALIZER]
    stored = world.add_claim(owned)
    assert world.reconciler.live_consumers(stored)
    world.reconciler.pods[f"{NS}/owner"] = edited(owner, lambda p: p.update(status={"phase": "Failed"}))
    assert not world.reconciler.live_consumers(stored)


# --- writes keep what others wrote ------------------------------------------------------------------


def test_the_allocation_write_keeps_other_finalizers_and_the_gate_others_gates() -> None:
    world = World()
    obj = claim("a", request())
    obj["metadata"]["finalizers"] = ["someone.else/keep"]
    world.add_claim(obj)
    gated = pod("a-pod", {"gpu": "claim:a"}, annotations={"team": "x"})
    gated["spec"]["schedulingGates"].append({"name": "someone.else/gate"})
    world.add_pod(gated)
    assert world.place("a-pod").outcome == "done"
    assert world.claim("a")["metadata"]["finalizers"] == ["someone.else/keep", FINALIZER]
    after = world.pod("a-pod")
    assert after["spec"]["schedulingGates"] == [{"name": "someone.else/gate"}]
    assert (
        after["metadata"]["annotations"]["team"] == "x" and HAMI_ALLOCATED in after["metadata"]["annotations"]
    )
    assert (
        world.reconciler.pods[f"{NS}/a-pod"]["metadata"]["resourceVersion"]
        == after["metadata"]["resourceVersion"]
    )


def test_a_non_conflict_write_error_reports_what_the_api_holds() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    world.kube.fail("update", "resourceclaims", 500)
    result = world.reconciler.commit(job)
    ((_, current),) = result.failed
    assert current is not None
    assert current["metadata"]["resourceVersion"] == world.claim("a")["metadata"]["resourceVersion"]
    world.reconciler.apply(result)
    world.kube.fail("update", "resourceclaims", 500)
    world.kube.fail("get", "resourceclaims", 500)
    job2 = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job2, CommitJob)
    ((_, fallback),) = world.reconciler.commit(job2).failed
    assert fallback is not None and fallback["metadata"]["name"] == "a"  # the re-read failed: our copy


def test_the_allocated_condition_says_so_after_a_pending_report() -> None:
    world = World(gpus=1)
    tenant(world, "a", memory="20Gi")
    world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    world.sync()
    slices = build_resource_slices(profile_gpus("a100-80gb", node_name=NODE, gpus=1), node_name=NODE,
                                   driver_name=DRIVER)  # fmt: skip
    world.reconciler.refresh_inventory(slices)
    world.place("a-pod")
    found = condition(world, "a-pod")
    assert found is not None and found["message"] == "all GPU claims are allocated"


def test_a_condition_write_conflict_is_retried_on_the_re_read_pod() -> None:
    world = World()
    created = world.add_pod(pod("p", {}))
    world.kube.fail("update/status", "pods", 409)
    written = world.reconciler._set_condition(created, "False", "R", "m")
    assert written is not None and written["status"]["conditions"][-1]["reason"] == "R"
    world.kube.fail("update/status", "pods", 500)
    assert world.reconciler._set_condition(world.pod("p"), "False", "R2", "m") is None


# --- second round: what the mutation run still found unpinned ---------------------------------------


def second_node(world: World, name: str = "node-2") -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {"allocatable": {}}}
    world.reconciler.nodes[name] = NodeView.parse(world.kube.put(NODES, node))
    slices = [
        *build_resource_slices(
            profile_gpus("t4", node_name=NODE, gpus=2), node_name=NODE, driver_name=DRIVER
        ),
        *build_resource_slices(
            profile_gpus("t4", node_name=name, gpus=2), node_name=name, driver_name=DRIVER
        ),
    ]
    world.reconciler.refresh_inventory(slices)


def test_the_reconciler_never_edits_the_cached_objects_in_place() -> None:
    world = World(gpus=1)
    tenant(world, "a")
    orphan = claim("orphan", request(memory="20Gi"))
    orphan["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(orphan)
    world.add_pod(pod("orphan-pod", {"gpu": "claim:orphan"}))
    originals = [*world.reconciler.claims.values(), *world.reconciler.pods.values()]
    snapshot = copy.deepcopy(originals)
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    world.reconciler.commit(job)
    world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/orphan-pod"])  # fenced, pending
    assert originals == snapshot  # replaced in the caches where they changed, never edited
    allocated = world.claim("a")
    cached = copy.deepcopy(allocated)
    world.reconciler._deallocate(allocated)
    assert allocated == cached


def test_applying_a_commit_records_the_written_pod() -> None:
    world = World()
    tenant(world, "a")
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/a-pod"])
    assert isinstance(job, CommitJob)
    world.reconciler.apply(world.reconciler.commit(job))  # no informer event yet
    assert not world.reconciler.pods[f"{NS}/a-pod"]["spec"].get("schedulingGates")


def test_an_unattempted_write_falls_back_to_what_the_cache_holds() -> None:
    world = World()
    job = two_claims_job(world)
    elsewhere = world.claim("c2")  # meanwhile kube-scheduler allocated c2 (the informer saw it)
    elsewhere["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}]}}}  # fmt: skip
    world.observe_claim(world.kube.update(RESOURCE_CLAIMS, elsewhere, status=True))
    world.kube.fail("update/status", "resourceclaims", 500)  # c1's write fails; c2's is never tried
    world.reconciler.apply(world.reconciler.commit(job))
    uses = world.reconciler.ledger.claims()
    (use,) = uses[elsewhere["metadata"]["uid"]]
    assert (use.device.device, use.memory) == ("gpu-1", None)


def test_a_pod_with_nothing_left_to_allocate_clears_its_pending_report() -> None:
    world = World()
    world.add_class(other_class())
    world.add_claim(claim("foreign", request(klass="other")))
    waiting = world.add_pod(pod("p", {"gpu": "claim:foreign"}))
    world.reconciler.pending[waiting["metadata"]["uid"]] = ("earlier reason", "Unschedulable")
    job = world.reconciler.reconcile_pod(waiting)
    assert isinstance(job, CommitJob) and job.clear_pending
    world.reconciler.apply(world.reconciler.commit(job))
    found = condition(world, "p")
    assert found is not None and found["status"] == "True"
    assert waiting["metadata"]["uid"] not in world.reconciler.pending


def test_a_claim_named_twice_by_one_pod_is_planned_once() -> None:
    world = World()
    world.add_claim(claim("dup", request()))
    world.add_pod(pod("p", {"one": "claim:dup", "two": "claim:dup"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    assert isinstance(job, CommitJob) and len(job.writes) == 1


def test_every_missing_class_is_named() -> None:
    world = World()
    world.add_claim(claim("x", request(name="a", klass="gone-1"), request(name="b", klass="gone-2")))
    world.add_pod(pod("p", {"gpu": "claim:x"}))
    world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    found = condition(world, "p")
    assert found is not None and "DeviceClass gone-1, gone-2 not found" in found["message"]


def test_a_claim_allocated_on_one_node_pins_the_pods_other_claims_there() -> None:
    world = World()
    second_node(world)
    pinned = claim("pinned", request())
    pinned["status"] = {"allocation": {"nodeSelector": node_selector("node-2"), "devices": {"results": []}}}
    world.add_claim(pinned)
    world.add_claim(claim("fresh", request()))
    world.add_pod(pod("p", {"one": "claim:pinned", "two": "claim:fresh"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    assert isinstance(job, CommitJob)
    ((_, allocation),) = job.writes
    assert allocation["nodeSelector"] == node_selector("node-2")


def test_the_hami_annotation_names_the_chosen_card() -> None:
    world = World()
    tenant(world, "a", memory="2000Mi")
    world.place("a-pod")
    (device,) = devices(world, "a")
    card = world.reconciler.ledger.inventory[NODE].devices[DeviceId(DRIVER, NODE, device)].card
    value = world.pod("a-pod")["metadata"]["annotations"][HAMI_ALLOCATED]
    assert value == f"{card.uuid},NVIDIA,2000,0:;"


def test_the_newest_claim_not_yet_started_is_the_one_deallocated() -> None:
    world = World(gpus=1)
    stamps = {"old-unstarted": "2026-12-01T00:00:01Z", "new-started": "2026-12-01T00:00:02Z"}
    for name, stamp in stamps.items():
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {"allocation": shared_on_gpu0(name, "10Gi")}
        if name == "new-started":
            obj["status"]["reservedFor"] = [{"resource": "pods", "name": "x", "uid": "x"}]
        world.kube.put(RESOURCE_CLAIMS, obj)
        world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))
    world.sync()
    assert world.reconciler.repair_overcommit(world.reconciler.claims[f"{NS}/new-started"]) == "deallocated"
    assert devices(world, "old-unstarted") == [] and devices(world, "new-started") == ["gpu-0"]
    events = [o for (plural, _, _), o in world.kube.objects.items() if plural == "events"]
    about = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events)
    assert about == [("Pod", "old-unstarted-pod"), ("ResourceClaim", "old-unstarted")]
    for event in events:
        assert (event["type"], event["reason"]) == ("Warning", "GpuOvercommitted")
        assert "memory 21474836480 > 16106127360" in event["message"]
    claim_event = next(e for e in events if e["involvedObject"]["kind"] == "ResourceClaim")
    assert claim_event["involvedObject"]["apiVersion"] == "resource.k8s.io/v1"


def test_a_deallocation_clears_the_device_status_too() -> None:
    world = World()
    obj = claim("s", request())
    obj["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}
        },
        "devices": [{"driver": DRIVER, "pool": NODE, "device": "gpu-0"}],
    }
    stored = world.add_claim(obj)
    written = world.reconciler._deallocate(stored)
    assert written["status"] == {} and world.claim("s")["status"] == {}


def test_the_bound_pods_cache_follows_new_bindings() -> None:
    world = World()
    node = world.kube.stored(NODES, None, NODE)
    node["status"]["allocatable"] = {"cpu": "1"}
    world.reconciler.nodes[NODE] = NodeView.parse(node)
    tenant(world, "a")
    wanting = world.edited_pod("a-pod", lambda p: p["spec"]["containers"][0]["resources"].update(
        requests={"cpu": "600m"}))  # fmt: skip
    assert world.reconciler.allowed_nodes(wanting) == frozenset({NODE})  # nothing bound there yet
    busy = pod("busy", {}, gated=False)
    busy["spec"]["nodeName"] = NODE
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "600m"}}
    world.add_pod(busy)
    assert world.reconciler.allowed_nodes(wanting) == frozenset()


def test_quota_metrics_follow_usage_limits_and_deletion() -> None:
    world = World()
    quotas = world.reconciler.quotas
    cap = {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "8Gi", "devices": 2}}}
    quotas.set_gpu_quota(f"{NS}/cap", world.kube.put(GPU_QUOTAS, cap))
    quotas.set_resource_quota(f"{NS}/hami", {
        "metadata": {"name": "hami", "namespace": NS},
        "spec": {"hard": {"limits.nvidia.com/gpucores": "150", "pods": "10"}},
    })  # fmt: skip
    tenant(world, "a", memory="2Gi", cores=30)
    world.place("a-pod")
    quotas.sync(world.kube, force=True)
    registry = world.metrics.registry

    def sample(name: str, quota: str, resource: str) -> float | None:
        labels = {"quota_namespace": NS, "quota": quota, "resource": resource}
        return registry.get_sample_value(name, labels)

    assert sample("hami_dra_quota_used", "cap", "memory") == 2 * 1024**3
    assert sample("hami_dra_quota_hard", "cap", "memory") == 8 * 1024**3
    assert sample("hami_dra_quota_hard", "cap", "devices") == 2
    assert sample("hami_dra_quota_hard", "cap", "cores") is None  # not limited: no series
    assert sample("hami_dra_quota_used", "resourcequota/hami", "cores") == 30
    assert sample("hami_dra_quota_hard", "resourcequota/hami", "cores") == 150
    quotas.set_gpu_quota(f"{NS}/cap", None)
    quotas.sync(world.kube, force=True)
    assert sample("hami_dra_quota_used", "cap", "memory") is None
    assert sample("hami_dra_quota_used", "resourcequota/hami", "cores") == 30


def test_the_assumed_uses_are_what_the_written_allocation_gives() -> None:
    """No serialise-and-reparse: the plan's uses equal the uses read back from the written claim,
    so the informer event of our own write changes nothing in the ledger."""
    from dra_driver.controller.ledger import claim_uses

    world = World()
    world.add_claim(claim("c", request(name="a", memory="1500Mi", cores=25), request(name="b", memory="1Gi")))
    world.add_pod(pod("p", {"gpu": "claim:c"}))
    job = world.reconciler.reconcile_pod(world.reconciler.pods[f"{NS}/p"])
    assert isinstance(job, CommitJob)
    uid = world.claim("c")["metadata"]["uid"]
    assumed = world.reconciler.ledger.claims()[uid]
    generation = world.reconciler.ledger.generation
    world.reconciler.apply(world.reconciler.commit(job))
    assert claim_uses(world.claim("c"), DRIVER) == assumed
    world.sync()
    assert world.reconciler.ledger.generation == generation  # nothing to change


def test_a_pod_event_older_than_our_write_keeps_our_copy_and_a_deletion_forgets_the_pod() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")  # our gate-lifting write is cached
    ours = world.reconciler.pods[f"{NS}/a-pod"]
    older = edited(ours, lambda p: p["metadata"].update(resourceVersion=str(int(ours.resource_version) - 1)))
    assert world.reconciler.pod_event(ours.key, ours, older) is ours  # the watch lags our write
    newer = edited(ours, lambda p: p["metadata"].update(resourceVersion=str(int(ours.resource_version) + 1)))
    world.reconciler.pending[ours.uid] = ("stale", "Unschedulable")
    assert world.reconciler.pod_event(ours.key, ours, newer) is newer
    assert world.reconciler.pods[ours.key] is newer and world.reconciler.consumers[f"{NS}/a"] == {ours.key}
    assert ours.uid in world.reconciler.pending  # an update is not a deletion
    world.reconciler.warned[ours.uid] = {"a warning"}
    assert world.reconciler.pod_event(ours.key, newer, None) is None
    assert ours.key not in world.reconciler.pods and ours.uid not in world.reconciler.pending
    assert ours.uid not in world.reconciler.warned and ours.uid not in world.reconciler.pods_by_uid
    assert world.reconciler.consumers[f"{NS}/a"] == set()


def test_a_claim_event_caches_the_claim_and_its_deletion_forgets_what_was_assumed() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    cached = world.reconciler.claims[f"{NS}/a"]
    assert world.reconciler.ledger.claims()[cached.uid]  # its allocation is counted
    world.reconciler.fenced[cached.key] = cached.resource_version
    world.reconciler.assumed.wrote(cached)
    world.reconciler.claim_event(cached.key, cached, None)
    assert cached.key not in world.reconciler.claims and cached.key not in world.reconciler.fenced
    assert not world.reconciler.assumed.is_assumed(cached.key)
    assert cached.uid not in world.reconciler.ledger.claims()
    world.reconciler.claim_event(cached.key, None, cached)
    assert world.reconciler.claims[cached.key] is cached and world.reconciler.ledger.claims()[cached.uid]


def test_a_class_event_decides_whether_its_name_is_ours() -> None:
    world = World()
    world.reconciler.class_event("small", device_class("small"))
    world.reconciler.class_event("foreign", {"metadata": {"name": "foreign"}, "spec": {}})
    assert world.reconciler.is_ours("small") and not world.reconciler.is_ours("foreign")
    world.reconciler.class_event("small", None)
    assert not world.reconciler.is_ours("small") and "small" not in world.reconciler.classes
    world.reconciler.node_event(NODE, None)
    assert NODE not in world.reconciler.nodes


def test_an_uncached_pod_event_unindexes_the_old_version_and_unknown_deletions_are_ignored() -> None:
    world = World()
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    first = world.add_pod(pod("p", {"gpu": "claim:c1"}))
    world.reconciler.pods.pop(first.key)  # not cached (e.g. the deletion of our copy raced the event)
    moved = edited(
        first, lambda p: p["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimName": "c2"}])
    )
    world.reconciler.pod_event(first.key, first, moved)
    assert world.reconciler.consumers[f"{NS}/c1"] == set() and world.reconciler.consumers[f"{NS}/c2"] == {
        first.key
    }
    world.reconciler.pod_event(first.key, moved, None)  # a deletion of a pod never reported pending
    assert world.reconciler.consumers[f"{NS}/c2"] == set()
    world.reconciler.pod_event(f"{NS}/never", None, None)
    world.reconciler.claim_event(f"{NS}/never", None, None)
    world.reconciler.class_event("never", None)
    world.reconciler.node_event("never", None)
    assert f"{NS}/never" not in world.reconciler.pods and f"{NS}/never" not in world.reconciler.claims
