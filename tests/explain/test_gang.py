"""``explain`` shows a gang member's gang as the controller plans it: members placeable now and
members needed (issue 38 item 4); what it says the controller would report is what it reports."""

from __future__ import annotations

import copy

from dra_driver.controller.gang_refs import COSCHEDULING_POD_GROUPS, event_kind
from dra_driver.controller.nomination import Nomination, nomination_annotation
from dra_driver.explain.render import render
from dra_driver.explain.report import Explanation, explain
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS
from tests.controller.test_gang_preemption import share_gang
from tests.controller.test_gangs import cluster_of, gang, pod_group
from tests.controller.test_preemption_flow import busy_card, evicted
from tests.explain.listed import listed, stored


def explained(cluster: FakeCluster, name: str) -> Explanation:
    body = cluster.kube.stored(PODS, NS, name)
    claims = {c["metadata"]["name"]: c for c in stored(cluster, RESOURCE_CLAIMS.plural)}
    objects = listed(cluster)
    kind = event_kind(COSCHEDULING_POD_GROUPS)
    objects.groups = [(kind, copy.deepcopy(obj)) for obj in stored(cluster, COSCHEDULING_POD_GROUPS.plural)]
    return explain(body, claims=claims, cluster=objects, driver=DRIVER)


def test_a_member_of_a_gang_that_does_not_fit_is_explained_as_the_controller_reports_it() -> None:
    cluster, _ = cluster_of(("node-0",), 3, timeout=0.0)
    pod_group(cluster, "a", 4)
    names = gang(cluster, "a", 4)
    before = explained(cluster, "a-0")
    assert before.gang is not None and not before.gang.ready
    assert (before.gang.placeable, before.gang.members, before.gang.needed) == (3, 4, 4)
    text = render(before)
    assert "gang: 3 of 4 members placeable now, needs 4: waits" in text
    # It fits alone (a card is free for it): only its gang holds it back.
    assert before.note == "it fits alone, but its gang is placed all together or not at all"
    cluster.run()  # timeout 0: the members report at once
    condition = cluster.condition("a-0")
    assert condition is not None and before.now == (condition["reason"], condition["message"])
    assert all(cluster.gated(name) for name in names)
    assert before.to_json()["gang"] == {
        "group": "pod group default/a (label scheduling.x-k8s.io/pod-group)",
        "placeableNow": 3,
        "members": 4,
        "needed": 4,
        "ready": False,
        "summary": condition["message"],  # the controller's own line about the gang
    }


def test_a_member_of_a_gang_that_fits_is_placeable_with_it() -> None:
    cluster, _ = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 4)
    gang(cluster, "a", 4)
    now = explained(cluster, "a-3")
    assert now.gang is not None and now.gang.ready and now.now is None
    assert "gang: 4 of 4 members placeable now, needs 4: can be placed now" in render(now)


def test_a_pod_without_a_gang_has_no_gang_line() -> None:
    cluster, _ = cluster_of(("node-0",), 1)
    cluster.gpu_pod("solo", "1Gi")
    alone = explained(cluster, "solo")
    assert alone.gang is None and "gang:" not in render(alone) and "gang" not in alone.to_json()


def test_a_waiting_gang_member_shows_the_victims_preemption_would_evict_for_the_whole_gang() -> None:
    cluster = busy_card()  # old 40Gi and young 39Gi, priority 1
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    before = explained(cluster, members[1])
    preemption = before.preemption
    assert (
        preemption is not None
        and preemption.gang == "pod group default/train (label scheduling.x-k8s.io/pod-group)"
    )
    assert [(v.pod, v.priority, v.node) for v in preemption.victims] == [(f"{NS}/young", 1, "node-1")]
    text = render(before)
    assert "preemption for its whole pod group default/train" in text
    assert "would evict default/young (priority 1) on node-1" in text
    document = before.to_json()["preemption"]
    assert document["forGang"].startswith("pod group default/train")
    assert document["wouldEvict"]["victims"] == [{"pod": f"{NS}/young", "priority": 1, "node": "node-1"}]
    cluster.run()  # the controller evicts what explain named
    assert evicted(cluster) == ["young"]
    after = explained(cluster, members[1])
    assert after.preemption is not None
    nomination = Nomination.decode(
        cluster.kube.stored(PODS, NS, members[1])["metadata"]["annotations"][nomination_annotation(DRIVER)],
        DRIVER,
    )
    # The capacity held for the gang is its own to take: it waits for young, nothing more to evict.
    assert after.to_json()["preemption"] == {
        "nominated": {"node": "node-1", "victims": [f"{NS}/young"], "at": nomination.at},
        "wouldEvict": {"node": "node-1", "victims": [], "waitingFor": [f"{NS}/young"]},
        "whyNot": None,
        "forGang": "pod group default/train (label scheduling.x-k8s.io/pod-group)",
    }
    assert nomination.at and "waits for default/young to terminate" in render(after)


def test_a_gang_of_equal_priority_would_preempt_nothing_and_says_why() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "peers", 2, "15Gi", priority=1)
    preemption = explained(cluster, members[0]).preemption
    assert preemption is not None and not preemption.victims
    assert preemption.why_not == (
        "no nodes where evicting pods of lower priority would make room for the whole gang "
        "(pods of equal or higher priority are never evicted)"
    )


def test_a_gang_with_a_member_that_may_not_preempt_preempts_nothing() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "polite", 2, "15Gi", priority=1000, never=True)
    preemption = explained(cluster, members[1]).preemption
    assert preemption is not None and preemption.node is None and not preemption.victims
    assert (
        preemption.why_not == "the gang preempts nothing: member default/polite-0's preemptionPolicy is Never"
    )
    cluster.run()
    assert evicted(cluster) == []  # nor does the controller


def test_a_waiting_gang_takes_the_capacity_held_for_a_pod_of_lower_priority() -> None:
    """``mid`` (priority 500) had young evicted and holds its room; the gang (1000) may take that
    room: it waits for young like ``mid`` does, and has nobody more evicted."""
    cluster = busy_card()
    cluster.gpu_pod("mid", "39Gi", priority=500)
    cluster.run()
    assert evicted(cluster) == ["young"]
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    preemption = explained(cluster, members[0]).preemption
    assert preemption is not None and preemption.node == "node-1"
    assert (preemption.victims, preemption.waiting) == ((), (f"{NS}/young",))
    cluster.run()
    assert evicted(cluster) == ["young"]  # the controller evicts nobody more either: old runs on
