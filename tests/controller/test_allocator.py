"""The allocator (dra_driver/controller/allocator.py): one pod and the cluster cache in, an outcome out.

The cache is built from objects the way the informers deliver them (``CacheWorld``); no API is
involved, fake or real: each test asserts on the outcome ``Allocator.allocate`` returns (its
type, reason and message, the allocations to write, the pod's annotations), or on the allocator's
questions (``is_candidate``, ``allowed_nodes``) and its decision line.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.contract import DeviceId
from dra_driver.controller import FINALIZER
from dra_driver.controller.allocation import node_selector
from dra_driver.controller.allocator import (
    UNSCHEDULABLE,
    ClaimBusy,
    NotCandidate,
    Placed,
    Unschedulable,
    WaitingForClaim,
    format_decision,
)
from dra_driver.controller.decision_record import decision_annotation
from dra_driver.controller.hami_annotation import ANNOTATION as HAMI_ALLOCATED
from dra_driver.engine import parse_node_policy, parse_policy_chain
from dra_driver.engine.model import CandidateCard, Decision, DeviceShare, Placement
from dra_driver.engine.reasons import Reason
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.worlds import NODE, CacheWorld, edited, other_class, tenant

# --- which pods are ours to place -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "candidate"),
    [
        (lambda p: None, True),
        (lambda p: p["spec"].update(nodeName=NODE), False),
        (lambda p: p["metadata"].update(deletionTimestamp="2026-12-01T00:00:00Z"), False),
        (lambda p: p.update(status={"phase": "Succeeded"}), False),
        # Ungated with its claim of ours unallocated: kube-scheduler cannot allocate it (fence).
        (lambda p: p["spec"].pop("schedulingGates"), True),
        (lambda p: p["spec"].update(schedulingGates=[{"name": "someone.else/gate"}]), False),
    ],
    ids=["gated", "bound", "deleting", "finished", "ungated", "another-gate"],
)
def test_a_pod_is_placed_until_it_is_bound_deleted_or_finished(change: Any, candidate: bool) -> None:
    world = CacheWorld()
    world.add_claim(claim("c", request()))
    world.add_pod(pod("p", {"gpu": "claim:c"}))
    changed = world.edited_pod("p", change)
    assert world.allocator.is_candidate(changed) is candidate
    if not candidate:
        assert isinstance(world.allocator.allocate(changed), NotCandidate)


def test_an_ungated_pod_is_placed_when_its_claim_of_ours_is_unallocated() -> None:
    """kube-scheduler's PostFilter clears an allocation whose node it rejects (our finalizer stays);
    a pod admitted ungated with another driver's claim, swapped for one of ours since, has no
    finalizer yet. kube-scheduler allocates neither (the scheduler fence), so the controller does."""
    world = CacheWorld()
    world.add_class(other_class())
    ours = claim("ours", request())
    ours["metadata"]["finalizers"] = [FINALIZER]
    ours["status"] = {"allocation": {"devices": {"results": []}}}
    world.add_claim(ours)
    world.add_claim(claim("theirs", request(klass="other")))
    for name in ("ours", "theirs"):  # allocated, or not of our classes
        ungated = world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False))
        assert not world.allocator.is_candidate(ungated)
    swapped = claim("theirs", request())
    swapped["metadata"]["uid"] = "swapped-in"
    world.deliver("ResourceClaim", swapped)
    swapper = world.pod_view("theirs-pod")
    assert world.allocator.is_candidate(swapper)
    placed = world.allocator.allocate(swapper)
    assert isinstance(placed, Placed) and [write.claim.uid for write in placed.writes] == ["swapped-in"]
    other_gate = edited(
        world.add_pod(pod("other-gate", {"gpu": "claim:ours"}, gated=False)),
        lambda p: p["spec"].update(schedulingGates=[{"name": "someone.else/gate"}]),
    )
    cleared = copy.deepcopy(world.objects[("ResourceClaim", NS, "ours")])
    cleared["status"] = {}
    world.deliver("ResourceClaim", cleared)
    assert not world.allocator.is_candidate(other_gate)  # another gate: not ours to lift
    ungated = world.pod_view("ours-pod")
    assert world.allocator.is_candidate(ungated)
    placed = world.allocator.allocate(ungated)
    assert isinstance(placed, Placed) and [write.claim.name for write in placed.writes] == ["ours"]
    assert not world.allocator.is_candidate(edited(ungated, lambda p: p["spec"].update(nodeName=NODE)))


# --- what a pod's claims decide before planning -----------------------------------------------------


def test_a_template_claim_not_created_yet_waits_and_is_found_by_its_owner_later() -> None:
    world = CacheWorld()
    created = world.add_pod(pod("tpl-pod", {"gpu": "template:one"}))
    assert isinstance(world.allocator.allocate(created), WaitingForClaim)
    owned = claim("tpl-pod-gpu-x", request())
    owned["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "tpl-pod", "uid": created.uid}
    ]
    world.add_claim(owned)
    placed = world.allocate("tpl-pod")  # before kube-controller-manager filled resourceClaimStatuses
    assert isinstance(placed, Placed)
    (write,) = placed.writes
    assert write.claim.name == "tpl-pod-gpu-x" and write.allocation["devices"]["results"]


def test_a_claim_shared_with_a_pod_being_written_waits_for_that_write() -> None:
    world = CacheWorld()
    world.add_claim(claim("shared", request()))
    for name in ("p1", "p2"):
        world.add_pod(pod(name, {"gpu": "claim:shared"}))
    first = world.allocate("p1")
    assert isinstance(first, Placed)
    world.assume(first)
    assert isinstance(world.allocate("p2"), ClaimBusy)


def test_a_claim_named_twice_by_one_pod_gets_one_allocation() -> None:
    world = CacheWorld()
    world.add_claim(claim("dup", request()))
    world.add_pod(pod("p", {"one": "claim:dup", "two": "claim:dup"}))
    placed = world.allocate("p")
    assert isinstance(placed, Placed) and len(placed.writes) == 1


def test_a_pod_with_nothing_of_ours_to_allocate_is_placed_with_no_writes() -> None:
    world = CacheWorld()
    world.add_class(other_class())
    world.add_claim(claim("foreign", request(klass="other")))
    world.add_pod(pod("p", {"gpu": "claim:foreign"}))
    placed = world.allocate("p")
    assert isinstance(placed, Placed) and placed.writes == [] and placed.annotations == {}


def test_a_claim_allocated_on_one_node_pins_the_pods_other_claims_there() -> None:
    world = CacheWorld(nodes=(NODE, "node-2"))
    pinned = claim("pinned", request())
    pinned["status"] = {"allocation": {"nodeSelector": node_selector("node-2"), "devices": {"results": []}}}
    world.add_claim(pinned)
    world.add_claim(claim("fresh", request()))
    world.add_pod(pod("p", {"one": "claim:pinned", "two": "claim:fresh"}))
    placed = world.allocate("p")
    assert isinstance(placed, Placed)
    (write,) = placed.writes
    assert write.allocation["nodeSelector"] == node_selector("node-2")


# --- why a pod waits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "reason", "message"),
    [
        (
            [request(name="a", klass="gone-1"), request(name="b", klass="gone-2")],
            "DeviceClassNotFound",
            "claim default/x: DeviceClass gone-1, gone-2 not found",
        ),
        ([request(memory="-1Gi")], "InvalidRequest", "claim default/x: gpu: memory -1Gi is negative"),
        ([request(memory="100Gi")], UNSCHEDULABLE, "2/2 CardInsufficientMemory"),
    ],
    ids=["missing-classes", "invalid-request", "too-big"],
)
def test_a_pod_that_cannot_be_placed_is_unschedulable_with_the_reason(
    requests: list[Any], reason: str, message: str
) -> None:
    """Every missing class is named (the pod keeps its gate: once a class exists it may be ours);
    a request we cannot honour (tests/resource/test_requests.py) is the claim's own error."""
    world = CacheWorld()
    world.add_claim(claim("x", *requests))
    world.add_pod(pod("x-pod", {"gpu": "claim:x"}))
    outcome = world.allocate("x-pod")
    assert isinstance(outcome, Unschedulable) and not outcome.quiet
    assert outcome.reason == reason and message in outcome.message


