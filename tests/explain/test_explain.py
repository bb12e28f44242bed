"""``hami-dra explain``: the recorded decision of a placed pod, the reasons of a pending one."""

from __future__ import annotations

import json
from typing import Any

import yaml

from dra_driver.controller.decision_record import decision_annotation, decode
from dra_driver.controller.nomination import Nomination, nomination_annotation
from dra_driver.explain.render import render
from dra_driver.explain.report import FIXES, explain
from dra_driver.output import render_document
from tests.controller.fake_cluster import PODS, RESOURCE_CLAIMS, FakeCluster
from tests.controller.harness import DRIVER, NS, claim, request
from tests.explain.listed import listed, stored


def explained(cluster: FakeCluster, name: str) -> Any:
    """``explain`` of pod ``name`` on what the controller's informers hold (``listed``)."""
    pod = cluster.kube.stored(PODS, NS, name)
    claims = {c["metadata"]["name"]: c for c in stored(cluster, RESOURCE_CLAIMS.plural)}
    return explain(pod, claims=claims, cluster=listed(cluster), driver=DRIVER)


def test_a_placed_pod_is_explained_by_the_decision_recorded_when_it_was_placed() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.pod("first", claim("x", request(memory="10Gi")))
    cluster.run()
    pod = cluster.kube.stored(PODS, NS, "first")
    decided_at, records = decode(pod["metadata"]["annotations"][decision_annotation(DRIVER)])
    assert decided_at and len(records) == 1 and records[0].node == "node-1"
    (record,) = records
    assert [card.chosen for card in record.cards].count(True) == 1 and len(record.cards) == 2
    assert record.config.startswith("policy=")
    # Later tenants change the scores; the explanation keeps those the controller saw.
    cluster.pod("second", claim("y", request(memory="10Gi")))
    cluster.run()
    explanation = explained(cluster, "first")
    assert explanation.state == "allocated" and explanation.requests == records
    text = render(explanation)
    assert f"decided at {decided_at}" in text and "chosen" in text
    assert json.loads(json.dumps(explanation.to_json()))["state"] == "allocated"
    events = [e for (kind, _, _), e in cluster.kube.objects.items() if kind == "events"]
    allocated = [
        e for e in events if e.get("reason") == "Allocated" and e["involvedObject"]["name"] == "first"
    ]
    assert allocated and allocated[0]["type"] == "Normal" and "node-1/gpu-" in allocated[0]["message"]


def test_a_pending_pod_gets_the_reasons_now_and_what_would_make_it_fit() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.pod("big", claim("x", request(memory="70Gi")))
    cluster.pod("more", claim("y", request(memory="70Gi")))
    cluster.run()
    explanation = explained(cluster, "more")
    assert explanation.state == "pending" and explanation.pending is not None
    assert explanation.reasons == {"CardInsufficientMemory": 1}
    text = render(explanation)
    assert "1 card(s) CardInsufficientMemory: less memory requested" in text
    assert "evaluated now" in text


def test_wide_adds_the_fix_for_each_cards_reason() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.pod("big", claim("x", request(memory="70Gi")))
    cluster.pod("more", claim("y", request(memory="70Gi")))
    cluster.run()
    explanation = explained(cluster, "more")
    table = render(explanation)
    wide = render(explanation, wide=True)
    assert "FIX" not in table
    (card,) = [line for line in wide.splitlines() if line.strip().startswith("node-1/gpu-0")]
    assert card.endswith(FIXES["CardInsufficientMemory"])
    header = next(line for line in wide.splitlines() if "CARD" in line)
    assert header.split() == ["CARD", "SCORE", "RESULT", "FIX"]
    assert header.index("FIX") == card.index(FIXES["CardInsufficientMemory"])


def test_yaml_is_the_json_document() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.pod("first", claim("x", request(memory="10Gi")))
    cluster.run()
    document = explained(cluster, "first").to_json()
    assert yaml.safe_load(render_document(document, "yaml")) == json.loads(render_document(document, "json"))


def test_a_pending_pod_is_told_whom_preemption_would_evict_then_whom_it_evicted() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.controller.preemptor.enabled = False
    for name, memory in (("old", "40Gi"), ("young", "39Gi")):
        cluster.gpu_pod(name, memory, priority=1)
        cluster.run()
        cluster.bind(name)
    # 39Gi: only all young frees makes room, so its own hold, once nominated, must not count.
    cluster.gpu_pod("urgent", "39Gi", priority=1000)
    cluster.run()
    before = explained(cluster, "urgent")
    assert before.preemption is not None and before.preemption.nominated_node is None
    text = render(before)
    assert "preemption: would evict default/young (priority 1) on node node-1" in text
    assert before.to_json()["preemption"]["wouldEvict"]["victims"] == [
        {"pod": "default/young", "priority": 1}
    ]
    cluster.controller.preemptor.enabled = True
    cluster.controller.queue.resync()  # planned in full again: now it preempts
    cluster.run()
    after = explained(cluster, "urgent")
    text = render(after)
    assert "nominated to node node-1 at " in text and "evicted default/young;" in text
    assert "preemption: waits on node node-1 for default/young to terminate" in text
    annotation = cluster.kube.stored(PODS, NS, "urgent")["metadata"]["annotations"]
    at = Nomination.decode(annotation[nomination_annotation(DRIVER)], DRIVER).at
    assert at and after.to_json()["preemption"] == {
        "nominated": {"node": "node-1", "victims": ["default/young"], "at": at},
        "wouldEvict": {"node": "node-1", "victims": [], "waitingFor": ["default/young"]},
        "whyNot": None,
    }


def test_a_pod_that_may_not_preempt_is_told_why() -> None:
    cluster = FakeCluster(gpus=1)
    cluster.gpu_pod("low", "70Gi", priority=1)
    cluster.run()
    cluster.gpu_pod("polite", "70Gi", priority=1000)
    cluster.change(PODS, NS, "polite", lambda pod: pod["spec"].update(preemptionPolicy="Never"))
    cluster.run()
    assert "preemption: it preempts nothing: its preemptionPolicy is Never" in render(
        explained(cluster, "polite")
    )
    cluster.gpu_pod("peer", "70Gi", priority=1)
    cluster.run()
    assert (
        "  preemption: no node where evicting pods of lower priority would make room for it "
        "(pods of equal or higher priority are never evicted)"
    ) in render(explained(cluster, "peer")).splitlines()
