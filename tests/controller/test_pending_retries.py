"""Pending pods after a release: only the nodes that gained room, one pod per shape that stays pending.

A full cluster with pending pods must not re-plan every pending pod on every node whenever one
card is freed (hack/bench_storm.py measures it at 5,000 nodes). These tests drive the controller's
pass (``run_once``) over the in-memory API and record every plan the planner is asked for.
"""

from __future__ import annotations

from dra_driver.config.resolve import PLAN_ANNOTATIONS
from dra_driver.kube.api import DEVICE_CLASSES, PODS
from dra_driver.resource.objects import PodView
from tests.controller.fake_cluster import CARD, THREE_NODES, FakeCluster, full_cluster
from tests.controller.harness import DRIVER, NS, claim, device_class, request


def with_pending(pending: list[tuple[str, str, int]]) -> FakeCluster:
    """``full_cluster`` with ``pending`` pods (name, memory, count) pending, their plans forgotten."""
    cluster = full_cluster()
    for name, memory, count in pending:
        cluster.gpu_pod(name, memory, count)
    cluster.run()
    assert cluster.controller.queue.unschedulable == {f"{NS}/{name}" for name, _, _ in pending}
    cluster.planned()
    return cluster


def test_after_a_release_pending_pods_are_planned_on_that_node_only_and_the_oldest_fitting_wins() -> None:
    cluster = with_pending([("two-cards", "10Gi", 2), ("small", "10Gi", 1), ("later", "10Gi", 1)])
    freed = cluster.node_of("hold-node-1")
    cluster.release("hold-node-1")
    cluster.run()
    assert not cluster.gated("small") and not cluster.gated("later"), "both fit the freed card, oldest first"
    assert cluster.node_of("small") == freed == cluster.node_of("later")
    assert cluster.gated("two-cards")
    plans = cluster.planned()
    assert plans and all(nodes <= {freed} for _, nodes in plans), plans
    # Still pending, with the explanation of its last full evaluation (not rewritten).
    assert cluster.controller.queue.unschedulable == {f"{NS}/two-cards"}


def test_pods_of_one_shape_are_skipped_once_the_oldest_of_them_stays_pending() -> None:
    pending = [(f"pair-{index}", "10Gi", 2) for index in range(5)]  # two cards: no node has two
    cluster = with_pending(pending)
    cluster.release("hold-node-0")
    cluster.run()
    names = [name for name, _ in cluster.planned()]
    assert names == ["pair-0"], names
    assert cluster.controller.metrics.pending_skipped._value.get() == 4
    assert all(cluster.gated(name) for name, _, _ in pending)
    assert cluster.controller.queue.unschedulable == {f"{NS}/{name}" for name, _, _ in pending}


def test_a_change_to_the_pods_class_plans_it_everywhere() -> None:
    cluster = with_pending([("waiting", "90Gi", 1)])
    changed = device_class(DRIVER)
    changed["metadata"]["labels"] = {"changed": "yes"}
    cluster.add(DEVICE_CLASSES, changed)
    cluster.run()
    assert cluster.planned() == [("waiting", frozenset(cluster.nodes))]


def test_a_class_no_pending_pod_uses_plans_nothing() -> None:
    cluster = with_pending([("waiting", "90Gi", 1)])
    cluster.add(DEVICE_CLASSES, {**device_class(DRIVER), "metadata": {"name": "another"}})
    cluster.run()
    assert cluster.planned() == []


def test_a_pod_pending_for_its_quota_is_planned_everywhere_after_a_release() -> None:
    cluster = FakeCluster(THREE_NODES, record_plans=True)
    for name in ("hold-a", "hold-b"):
        cluster.gpu_pod(name, CARD)
        cluster.run()
    held = {cluster.node_of("hold-a"), cluster.node_of("hold-b")}
    cluster.quota(NS, "163118Mi")  # exactly the two held cards
    cluster.gpu_pod("over", "10Gi")
    cluster.run()
    assert cluster.reason("over") == "GpuQuotaExceeded"
    cluster.planned()
    cluster.release("hold-a")  # capacity freed on one node, and quota freed for every node
    cluster.run()
    assert not cluster.gated("over")
    assert cluster.planned()[0] == ("over", frozenset(cluster.nodes)), (
        "planned everywhere, not only on " + str(held)
    )


def test_the_periodic_resync_plans_one_pending_pod_per_shape_everywhere() -> None:
    pending = [(f"pair-{index}", "10Gi", 2) for index in range(4)] + [("other", "20Gi", 2)]
    cluster = with_pending(pending)
    cluster.controller.resync_seconds = 0  # every pass is a resync pass
    cluster.controller.run_once()
    assert sorted(cluster.planned()) == [
        ("other", frozenset(cluster.nodes)),
        ("pair-0", frozenset(cluster.nodes)),
    ]
    assert cluster.controller.queue.unschedulable == {f"{NS}/{name}" for name, _, _ in pending}


def test_every_annotation_the_planner_reads_makes_a_shape_of_its_own() -> None:
    """A pod limited to A100s staying pending says nothing about an identical pod without the limit."""
    cluster = FakeCluster()
    allocator = cluster.controller.allocator
    cluster.pod("plain", claim("plain", request(memory="1Gi")))
    cluster.controller._drain()  # into the caches, not planned
    shapes = {allocator.pending_shape(PodView.parse(cluster.kube.stored(PODS, NS, "plain")))}
    for index, annotation in enumerate(PLAN_ANNOTATIONS):
        name = f"annotated-{index}"
        body = claim(name, request(memory="1Gi"))
        cluster.pod(name, body, annotations={annotation: "A100"})
        cluster.controller._drain()
        shapes.add(allocator.pending_shape(PodView.parse(cluster.kube.stored(PODS, NS, name))))
    assert len(shapes) == len(PLAN_ANNOTATIONS) + 1 and None not in shapes
