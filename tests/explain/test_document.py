"""What ``explain`` prints and its ``-o json`` document, whole, for a pending and a placed pod."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.decision_record import CardRecord, RequestRecord
from dra_driver.explain.events import PodEvent
from dra_driver.explain.render import render
from dra_driver.explain.report import ClaimLine, Explanation
from dra_driver.kube.api import NODES, PODS, RESOURCE_CLAIMS
from tests.api_objects import allocated_claim
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS, pod
from tests.explain.test_one_decision import explained

QUOTA = "GpuQuotaExceeded: default/team memory: used 8Gi + requested 8Gi > hard 10Gi"
CONFIG = (
    "policy=spread(default) nodePolicy=binpack(default) weights=slot=1,core=1,memory=1(default) "
    "numaBind=false(default)"
)


def refused_by_the_quota() -> FakeCluster:
    """``first`` placed on node-1/gpu-0; ``second`` refused by the namespace's quota; node-2 tainted."""
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=2)
    cluster.quota(NS, "10Gi")
    cluster.gpu_pod("first", "8Gi")
    cluster.run()

    def taint(node: dict[str, Any]) -> None:
        node["spec"] = {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}

    cluster.change(NODES, None, "node-2", taint)
    cluster.gpu_pod("second", "8Gi")
    cluster.run()
    return cluster


def test_a_pending_pods_document_and_text() -> None:
    explanation = explained(refused_by_the_quota(), "second")
    document = explanation.to_json()
    assert document == {
        "pod": "default/second",
        "state": "pending",
        "priority": 0,
        "claims": [{"podClaim": "gpu", "claim": "second", "devices": []}],
        "decidedAt": None,
        "requests": [record.to_json() for record in explanation.requests],
        "pending": {"reason": "GpuQuotaExceeded", "message": QUOTA},
        "reasonsNow": [],
        "now": {"reason": "GpuQuotaExceeded", "message": QUOTA},
        "nodesRefused": [{"node": "node-2", "reason": "TaintToleration"}],
        "note": "",
        "events": [],
        "preemption": {
            "nominated": None,
            "wouldEvict": None,
            "whyNot": "it preempts nothing: it waits for GpuQuotaExceeded, not for capacity",
        },
    }
    (request,) = document["requests"]
    assert request["node"] == "node-1" and request["devices"] == ["gpu-1"]
    assert [card["device"] for card in request["cards"]] == ["node-1/gpu-1", "node-1/gpu-0"]
    score = request["cards"][1]["score"]
    assert render(explanation).splitlines() == [
        "Pod default/second: pending",
        "  claim gpu -> second: -",
        f"  pending: {QUOTA}",  # the quota's message starts with its reason: said once
        f"  now: {QUOTA}",
        "  nodes the pod cannot run on: 1 TaintToleration (node-2)",
        "  preemption: it preempts nothing: it waits for GpuQuotaExceeded, not for capacity",
        "  evaluated now against the cluster (the controller re-plans it the same way)",
        "  claim default/second request gpu",
        f"    config: {CONFIG}",
        "    chosen: node-1/gpu-1",
        "    CARD                                  SCORE  RESULT",
        "    node-1/gpu-1                         0.0000  chosen",
        f"    node-1/gpu-0                     {score:>10.4f}  eligible",
    ]
    assert render(explanation, wide=True).splitlines()[-3:] == [
        "    CARD                                  SCORE  RESULT    FIX",
        "    node-1/gpu-1                         0.0000  chosen    -",
        f"    node-1/gpu-0                     {score:>10.4f}  eligible  -",
    ]


def test_a_pending_pods_priority_is_named_where_one_was_set() -> None:
    cluster = refused_by_the_quota()
    cluster.gpu_pod("urgent", "8Gi", priority=1000)
    cluster.run()
    explanation = explained(cluster, "urgent")
    assert explanation.state == "pending" and explanation.to_json()["priority"] == 1000
    assert render(explanation).splitlines()[0] == "Pod default/urgent: pending (priority 1000)"


def test_a_placed_pods_text_names_its_devices_and_when_it_was_decided() -> None:
    explanation = explained(refused_by_the_quota(), "first")
    assert explanation.state == "allocated" and explanation.decided_at
    document = explanation.to_json()
    assert document["claims"] == [{"podClaim": "gpu", "claim": "first", "devices": ["node-1/gpu-0"]}]
    assert document["decidedAt"] == explanation.decided_at and document["pending"] is None
    assert document["now"] is None and document["nodesRefused"] == []
    assert document["note"] == ""  # its record explains it: nothing to add
    lines = render(explanation).splitlines()
    assert lines[:3] == [
        "Pod default/first: allocated",
        "  claim gpu -> first: node-1/gpu-0",
        f"  decided at {explanation.decided_at} (scores as the controller saw them then)",
    ]
    assert "    chosen: node-1/gpu-0" in lines and not any(line.startswith("  now:") for line in lines)