def test_a_retry_on_a_few_nodes_that_still_does_not_fit_is_quiet() -> None:
    """The pod keeps the explanation of its last full evaluation."""
    world = CacheWorld()
    tenant(world, "x", memory="100Gi")
    outcome = world.allocate("x-pod", frozenset({NODE}))
    assert isinstance(outcome, Unschedulable) and outcome.quiet and outcome.reason == UNSCHEDULABLE


def test_claims_pinned_to_two_nodes_are_a_conflict() -> None:
    world = CacheWorld()
    for name, node in (("c1", "node-a"), ("c2", "node-b")):
        obj = claim(name, request())
        obj["status"] = {"allocation": {"nodeSelector": node_selector(node), "devices": {"results": []}}}
        world.add_claim(obj)
    world.add_pod(pod("p", {"one": "claim:c1", "two": "claim:c2"}))
    outcome = world.allocate("p")
    assert isinstance(outcome, Unschedulable) and outcome.reason == "NodeConflict"
    assert "['node-a', 'node-b']" in outcome.message


def test_a_claim_mixing_drivers_is_refused() -> None:
    world = CacheWorld()
    world.add_class(other_class())
    world.add_claim(claim("mixed", request(name="ours"), request(name="theirs", klass="other")))
    world.add_pod(pod("p", {"gpu": "claim:mixed"}))
    outcome = world.allocate("p")
    assert isinstance(outcome, Unschedulable) and outcome.reason == "MixedClaim"
    assert "(theirs)" in outcome.message


