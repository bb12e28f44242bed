"""Whom a quota event wakes (``ClusterCache.apply_event``): a change of limits retries the
namespace's refused pods; one of status alone (ours, or kube-controller-manager's) retries nobody."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.controller.harness import NS
from tests.controller.worlds import CacheWorld


def quota(kind: str, hard: dict[str, Any], used: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": kind, "metadata": {"namespace": NS, "name": "cap"}, "spec": {"hard": hard}}
    if used is not None:
        obj["status"] = {"used": used}
    return obj


LIMITS = {
    "GpuQuota": ({"memory": "8Gi"}, {"memory": "4Gi"}),
    "ResourceQuota": ({"limits.nvidia.com/gpumem": "8192"}, {"limits.nvidia.com/gpumem": "4096"}),
}


@pytest.mark.parametrize("kind", ["GpuQuota", "ResourceQuota"])
def test_only_added_removed_or_changed_limits_retry_the_namespace(kind: str) -> None:
    cache = CacheWorld().cache
    hard, lower = LIMITS[kind]
    first = quota(kind, hard)
    assert cache.apply_event(kind, None, first).retry_quota == {NS}
    written = quota(kind, hard, used={"memory": "1Gi"})
    assert cache.apply_event(kind, first, written).retry_quota == set()
    assert cache.apply_event(kind, written, copy.deepcopy(written)).retry_quota == set()
    assert cache.apply_event(kind, written, quota(kind, lower)).retry_quota == {NS}
    assert cache.apply_event(kind, quota(kind, lower), None).retry_quota == {NS}
