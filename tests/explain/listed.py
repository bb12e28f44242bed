"""What the controller's informers hold in a ``FakeCluster``, as a command would list it."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.controller.offline import ClusterObjects
from dra_driver.kube.api import DEVICE_CLASSES, GPU_QUOTAS, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_QUOTAS
from tests.controller.fake_cluster import FakeCluster


def stored(cluster: FakeCluster, plural: str) -> list[dict[str, Any]]:
    """Copies of the API's objects of one resource."""
    return [copy.deepcopy(body) for (kind, _, _), body in cluster.kube.objects.items() if kind == plural]


def listed(cluster: FakeCluster) -> ClusterObjects:
    """Every object of the API and the slices the slice informer holds, copied."""
    return ClusterObjects(
        pods=stored(cluster, PODS.plural),
        claims=stored(cluster, RESOURCE_CLAIMS.plural),
        slices=[copy.deepcopy(item) for item in cluster.slices.values()],
        classes=stored(cluster, DEVICE_CLASSES.plural),
        nodes=stored(cluster, NODES.plural),
        gpu_quotas=stored(cluster, GPU_QUOTAS.plural),
        resource_quotas=stored(cluster, RESOURCE_QUOTAS.plural),
    )
