"""Fair pending work (issue 27): an event replans only the pending pods it can help, a bounded
batch per pass, namespaces in turn, so one tenant's backlog cannot hold up another tenant.

Like test_pending_retries.py, these drive the controller's pass (``run_once``) over the in-memory
API and record every plan the planner is asked for: (pod name, candidate nodes).
"""

from __future__ import annotations

from typing import Any

from dra_driver.controller.retries import PendingRetries, Turns, fair_order
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import DEVICE_CLASSES, GPU_QUOTAS, NODES, PODS, Obj
from dra_driver.kube.watch import object_key
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.fake_cluster import CARD, THREE_NODES, FakeCluster, full_cluster
from tests.controller.harness import DRIVER, NS, device_class

WEIGHTS = "hami.io/device-scoring-weights"  # read by the planner: pods differing in it differ in shape


def three_free_nodes() -> FakeCluster:
    """``THREE_NODES``, nothing placed; every plan recorded."""
    return FakeCluster(THREE_NODES, record_plans=True)


def labelled(labels: dict[str, str]) -> Any:
    """An edit giving a node these labels."""

    def edit(node: Obj) -> None:
        node["metadata"]["labels"] = labels

    return edit


def distinct(index: int) -> dict[str, str]:
    """A scoring-weights annotation of its own: no two such pods share a pending shape."""
    return {WEIGHTS: f"slot=1,core=1,memory={index + 1}"}


# --- the queue's order ---------------------------------------------------------------------------
def test_the_queue_takes_namespaces_in_turn_each_oldest_first_and_resumes_after_the_last_served() -> None:
    created = {"a/old": "1", "a/mid": "2", "a/new": "3", "b/only": "9", "c/second": "5", "c/first": "4"}
    queue = PendingRetries()
    queue.add((key, None) for key in ("a/new", "b/only", "a/old", "c/second", "a/mid", "c/first"))
    assert queue.order(created.__getitem__) == ["a/old", "b/only", "c/first", "a/mid", "c/second", "a/new"]
    queue.ended_with("b/only")
    assert queue.order(created.__getitem__) == ["c/first", "a/old", "b/only", "c/second", "a/mid", "a/new"]


def test_the_next_batch_starts_after_the_namespace_not_after_the_pod_key() -> None:
    """Namespace ``a-b`` sorts between ``a`` and any ``a/...`` key: the turn is the namespace's."""
    created = {"a/1": "1", "a/2": "2", "a-b/1": "3"}.__getitem__
    queue = PendingRetries()
    queue.add((key, None) for key in ("a/1", "a/2", "a-b/1"))
    queue.ended_with("a/1")
    assert queue.order(created) == ["a-b/1", "a/1", "a/2"]


def test_a_pod_queued_again_waits_behind_the_pods_still_queued_and_keeps_its_place_if_queued() -> None:
    created = {"a/old": "1", "a/young": "2"}.__getitem__
    queue = PendingRetries()
    queue.add([("a/old", None), ("a/young", None)])
    assert queue.order(created) == ["a/old", "a/young"]
    queue.discard("a/old")  # planned
    queue.add([("a/old", None), ("a/young", None)])  # the next change helps both again
    assert queue.order(created) == ["a/young", "a/old"]


def test_the_queue_takes_higher_priorities_first_and_each_level_keeps_its_own_turn() -> None:
    priority = {"a/low": 0, "b/low": 0, "c/low": 0, "a/high": 9, "b/high": 9, "z/mid": 3}.__getitem__
    queue = PendingRetries()
    queue.add((key, None) for key in ("a/low", "b/low", "c/low", "z/mid", "b/high", "a/high"))
    created = {key: "1" for key in ("a/low", "b/low", "c/low", "z/mid", "b/high", "a/high")}.__getitem__
    assert queue.order(created, priority) == ["a/high", "b/high", "z/mid", "a/low", "b/low", "c/low"]
    queue.ended_with("a/low", 0)  # a batch that ended in the low level
    queue.ended_with("b/high", 9)  # ... after one that ended in the high one
    assert queue.order(created, priority) == ["a/high", "b/high", "z/mid", "b/low", "c/low", "a/low"]


