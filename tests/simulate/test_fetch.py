"""What ``simulate --from-cluster`` lists: all the controller's informers list to place claims,
only what a snapshot holds to save one, and a placement all the same for a user who may not list
Pods or Nodes (said, with bare nodes standing in for the Node objects)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    Resource,
)
from dra_driver.kube.errors import KubeError
from dra_driver.simulate.snapshot import fetch

SLICE = {"metadata": {"name": "s"}, "spec": {"nodeName": "node-1", "driver": "gpu.hami.io"}}


class ListingKube:
    """Answers ``list`` with one object per resource (``forbidden``: 403 instead), recording the calls."""

    def __init__(
        self, forbidden: frozenset[str] = frozenset(), missing: frozenset[str] = frozenset()
    ) -> None:
        self.forbidden = forbidden
        self.missing = missing
        self.listed: list[str] = []

    def list(self, resource: Resource, **_: Any) -> dict[str, Any]:
        self.listed.append(resource.plural)
        if resource.plural in self.forbidden:
            raise KubeError(403, f"{resource.plural} is forbidden")
        if resource.plural in self.missing:
            raise KubeError(404, "the server could not find the requested resource")
        item = SLICE if resource is RESOURCE_SLICES else {"metadata": {"name": resource.plural}}
        return {"items": [item]}


def test_placing_lists_what_the_controllers_informers_list() -> None:
    kube = ListingKube()
    objects = fetch(kube)  # type: ignore[arg-type]
    every = {r.plural for r in (RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_QUOTAS, GPU_QUOTAS)}
    assert set(kube.listed) == every | {DEVICE_CLASSES.plural, PODS.plural, NODES.plural}
    assert objects.pods and objects.nodes and objects.classes and objects.gpu_quotas


def test_a_snapshot_to_save_lists_no_classes_pods_or_nodes() -> None:
    kube = ListingKube(missing=frozenset({GPU_QUOTAS.plural}))  # no CRD: no quotas, no error
    objects = fetch(kube, placing=False)  # type: ignore[arg-type]
    assert set(kube.listed) == {
        r.plural for r in (RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_QUOTAS, GPU_QUOTAS)
    }
    assert not objects.pods and not objects.nodes and not objects.classes and not objects.gpu_quotas


def test_a_user_who_may_not_list_pods_or_nodes_places_all_the_same_and_is_told() -> None:
    warnings: list[str] = []
    kube = ListingKube(forbidden=frozenset({PODS.plural, NODES.plural}))
    objects = fetch(kube, warnings)  # type: ignore[arg-type]
    assert objects.pods == []
    # A bare Node for each node with slices: any pod fits it (node fit not checked, and said so).
    assert objects.nodes == [{"metadata": {"name": "node-1"}, "status": {"allocatable": {}}}]
    assert len(warnings) == 2
    assert warnings[0].startswith("cannot list Pods (403: pods is forbidden): the CPU and memory")
    assert (
        "cannot list Nodes" in warnings[1]
        and "node fit (selectors, taints, CPU/memory) is not checked" in (warnings[1])
    )


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(KubeError):
        fetch(ListingKube(forbidden=frozenset({DEVICE_CLASSES.plural})))  # type: ignore[arg-type]