def test_the_text_of_a_pod_whose_claim_is_not_created_and_many_refused_nodes() -> None:
    nodes = {f"node-{i:02d}": "TaintToleration" for i in range(10)} | {"odd": "InsufficientCPU"}
    explanation = Explanation(
        "default/p", "waiting", [ClaimLine("gpu", None)], note="a claim of the pod does not exist yet"
    )
    explanation.nodes_refused = nodes
    assert render(explanation).splitlines() == [
        "Pod default/p: waiting",
        "  claim gpu -> (not created yet): -",
        "  nodes the pod cannot run on: 10 TaintToleration (node-00, node-01, node-02, node-03, node-04, "
        "node-05, node-06, node-07, ...); 1 InsufficientCPU (odd)",
        "  note: a claim of the pod does not exist yet",
    ]
    explanation.reasons = {"CardInsufficientMemory": 1, "NumaNotFit": 3}
    assert [(reason, cards) for reason, cards, _ in explanation.fixes()] == [
        ("NumaNotFit", 3),
        ("CardInsufficientMemory", 1),
    ]
    assert explanation.to_json()["reasonsNow"][0] == {
        "reason": "NumaNotFit",
        "cards": 3,
        "fix": "enough free cards on one NUMA node, or numaBind off",
    }
    explanation.reasons = {"SomethingNew": 2}
    assert explanation.fixes() == [("SomethingNew", 2, "")]


def test_a_pod_placed_without_a_record_is_allocated_or_not_ours() -> None:
    cluster = FakeCluster(gpus=2)
    ours = allocated_claim(NS, "ours", "node-1", [(1, None, 0)])
    theirs = allocated_claim(NS, "theirs", "node-1", [(0, None, 0)], klass="other")
    for claim_body in (ours, theirs):
        for result in claim_body["status"]["allocation"]["devices"]["results"]:
            result["driver"] = DRIVER if claim_body is ours else "gpu.example.com"
        cluster.add(RESOURCE_CLAIMS, claim_body)
        name = claim_body["metadata"]["name"]
        cluster.add(PODS, pod(name, {"gpu": f"claim:{name}"}, gated=False))
    mine = explained(cluster, "ours")
    assert (mine.state, [line.devices for line in mine.claims]) == ("allocated", [("node-1/gpu-1",)])
    assert mine.note == "no decision record: placed by another scheduler or an older controller"
    other = explained(cluster, "theirs")
    assert (other.state, [line.devices for line in other.claims]) == ("not ours", [()])


def test_a_request_that_fits_nowhere_and_its_fixes_in_the_wide_text() -> None:
    explanation = Explanation("default/p", "pending", [ClaimLine("gpu", "p", ("a/gpu-0", "a/gpu-1"))])
    cards = (
        CardRecord("a/gpu-0", 1.5, False, "CardInsufficientMemory"),
        CardRecord("a/gpu-1", 0.25, False, "SomethingNew"),
    )
    explanation.requests = [
        RequestRecord("claim default/p request gpu", "policy=x", None, (), cards, omitted=3)
    ]
    explanation.reasons = {"CardInsufficientMemory": 1, "SomethingNew": 1}
    memory_fix = "less memory requested, or tenants free memory on the card"
    assert render(explanation, wide=True).splitlines() == [
        "Pod default/p: pending",
        "  claim gpu -> p: a/gpu-0, a/gpu-1",
        "  evaluated now against the cluster (the controller re-plans it the same way)",
        "  claim default/p request gpu",
        "    config: policy=x",
        "    chosen: none",
        "    CARD                                  SCORE  RESULT                  FIX",
        f"    a/gpu-0                              1.5000  CardInsufficientMemory  {memory_fix}",
        "    a/gpu-1                              0.2500  SomethingNew            -",
        "    ... 3 more cards",
        "  what would make it fit:",
        f"    1 card(s) CardInsufficientMemory: {memory_fix}",
        "    1 card(s) SomethingNew: -",
    ]
    eight = {f"n{i}": "TaintToleration" for i in range(8)}
    explanation.nodes_refused = eight
    assert (
        "  nodes the pod cannot run on: 8 TaintToleration (n0, n1, n2, n3, n4, n5, n6, n7)"
        in render(explanation).splitlines()
    )


def test_the_pods_warnings_are_listed_newest_last_with_their_count_and_source() -> None:
    explanation = Explanation("default/p", "allocated", [ClaimLine("gpu", "p", ("a/gpu-0",))])
    explanation.events = [
        PodEvent("Failed", "once", "", 1, "2026-12-06T10:00:00Z", ""),
        PodEvent("BackOff", "again", "kubelet", 2, "2026-12-06T10:00:09Z", "look at the container's log"),
    ]
    assert render(explanation).splitlines()[2:] == [
        "  warnings on the pod (newest last):",
        "    2026-12-06T10:00:00Z Failed (-): once",
        "    2026-12-06T10:00:09Z BackOff x2 (kubelet): again",
        "      what to do: look at the container's log",
    ]
