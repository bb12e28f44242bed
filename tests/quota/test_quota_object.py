"""A quota object read once (``QuotaObject``) and its status write as a pure edit (``with_quota_used``)."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.quota.edits import with_quota_used
from dra_driver.quota.model import QuotaObject

USED = {"memory": "2Gi", "cores": 30, "devices": 1}


def gpu_quota(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.hami.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"namespace": "team-a", "name": "cap", "generation": 3, "resourceVersion": "7"},
        "spec": {"hard": {"memory": "8Gi", "cores": 100}},
        **extra,
    }


def test_a_quota_object_reads_its_spec_and_last_written_usage() -> None:
    obj = gpu_quota(status={"used": USED, "observedGeneration": 2})
    view = QuotaObject.parse(obj)
    assert view.raw is obj
    assert view.spec == {"hard": {"memory": "8Gi", "cores": 100}}
    assert view.used == USED


def test_a_quota_never_written_has_no_usage_and_a_missing_spec_reads_as_none() -> None:
    assert QuotaObject.parse(gpu_quota()).used is None
    assert QuotaObject.parse(gpu_quota(status={"observedGeneration": 1})).used is None
    bare = QuotaObject.parse({"metadata": {"name": "cap"}})
    assert (bare.spec, bare.used) == (None, None)


def test_only_a_spec_change_tells_two_versions_apart() -> None:
    before = QuotaObject.parse(gpu_quota(status={"used": USED}))
    status_only = QuotaObject.parse(gpu_quota(status={"used": {**USED, "cores": 40}}))
    limits = QuotaObject.parse({**gpu_quota(), "spec": {"hard": {"memory": "4Gi"}}})
    assert before.spec == status_only.spec
    assert before.spec != limits.spec


def test_the_status_write_sets_used_and_the_generation_it_was_computed_for() -> None:
    obj = gpu_quota(status={"used": {"cores": 0}, "observedGeneration": 1, "conditions": [{"type": "X"}]})
    original = copy.deepcopy(obj)
    edited = with_quota_used(obj, USED)
    assert edited["status"] == {"used": USED, "observedGeneration": 3, "conditions": [{"type": "X"}]}
    assert {key: value for key, value in edited.items() if key != "status"} == {
        key: value for key, value in original.items() if key != "status"
    }
    assert obj == original, "the cached object is never changed in place"
    edited["spec"]["hard"]["cores"] = 1
    edited["status"]["used"]["cores"] = 1
    assert obj == original and USED["cores"] == 30, "the edit is a deep copy, of the usage too"


def test_a_quota_without_status_or_generation_gets_both() -> None:
    obj = gpu_quota()
    del obj["metadata"]["generation"]
    assert with_quota_used(obj, USED)["status"] == {"used": USED, "observedGeneration": 0}


def test_two_versions_have_the_same_limits_when_only_their_status_differs() -> None:
    memory = "requests.gpu.hami.io/memory"
    old = {"metadata": {"name": "q"}, "spec": {"hard": {memory: "10Gi"}}, "status": {"used": {}}}
    assert QuotaObject.same_limits(old, {**old, "status": {"used": {memory: "1Gi"}}})
    assert not QuotaObject.same_limits(old, {**old, "spec": {"hard": {memory: "20Gi"}}})
    assert not QuotaObject.same_limits(old, {"metadata": {"name": "q"}})
