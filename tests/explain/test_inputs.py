"""``explain`` on what a command actually reads: lists that lag behind the pod and its claims, claims
that do not exist, the controller's default policy, and pods in the states the controller treats
apart (ungated but still ours, being deleted, claims allocated already)."""

from __future__ import annotations

from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.contract import ALLOCATED_CONDITION
from dra_driver.explain.render import render
from dra_driver.explain.report import Explanation, explain
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from tests.api_objects import allocated_claim
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.explain.listed import listed, stored


def read_by_name(cluster: FakeCluster, name: str, **kwargs: Any) -> Explanation:
    """``explain`` as the command calls it: the pod and its own claims read by name (here: the claim
    named like the pod, where it exists), the rest as listed."""
    body = cluster.kube.stored(PODS, NS, name)
    own = {
        c["metadata"]["name"]: c
        for c in stored(cluster, RESOURCE_CLAIMS.plural)
        if c["metadata"]["name"] == name
    }
    return explain(
        body, claims=own, cluster=kwargs.pop("objects", None) or listed(cluster), driver=DRIVER, **kwargs
    )


def test_a_pod_newer_than_the_lists_is_explained_with_its_claim_read_by_name() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.gpu_pod("big", "70Gi")
    cluster.run()
    before = listed(cluster)  # the informers' lists, before the next pod and its claim exist
    cluster.gpu_pod("late", "70Gi")
    explanation = read_by_name(cluster, "late", objects=before)
    # Planned as the controller would: the card is taken by ``big`` (listed), ``late`` and its
    # claim (read by name) are in the plan although no list has them.
    assert explanation.state == "pending"
    assert explanation.reasons == {"CardInsufficientMemory": 1}
    assert explanation.claims[0].claim == "late"


def test_the_claim_read_by_name_replaces_its_listed_version() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.gpu_pod("first", "8Gi")
    cluster.run()
    objects = listed(cluster)
    cluster.gpu_pod("second", "72Gi")
    stale = claim("second", request(memory="8Gi"))  # an older version: less memory
    stale["metadata"]["namespace"] = NS
    objects.claims.append(stale)
    explanation = read_by_name(cluster, "second", objects=objects)
    (record,) = explanation.requests
    # 72Gi fit only on the empty card: the request read by name was planned, not the listed one.
    assert (explanation.state, record.node, record.devices) == ("pending", "node-1", ("gpu-1",))
    assert explanation.reasons == {"CardInsufficientMemory": 1}


def test_a_pod_whose_claim_does_not_exist_waits_for_it_by_name() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.add(PODS, pod("p", {"gpu": "claim:absent"}))
    waiting = read_by_name(cluster, "p")
    assert (waiting.state, waiting.note) == ("waiting", "its claim absent does not exist yet")
    assert render(waiting).splitlines() == [
        "Pod default/p: waiting",
        "  claim gpu -> absent: -",
        "  note: its claim absent does not exist yet",
    ]


def test_a_pod_whose_template_claim_is_not_created_yet_waits_for_it() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.add(PODS, pod("t", {"gpu": "template:gpu-template"}))
    waiting = read_by_name(cluster, "t")
    assert waiting.state == "waiting"
    assert waiting.note == "the claim of its gpu (from a template) is not created yet"
    assert waiting.to_json()["claims"] == [{"podClaim": "gpu", "claim": None, "devices": []}]


def test_explain_plans_with_the_controllers_default_policy() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.gpu_pod("first", "8Gi")
    cluster.run()
    cluster.gpu_pod("second", "8Gi")  # not planned yet: explain plans it now
    spread = read_by_name(cluster, "second")
    binpack = read_by_name(cluster, "second", defaults=ControllerDefaults(policy="binpack"))
    placed_on = {
        name: (explanation.requests[0].config.split()[0], explanation.requests[0].devices)
        for name, explanation in (("spread", spread), ("binpack", binpack))
    }
    # ``first`` took gpu-0: spread keeps away from it, binpack fills it.
    assert placed_on == {
        "spread": ("policy=spread(default)", ("gpu-1",)),
        "binpack": ("policy=binpack(default)", ("gpu-0",)),
    }


def test_an_ungated_pod_with_an_unallocated_claim_of_ours_is_still_the_controllers() -> None:
    """Created while the webhook was down (no gate), with a claim of our class: the controller
    places it all the same (``Allocator.is_candidate``); explain says so, and it does."""
    cluster = FakeCluster(gpus=1)
    body = claim("late", request(memory="8Gi"))
    body["metadata"]["namespace"] = NS
    cluster.add(RESOURCE_CLAIMS, body)
    cluster.add(PODS, pod("late", {"gpu": "claim:late"}, gated=False))
    explanation = read_by_name(cluster, "late")
    assert explanation.state == "pending"
    assert explanation.note == "it fits now: the controller places it at its next pass"
    cluster.run()
    assert cluster.node_of("late") == "node-1"


def test_a_gated_pod_being_deleted_is_not_planned() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.gpu_pod("going", "8Gi")
    cluster.change(
        PODS, NS, "going", lambda p: p["metadata"].update(deletionTimestamp="2026-12-06T10:00:00Z")
    )
    explanation = read_by_name(cluster, "going")
    assert explanation.state == "pending" and explanation.requests == []
    assert explanation.note == "not the controller's to place now (bound, ended, or being deleted)"


def test_a_gated_pod_whose_claim_is_allocated_already_waits_for_something_else() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.add(RESOURCE_CLAIMS, allocated_claim(NS, "held", "node-1", [(0, None, 0)]))
    cluster.add(PODS, pod("held", {"gpu": "claim:held"}))
    explanation = read_by_name(cluster, "held")
    assert explanation.claims[0].devices == ("node-1/gpu-0",)
    assert explanation.note == "no unallocated claim of ours: the pod waits for something else"


def test_a_condition_without_reason_or_message_reads_as_empty() -> None:
    """Our condition ``False`` as a partial writer left it: the pending line has nothing made up."""
    cluster = FakeCluster(gpus=1)
    cluster.gpu_pod("bare", "8Gi")
    condition = {"type": ALLOCATED_CONDITION, "status": "False"}

    def bare(body: dict[str, Any]) -> None:
        body["status"] = {"conditions": [condition]}

    cluster.change(PODS, NS, "bare", bare)
    explanation = read_by_name(cluster, "bare")
    assert explanation.pending == ("", "")
    assert explanation.to_json()["pending"] == {"reason": "", "message": ""}
