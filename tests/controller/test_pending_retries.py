"""Pending pods after a release: only the nodes that gained room, one pod per shape that stays pending.

A full cluster with pending pods must not re-plan every pending pod on every node whenever one
card is freed (hack/bench_storm.py measures it at 5,000 nodes). These tests drive the controller's
pass (``run_once``) over the in-memory API and record every plan the planner is asked for.
"""

from __future__ import annotations

from typing import Any

from dra_driver.controller.controller import Controller
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import DEVICE_CLASSES, GPU_QUOTAS, NODES, PODS, RESOURCE_CLAIMS, Obj
from dra_driver.kubeletplugin.slices import build_resource_slices
from tests.controller.fake_cluster import RecordingPlanner
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request

CARD = "81559Mi"  # an H100 80GB's whole memory, as the simulated profile publishes it


class Cluster:
    def __init__(self, nodes: int = 3, gpus: int = 1) -> None:
        self.kube = FakeKube()
        self.controller = Controller(self.kube, DRIVER, write_workers=0)
        self.planner = RecordingPlanner(self.controller.allocator.planner)
        self.controller.allocator.planner = self.planner  # type: ignore[assignment]
        slices = []
        self.nodes = [f"node-{index}" for index in range(nodes)]
        for name in self.nodes:
            self.add("Node", NODES, {"metadata": {"name": name}, "status": {"allocatable": {}}})
            slices += build_resource_slices(
                profile_gpus("h100-80gb", node_name=name, gpus=gpus), node_name=name, driver_name=DRIVER
            )
        self.controller.cache.refresh_inventory(slices)
        self.add("DeviceClass", DEVICE_CLASSES, device_class(DRIVER))
        self.stamp = 0

    def add(self, kind: str, resource: Any, body: Obj) -> Obj:
        stored = self.kube.put(resource, body)
        self.controller._on_change(kind, None, stored)
        return stored

    def pod(self, name: str, memory: str, count: int = 1) -> None:
        self.add("ResourceClaim", RESOURCE_CLAIMS, claim(name, request(memory=memory, count=count)))
        body = pod(name, {"gpu": f"claim:{name}"})
        self.stamp += 1
        body["metadata"]["creationTimestamp"] = f"2026-12-01T00:00:{self.stamp:02d}Z"
        self.add("Pod", PODS, body)

    def settle(self) -> None:
        for _ in range(3):
            self.controller.run_once()

    def gated(self, name: str) -> bool:
        return bool(self.kube.stored(PODS, NS, name)["spec"].get("schedulingGates"))

    def release(self, name: str) -> None:
        """The claim's pod finished and the claim went (what its informer would deliver)."""
        gone = self.kube.objects.pop((RESOURCE_CLAIMS.plural, NS, name))
        self.controller._on_change("ResourceClaim", gone, None)

    def planned(self) -> list[tuple[str, frozenset[str]]]:
        plans, self.planner.plans = self.planner.plans, []
        return plans


def full_cluster(pending: list[tuple[str, str, int]]) -> Cluster:
    """Three one-card nodes, each card held whole by ``hold-<node>``; then ``pending`` pods."""
    cluster = Cluster()
    for name in cluster.nodes:
        cluster.pod(f"hold-{name}", CARD)
        cluster.settle()
    assert not any(cluster.gated(f"hold-{name}") for name in cluster.nodes)
    for name, memory, count in pending:
        cluster.pod(name, memory, count)
    cluster.settle()
    assert cluster.controller.requeue.pending_pods == {f"{NS}/{name}" for name, _, _ in pending}
    cluster.planned()
    return cluster


def node_of(cluster: Cluster, claim_name: str) -> str:
    results = cluster.kube.stored(RESOURCE_CLAIMS, NS, claim_name)["status"]["allocation"]["devices"][
        "results"
    ]
    return str(results[0]["pool"])