def test_a_pass_orders_by_priority_then_namespaces_in_turn_each_level_from_its_own_turn() -> None:
    created = {"a/1": "1", "a/2": "2", "b/1": "3", "b/hi": "9", "c/hi": "8", "c/1": "0"}.__getitem__
    priority = {"b/hi": 5, "c/hi": 5}.get
    keys = ["a/1", "a/2", "b/1", "b/hi", "c/hi", "c/1"]
    turns = Turns()
    assert fair_order(keys, created, turns.after, lambda key: priority(key, 0)) == [
        "b/hi", "c/hi", "a/1", "b/1", "c/1", "a/2"
    ]  # fmt: skip
    turns.served("b/hi", 5)
    turns.served("a/1", 0)
    assert fair_order(keys, created, turns.after, lambda key: priority(key, 0)) == [
        "c/hi", "b/hi", "b/1", "c/1", "a/1", "a/2"
    ]  # fmt: skip
    assert fair_order(keys, created, "a") == ["b/1", "c/1", "a/1", "b/hi", "c/hi", "a/2"]  # one level


def test_queued_nodes_add_up_and_everywhere_absorbs_them() -> None:
    queue = PendingRetries()
    queue.add([("a/pod", frozenset({"n1"}))])
    queue.add([("a/pod", frozenset({"n2"}))])
    assert queue.scope("a/pod") == {"n1", "n2"}
    queue.add([("a/pod", None)])
    queue.add([("a/pod", frozenset({"n3"}))])
    assert queue.scope("a/pod") is None
    queue.discard("a/pod")
    assert "a/pod" not in queue and len(queue) == 0


# --- fairness and the bound ----------------------------------------------------------------------
def test_another_tenants_pod_is_placed_in_the_releases_pass_whatever_one_tenant_has_pending() -> None:
    cluster = full_cluster(pending_batch=8)
    hoard = [f"a-{index}" for index in range(200)]
    for index, name in enumerate(hoard):  # two cards each: no one-card node can ever take them
        cluster.gpu_pod(name, "10Gi", count=2, namespace="tenant-a", annotations=distinct(index))
    cluster.gpu_pod("b", "10Gi", namespace="tenant-b")
    cluster.run()
    assert len(cluster.controller.queue.unschedulable) == 201
    cluster.planned()
    freed = cluster.node_of("hold-node-1")
    cluster.release("hold-node-1")
    cluster.controller.run_once()
    assert not cluster.gated("b", "tenant-b"), "placed in the release's own pass"
    assert cluster.node_of("b", "tenant-b") == freed
    plans = cluster.planned()
    assert len(plans) <= 8, f"{len(plans)} plans in one pass: the batch is 8"
    assert ("b", frozenset({freed})) in plans
    # Nothing dropped: every other pod is planned once more, on the freed node, batch by batch.
    passes = cluster.drain()
    plans += cluster.planned()
    assert sorted(name for name, _ in plans) == sorted(["b", *hoard])
    assert all(nodes == {freed} for _, nodes in plans)
    assert 200 // 8 <= passes <= 200 // 8 + 2
    assert cluster.controller.queue.unschedulable == {f"tenant-a/{name}" for name in hoard}


def test_a_full_retry_is_spread_over_passes_namespaces_in_turn_and_replans_every_pending_pod() -> None:
    cluster = full_cluster(pending_batch=3)
    for index in range(12):
        cluster.gpu_pod(f"a-{index}", "10Gi", count=2, namespace="tenant-a", annotations=distinct(index))
    for index in range(3):
        cluster.gpu_pod(f"b-{index}", "10Gi", count=2, namespace="tenant-b", annotations=distinct(index))
    cluster.run()
    cluster.planned()
    cluster.controller.resync_seconds = 0
    cluster.controller.run_once()  # a resync pass: every pending pod queued, everywhere
    cluster.controller.resync_seconds = 3600
    first = cluster.planned()
    assert sorted(name for name, _ in first) == ["a-0", "a-1", "b-0"]
    assert all(nodes == frozenset(cluster.nodes) for _, nodes in first)
    cluster.drain()
    rest = [name for name, _ in cluster.planned()]
    # The first batch ended with tenant-a: the second one starts with tenant-b.
    assert sorted(rest[:3]) == ["a-2", "b-1", "b-2"]
    assert sorted(rest) == sorted([f"a-{index}" for index in range(2, 12)] + ["b-1", "b-2"])


def test_changes_arriving_every_pass_do_not_keep_the_same_pods_at_the_front() -> None:
    cluster = full_cluster(pending_batch=2)
    names = [f"p-{index}" for index in range(6)]
    for index, name in enumerate(names):
        cluster.gpu_pod(name, "10Gi", count=2, annotations=distinct(index))
    cluster.run()
    cluster.planned()
    for turn in range(3):  # a label written on node-0 before every pass
        cluster.change(NODES, None, "node-0", labelled({"turn": str(turn)}))
        cluster.controller.run_once()
    assert sorted(name for name, _ in cluster.planned()) == names, "each pod once in three passes of two"


