"""Priority order end to end (issue 38): the controller's passes over the in-memory API place the
pending pods by priority (``spec.priority``, higher first), then by arrival, namespaces in turn
only within one priority. The queue's own rules are in test_pod_queue.py."""

from __future__ import annotations

from dra_driver.kube.api import RESOURCE_CLAIMS
from tests.controller.fake_cluster import CARD, FakeCluster

#: Three pods, each wanting the one card whole, oldest first: (name, namespace, priority).
PODS = (("low", "team-a", None), ("mid", "team-b", 100), ("high", "team-a", 1000))


def one_card_at_a_time(priorities: bool) -> list[str]:
    """``PODS`` on one node of one card (without their priorities unless ``priorities``): the pods
    in the order they were placed, each one's claim released once it is placed."""
    cluster = FakeCluster(("node-1",), record_plans=True)
    namespaces = {}
    for name, namespace, priority in PODS:
        cluster.gpu_pod(name, CARD, namespace=namespace, priority=priority if priorities else None)
        namespaces[name] = namespace
    order: list[str] = []
    for _ in PODS:
        cluster.run()
        placed = [name for name, namespace in namespaces.items() if not cluster.gated(name, namespace)]
        assert len(placed) == 1, f"one card, one pod at a time: {placed}"
        (name,) = placed
        order.append(name)
        assert [cluster.reason(other, namespaces[other]) for other in namespaces if other != name] == [
            "Unschedulable"
        ] * (len(namespaces) - 1)
        cluster.remove(RESOURCE_CLAIMS, name, namespaces.pop(name))  # it ran and finished
    return order


def test_pending_pods_are_placed_in_priority_order_across_namespaces_one_card_at_a_time() -> None:
    assert one_card_at_a_time(priorities=True) == ["high", "mid", "low"]


def test_without_priorities_the_same_pods_are_placed_oldest_first() -> None:
    """The control: the order above is the priorities', not the pods' ages or namespaces."""
    assert one_card_at_a_time(priorities=False) == ["low", "mid", "high"]


def test_a_higher_pod_that_arrives_while_lower_ones_wait_takes_the_next_free_card() -> None:
    cluster = FakeCluster(("node-1",), record_plans=True)
    cluster.gpu_pod("hold", CARD)
    cluster.run()
    for name, namespace, priority in PODS[:2]:
        cluster.gpu_pod(name, CARD, namespace=namespace, priority=priority)
    cluster.run()
    assert cluster.gated("low", "team-a") and cluster.gated("mid", "team-b")
    cluster.gpu_pod("urgent", CARD, namespace="team-a", priority=500)  # the youngest, low's namespace
    cluster.planned()
    cluster.remove(RESOURCE_CLAIMS, "hold", "default")
    cluster.controller.run_once()  # the release and the new pod in one pass
    assert not cluster.gated("urgent", "team-a")
    assert cluster.gated("mid", "team-b") and cluster.gated("low", "team-a")
    assert [name for name, _ in cluster.planned()] == ["urgent", "mid", "low"]