def test_a_quota_refuses_the_placement_with_the_numbers() -> None:
    world = CacheWorld()
    world.deliver(
        "GpuQuota", {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "1536Mi"}}}
    )
    tenant(world, "a")
    first = world.allocate("a-pod")
    assert isinstance(first, Placed)
    world.assume(first)  # counted while it is written
    tenant(world, "b")
    outcome = world.allocate("b-pod")
    assert isinstance(outcome, Unschedulable) and outcome.reason == "GpuQuotaExceeded"
    assert outcome.message == "GpuQuotaExceeded: default/cap memory: used 1Gi + requested 1Gi > hard 1536Mi"


def test_cpu_requests_keep_a_pod_off_a_node_its_bound_pods_fill() -> None:
    world = CacheWorld()
    world.add_node(NODE, {"cpu": "1"})
    tenant(world, "a")

    def wanting(cpu: str) -> Any:
        return world.edited_pod("a-pod", lambda p: p["spec"]["containers"][0]["resources"].update(
            requests={"cpu": cpu}))  # fmt: skip

    assert world.allocator.allowed_nodes(wanting("600m")) == frozenset({NODE})  # nothing bound there yet
    busy = pod("busy", {}, gated=False)
    busy["spec"]["nodeName"] = NODE
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "800m"}}
    world.add_pod(busy)  # a binding arrives: what the node's pods request is counted again
    assert world.allocator.allowed_nodes(wanting("500m")) == frozenset()
    assert world.allocator.allowed_nodes(wanting("200m")) == frozenset({NODE})


# --- what a placement carries -----------------------------------------------------------------------


def test_a_placement_annotates_the_pod_with_hamis_view_of_the_chosen_card_and_our_decision() -> None:
    world = CacheWorld()
    tenant(world, "a", memory="2000Mi")
    placed = world.allocate("a-pod")
    assert isinstance(placed, Placed)
    (write,) = placed.writes
    (result,) = write.allocation["devices"]["results"]
    card = world.cache.ledger.inventory[NODE].devices[DeviceId(DRIVER, NODE, result["device"])].card
    assert placed.annotations[HAMI_ALLOCATED] == f"{card.uuid},NVIDIA,2000,0:;"
    assert decision_annotation(DRIVER) in placed.annotations


def test_the_decision_line_lists_every_card_and_the_choice() -> None:
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