def test_pods_of_one_shape_count_once_against_the_batch() -> None:
    cluster = full_cluster(pending_batch=2)
    for index in range(6):  # one Deployment: one shape
        cluster.gpu_pod(f"pair-{index}", "10Gi", count=2)
    cluster.gpu_pod("other", "20Gi", count=2)
    cluster.run()
    cluster.planned()
    cluster.release("hold-node-0")
    cluster.controller.run_once()
    assert [name for name, _ in cluster.planned()] == ["pair-0", "other"]
    assert not cluster.controller.queue.woken, "the shape's other pods were skipped, not left queued"


def test_a_shape_that_stayed_pending_is_skipped_in_later_passes_until_something_changes() -> None:
    cluster = full_cluster(pending_batch=2)
    names = [f"{shape}-{index}" for index in range(3) for shape in ("s", "t", "u")]  # interleaved
    sizes = {"s": "10Gi", "t": "20Gi", "u": "30Gi"}
    for name in names:
        cluster.gpu_pod(name, sizes[name[0]], count=2)
    cluster.run()
    cluster.planned()
    cluster.release("hold-node-0")
    assert cluster.drain() == 2
    assert [name for name, _ in cluster.planned()] == ["s-0", "t-0", "u-0"], "one plan per shape in all"
    assert cluster.controller.queue.unschedulable == {f"{NS}/{name}" for name in names}
    cluster.change(NODES, None, "node-0", labelled({"new": "label"}))  # a change: all again
    cluster.drain()
    assert [name for name, _ in cluster.planned()] == ["s-0", "t-0", "u-0"]


# --- which pods an event replans -----------------------------------------------------------------
def test_a_quota_change_replans_only_the_pods_its_namespace_refused_for_quota() -> None:
    cluster = three_free_nodes()
    for namespace in ("x", "y"):
        cluster.quota(namespace, "5Gi")
        cluster.gpu_pod(f"{namespace}-over", "10Gi", namespace=namespace)
    cluster.gpu_pod("x-huge", "90Gi", namespace="x")  # no card has 90 GiB: pending whatever the quota
    cluster.run()
    assert [cluster.reason(name, ns) for name, ns in (("x-over", "x"), ("y-over", "y"), ("x-huge", "x"))] == [
        "GpuQuotaExceeded", "GpuQuotaExceeded", "Unschedulable"
    ]  # fmt: skip
    cluster.planned()

    def status_only(quota: Obj) -> None:
        quota["status"] = {"used": {"memory": "0"}}

    cluster.change(GPU_QUOTAS, "x", "team", status_only)  # our own status write
    cluster.run()
    assert cluster.planned() == []

    def raise_limit(quota: Obj) -> None:
        quota["spec"]["hard"]["memory"] = "20Gi"

    cluster.change(GPU_QUOTAS, "x", "team", raise_limit)
    cluster.run()
    assert cluster.planned() == [("x-over", frozenset(cluster.nodes))]
    assert not cluster.gated("x-over", "x") and cluster.gated("y-over", "y")


def test_a_release_replans_quota_refused_pods_of_its_own_namespace_only() -> None:
    cluster = three_free_nodes()
    cluster.quota(NS, CARD)
    cluster.quota("other", "20Gi")
    cluster.gpu_pod("hold", CARD)
    cluster.gpu_pod("mine", "10Gi")
    cluster.gpu_pod("theirs", "10Gi", namespace="other")
    cluster.gpu_pod("theirs-more", "20Gi", namespace="other")  # a card is free; their quota is not
    cluster.run()
    assert cluster.reason("mine") == "GpuQuotaExceeded" == cluster.reason("theirs-more", "other")
    cluster.planned()
    cluster.release("hold")
    cluster.run()
    assert cluster.planned() == [("mine", frozenset(cluster.nodes))]
    assert not cluster.gated("mine")


def test_a_node_change_replans_pods_that_fitted_nowhere_on_that_node_only() -> None:
    cluster = three_free_nodes()
    cluster.quota(NS, "5Gi")
    cluster.gpu_pod("refused", "10Gi")  # a card is free: its quota is not
    cluster.gpu_pod("picky", "10Gi", namespace="labelled", node_selector={"pool": "a"})  # no such node yet
    cluster.run()
    assert (cluster.reason("refused"), cluster.reason("picky", "labelled")) == (
        "GpuQuotaExceeded",
        "Unschedulable",
    )
    cluster.planned()
    cluster.remove(NODES, "node-1", namespace=None)
    cluster.run()
    assert cluster.planned() == [], "a node gone makes room for nobody"

    def heartbeat(node: Obj) -> None:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]

    cluster.change(NODES, None, "node-0", heartbeat)  # nothing placement reads
    cluster.run()
    assert cluster.planned() == []

    cluster.change(NODES, None, "node-2", labelled({"pool": "a"}))
    cluster.run()
    assert cluster.planned() == [("picky", frozenset({"node-2"}))]
    assert cluster.node_of("picky", "labelled") == "node-2"


