"""``controller/offline.py``: the controller's cache from objects listed once equals the cache its
informers fed, event by event, on the same objects."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.controller.offline import ClusterObjects, allocator_for, cache_from
from dra_driver.kube.api import NODES, PODS, RESOURCE_QUOTAS
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS
from tests.explain.listed import listed


def busy_cluster() -> FakeCluster:
    """Two nodes, a quota, placed pods (one bound, asking for CPU), a pending one and a neighbour."""
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=2)
    cluster.quota(NS, "100Gi")
    cluster.add(RESOURCE_QUOTAS, kind="ResourceQuota", body={
        "metadata": {"name": "hami", "namespace": NS},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "92160"}},
    })  # fmt: skip

    def allocatable(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {"cpu": "8", "memory": "32Gi"}
        node["metadata"]["labels"] = {"zone": "a"}

    cluster.change(NODES, None, "node-1", allocatable)
    for name, memory in (("a", "30Gi"), ("b", "20Gi"), ("c", "79Gi")):
        cluster.gpu_pod(name, memory)
        cluster.run()
    cluster.bind("a")
    cluster.gpu_pod("waits", "80Gi")
    cluster.run()
    container = {"name": "x", "resources": {"requests": {"cpu": "3"}}}
    cluster.add(PODS, {
        "metadata": {"name": "neighbour", "namespace": "other"},
        "spec": {"nodeName": "node-1", "containers": [container]},
        "status": {"phase": "Running"},
    })  # fmt: skip
    cluster.run()
    return cluster


def test_the_cache_from_listed_objects_is_the_cache_the_informers_fed() -> None:
    cluster = busy_cluster()
    fed = cluster.controller.cache
    built = cache_from(listed(cluster), DRIVER)
    assert set(built.pods) == set(fed.pods) and set(built.claims) == set(fed.claims)
    assert built.nodes == fed.nodes and set(built.classes) == set(fed.classes)
    assert dict(built.ledger.claims()) == dict(fed.ledger.claims()) and built.ledger.claims()
    assert built.ledger.inventory.keys() == fed.ledger.inventory.keys() == {"node-1", "node-2"}
    assert {node: sorted(inv.devices) for node, inv in built.ledger.inventory.items()} == {
        node: sorted(inv.devices) for node, inv in fed.ledger.inventory.items()
    }
    assert built.bound_requests() == fed.bound_requests() and built.bound_requests()["node-1"]["cpu"] == 3.0
    assert [q.name for q in built.quotas.in_namespace(NS)] == [q.name for q in fed.quotas.in_namespace(NS)]
    assert len(built.quotas.in_namespace(NS)) == 2
    assert built.owned == fed.owned and built.consumers == fed.consumers


def test_the_allocator_over_it_decides_as_the_controller_does() -> None:
    cluster = busy_cluster()
    allocator = allocator_for(listed(cluster), DRIVER)
    outcomes = set()
    for key, pod in cluster.controller.cache.pods.items():
        mine, theirs = (
            allocator.allocate(allocator.cache.pods[key]),
            cluster.controller.allocator.allocate(pod),
        )
        assert type(mine) is type(theirs), key
        assert getattr(mine, "reason", None) == getattr(theirs, "reason", None)
        assert getattr(mine, "message", None) == getattr(theirs, "message", None)
        outcomes.add(type(mine).__name__)
    assert outcomes == {"NotCandidate", "Unschedulable"}


def test_the_listed_objects_are_left_as_they_were() -> None:
    cluster = busy_cluster()
    objects = listed(cluster)
    for group in (objects.pods, objects.claims, objects.slices, objects.nodes, objects.classes):
        for obj in group:
            obj["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    before = copy.deepcopy(objects)
    cache_from(objects, DRIVER)
    assert objects == before


def test_nothing_listed_is_an_empty_cache() -> None:
    cache = cache_from(ClusterObjects(), DRIVER)
    assert not cache.pods and not cache.ledger.inventory and not cache.nodes
