"""Evictions on the real kube-apiserver (the API server tier): what preemption sends
(dra_driver/kube/eviction.py) is the Eviction API's request, a dry run evicts nothing, a
PodDisruptionBudget that allows no disruption refuses with 429, a wrong uid is refused."""

from __future__ import annotations

import pytest

from dra_driver.kube.api import PODS, Kube, Obj, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.kube.eviction import Evicted, evict

PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)


def pod(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def test_an_eviction_deletes_the_pod_a_dry_run_does_not(api_kube: Kube, api_namespace: str) -> None:
    uid = api_kube.create(PODS, api_namespace, pod("victim"))["metadata"]["uid"]
    assert evict(api_kube, api_namespace, "victim", uid, dry_run=True) is Evicted.EVICTED
    assert api_kube.get(PODS, api_namespace, "victim")["metadata"]["uid"] == uid
    assert evict(api_kube, api_namespace, "victim", "00000000-0000-0000-0000-000000000000") is Evicted.GONE
    assert evict(api_kube, api_namespace, "victim", uid) is Evicted.EVICTED
    # Unscheduled, so the API server deletes it at once (no kubelet to wait for).
    with pytest.raises(KubeError) as gone:
        api_kube.get(PODS, api_namespace, "victim")
    assert gone.value.status == 404
    assert evict(api_kube, api_namespace, "victim", uid) is Evicted.GONE


def test_a_budget_that_allows_no_disruption_refuses_the_eviction(api_kube: Kube, api_namespace: str) -> None:
    created_pod = api_kube.create(PODS, api_namespace, pod("guarded", {"app": "guarded"}))
    uid = created_pod["metadata"]["uid"]
    # Running and ready, as its kubelet would report it: the Eviction API lets a Pending pod go
    # whatever its budget says.
    created_pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    api_kube.update(PODS, created_pod, status=True)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    created = api_kube.create(PDBS, api_namespace, budget)
    # No controller-manager here: the budget's status is what the disruption controller writes.
    created["status"] = {
        "observedGeneration": created["metadata"].get("generation", 1),
        "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1,
    }  # fmt: skip
    api_kube.update(PDBS, created, status=True)
    assert evict(api_kube, api_namespace, "guarded", uid, dry_run=True) is Evicted.REFUSED
    assert evict(api_kube, api_namespace, "guarded", uid) is Evicted.REFUSED
    assert api_kube.get(PODS, api_namespace, "guarded")["metadata"]["uid"] == uid


def test_the_eviction_api_writes_its_own_disruption_target(api_kube: Kube, api_namespace: str) -> None:
    """Why preemption writes its DisruptionTarget condition again after the eviction: the API
    replaces a condition of that type with its own (reason EvictionByEvictionAPI)."""
    body = pod("marked")
    body["metadata"]["finalizers"] = ["test.hami.io/keep"]  # terminating, not gone: readable
    created = api_kube.create(PODS, api_namespace, body)
    created["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    created = api_kube.update(PODS, created, status=True)
    ours = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByHamiDra", "message": "by p"}
    patch = {"metadata": {"uid": created["metadata"]["uid"]}, "status": {"conditions": [ours]}}
    api_kube.patch(PODS, api_namespace, "marked", patch, status=True, strategic=True)
    try:
        assert evict(api_kube, api_namespace, "marked", created["metadata"]["uid"]) is Evicted.EVICTED
        evicted = api_kube.get(PODS, api_namespace, "marked")
        assert evicted["metadata"].get("deletionTimestamp")
        (target,) = [c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert target["reason"] == "EvictionByEvictionAPI"
    finally:
        api_kube.patch(PODS, api_namespace, "marked", {"metadata": {"finalizers": None}})