def test_a_slice_change_replans_on_that_slices_node_only() -> None:
    cluster = full_cluster()
    cluster.gpu_pod("small", "10Gi")
    cluster.run()
    cluster.planned()
    # node-1's plugin publishes a second card (a new pool generation replacing the old slice).
    (key,) = [key for key, item in cluster.slices.items() if item["spec"]["nodeName"] == "node-1"]
    old = cluster.slices[key]
    (new,) = build_resource_slices(
        profile_gpus("h100-80gb", node_name="node-1", gpus=2), node_name="node-1", driver_name=DRIVER
    )
    new["spec"]["pool"]["generation"] = 2
    assert object_key(new) == key
    cluster.slice(new, old)
    cluster.run()
    assert cluster.planned() == [("small", frozenset({"node-1"}))]
    assert cluster.node_of("small") == "node-1"


def test_another_drivers_slice_replans_nothing() -> None:
    cluster = full_cluster()
    cluster.gpu_pod("small", "10Gi")
    cluster.run()
    cluster.planned()
    (foreign,) = build_resource_slices(
        profile_gpus("h100-80gb", node_name="node-1", gpus=2), node_name="node-1", driver_name="other.example"
    )
    cluster.slice(foreign)
    cluster.run()
    assert cluster.planned() == [] and cluster.gated("small")


def test_a_device_class_change_replans_only_the_pods_whose_claims_ask_for_it() -> None:
    cluster = three_free_nodes()
    cluster.gpu_pod("orphan", "10Gi", klass="special")  # its class does not exist yet
    cluster.gpu_pod("waiting", "90Gi")  # our class, but no card has 90 GiB
    cluster.run()
    assert (cluster.reason("orphan"), cluster.reason("waiting")) == ("DeviceClassNotFound", "Unschedulable")
    cluster.planned()
    special = device_class(DRIVER)
    special["metadata"]["name"] = "special"
    cluster.add(DEVICE_CLASSES, special)
    cluster.run()
    assert cluster.planned() == [("orphan", frozenset(cluster.nodes))]
    assert not cluster.gated("orphan")

    def retitle(klass: Obj) -> None:
        klass["metadata"]["labels"] = {"edited": "yes"}

    cluster.change(DEVICE_CLASSES, None, DRIVER, retitle)
    cluster.run()
    assert cluster.planned() == [("waiting", frozenset(cluster.nodes))]


def test_a_pod_whose_pending_reason_is_unknown_is_replanned_on_any_change_everywhere() -> None:
    cluster = full_cluster()
    cluster.gpu_pod("lost", "10Gi", count=2)
    cluster.run()
    uid = str(cluster.kube.stored(PODS, NS, "lost")["metadata"]["uid"])
    cluster.controller.queue.reports.clear(uid)  # as if its report had failed
    cluster.planned()
    cluster.change(NODES, None, "node-0", labelled({"a": "b"}))
    cluster.run()
    assert cluster.planned() == [("lost", frozenset(cluster.nodes))]


# --- a queued pod's nodes ------------------------------------------------------------------------
def test_pods_of_one_shape_queued_for_different_nodes_are_not_skipped_for_each_other() -> None:
    cluster = full_cluster()
    cluster.gpu_pod("s-0", "10Gi")
    cluster.gpu_pod("s-1", "10Gi")
    cluster.run()
    cluster.planned()
    cluster.release("hold-node-2")
    cluster.controller._drain()  # the release queues both for node-2; s-0 is made to look elsewhere
    cluster.controller.queue.woken.discard(f"{NS}/s-0")
    cluster.controller.queue.woken.add([(f"{NS}/s-0", frozenset({"node-0"}))])
    cluster.controller.run_once()
    assert cluster.planned() == [("s-0", frozenset({"node-0"})), ("s-1", frozenset({"node-2"}))]
    assert cluster.gated("s-0") and cluster.node_of("s-1") == "node-2"


def test_a_pod_pending_for_its_quota_is_planned_everywhere_whatever_nodes_it_was_queued_for() -> None:
    cluster = three_free_nodes()
    cluster.quota(NS, "5Gi")
    cluster.gpu_pod("refused", "10Gi")
    cluster.run()
    assert cluster.reason("refused") == "GpuQuotaExceeded"
    cluster.planned()
    cluster.controller.queue.woken.add([(f"{NS}/refused", frozenset({"node-0"}))])
    cluster.controller.run_once()
    assert cluster.planned() == [("refused", frozenset(cluster.nodes))]