def test_after_a_release_pending_pods_are_planned_on_that_node_only_and_the_oldest_fitting_wins() -> None:
    cluster = full_cluster([("two-cards", "10Gi", 2), ("small", "10Gi", 1), ("later", "10Gi", 1)])
    freed = node_of(cluster, "hold-node-1")
    cluster.release("hold-node-1")
    cluster.settle()
    assert not cluster.gated("small") and not cluster.gated("later"), "both fit the freed card, oldest first"
    assert node_of(cluster, "small") == freed == node_of(cluster, "later")
    assert cluster.gated("two-cards")
    plans = cluster.planned()
    assert plans and all(nodes <= {freed} for _, nodes in plans), plans
    # Still pending, with the explanation of its last full evaluation (not rewritten).
    assert cluster.controller.requeue.pending_pods == {f"{NS}/two-cards"}


def test_pods_of_one_shape_are_skipped_once_the_oldest_of_them_stays_pending() -> None:
    pending = [(f"pair-{index}", "10Gi", 2) for index in range(5)]  # two cards: no node has two
    cluster = full_cluster(pending)
    cluster.release("hold-node-0")
    cluster.settle()
    names = [name for name, _ in cluster.planned()]
    assert names == ["pair-0"], names
    assert cluster.controller.metrics.pending_skipped._value.get() == 4
    assert all(cluster.gated(name) for name, _, _ in pending)
    assert cluster.controller.requeue.pending_pods == {f"{NS}/{name}" for name, _, _ in pending}


def test_a_change_to_the_pods_class_plans_it_everywhere() -> None:
    cluster = full_cluster([("waiting", "90Gi", 1)])
    changed = device_class(DRIVER)
    changed["metadata"]["labels"] = {"changed": "yes"}
    cluster.add("DeviceClass", DEVICE_CLASSES, changed)
    cluster.settle()
    assert cluster.planned() == [("waiting", frozenset(cluster.nodes))]


def test_a_class_no_pending_pod_uses_plans_nothing() -> None:
    cluster = full_cluster([("waiting", "90Gi", 1)])
    cluster.add("DeviceClass", DEVICE_CLASSES, {**device_class(DRIVER), "metadata": {"name": "another"}})
    cluster.settle()
    assert cluster.planned() == []


def test_a_pod_pending_for_its_quota_is_planned_everywhere_after_a_release() -> None:
    cluster = Cluster()
    for name in ("hold-a", "hold-b"):
        cluster.pod(name, CARD)
        cluster.settle()
    held = {node_of(cluster, "hold-a"), node_of(cluster, "hold-b")}
    quota = {
        "apiVersion": "gpu.hami.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": "team", "namespace": NS},
        "spec": {"hard": {"memory": "163118Mi"}},  # exactly the two held cards
    }
    cluster.controller._on_change("GpuQuota", None, cluster.kube.put(GPU_QUOTAS, quota))
    cluster.pod("over", "10Gi")
    cluster.settle()
    uid = str(cluster.kube.stored(PODS, NS, "over")["metadata"]["uid"])
    assert cluster.controller.reports.reason(uid) == "GpuQuotaExceeded"
    cluster.planned()
    cluster.release("hold-a")  # capacity freed on one node, and quota freed for every node
    cluster.settle()
    assert not cluster.gated("over")
    assert cluster.planned()[0] == ("over", frozenset(cluster.nodes)), (
        "planned everywhere, not only on " + str(held)
    )


def test_the_periodic_resync_plans_one_pending_pod_per_shape_everywhere() -> None:
    pending = [(f"pair-{index}", "10Gi", 2) for index in range(4)] + [("other", "20Gi", 2)]
    cluster = full_cluster(pending)
    cluster.controller.resync_seconds = 0  # every pass is a resync pass
    cluster.controller.run_once()
    assert sorted(cluster.planned()) == [
        ("other", frozenset(cluster.nodes)),
        ("pair-0", frozenset(cluster.nodes)),
    ]
    assert cluster.controller.requeue.pending_pods == {f"{NS}/{name}" for name, _, _ in pending}


def test_every_annotation_the_planner_reads_makes_a_shape_of_its_own() -> None:
    """A pod limited to A100s staying pending says nothing about an identical pod without the limit."""
    from dra_driver.config.resolve import PLAN_ANNOTATIONS
    from dra_driver.resource.objects import PodView
    from tests.controller.fake_cluster import FakeCluster

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
