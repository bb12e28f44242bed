"""``RecordedApi`` (hack/bench_scale.py): the in-memory API the scale benchmark serves its objects
from must behave as the API server does where the controller relies on it, or the benchmark would
measure a controller that never runs in production: lists and watch events are fresh JSON, a watch
resumes after the list's resourceVersion, writes carry the stored resourceVersion, a status write
changes only the status."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dra_driver.contract import ALLOCATED_CONDITION, GATE_NAME
from dra_driver.kube.api import PODS
from dra_driver.kube.errors import KubeError
from dra_driver.resource.edits import condition_patch, gate_patch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    sys.path.insert(0, str(ROOT / "hack"))
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "hack" / "bench_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale"] = module
    spec.loader.exec_module(module)
    return module


def test_list_then_watch_from_its_version(scale: ModuleType) -> None:
    api = scale.RecordedApi()
    api.load(PODS, scale.pod_object("a", "ns", "node-1", 1))
    listing = api.list(PODS)
    (item,) = listing["items"]
    assert item["metadata"]["name"] == "a" and item["status"]["phase"] == "Running"
    item["metadata"]["labels"]["app"] = "changed"  # the caller's copy, not the store
    assert api.get(PODS, "ns", "a")["metadata"]["labels"]["app"] != "changed"
    api.create(PODS, "ns", scale.pod_object("b", "ns", None, 2))
    api.delete(PODS, "ns", "a")
    events = api.watch(PODS, listing["metadata"]["resourceVersion"], timeout_seconds=1)
    seen = [(event["type"], event["object"]["metadata"]["name"]) for event in events]
    assert seen == [("ADDED", "b"), ("DELETED", "a")]


def test_writes_carry_the_stored_version_and_status_writes_only_status(scale: ModuleType) -> None:
    api = scale.RecordedApi()
    created = api.create(PODS, "ns", scale.pod_object("p", "ns", None, 3))
    stale = dict(created)
    created["spec"]["nodeName"] = "node-1"
    bound = api.update(PODS, created)
    assert bound["spec"]["nodeName"] == "node-1"
    assert int(bound["metadata"]["resourceVersion"]) > int(stale["metadata"]["resourceVersion"])
    with pytest.raises(KubeError) as conflict:
        api.update(PODS, stale)
    assert conflict.value.status == 409
    bound["status"] = scale.running_status(3)
    bound["spec"]["nodeName"] = "elsewhere"  # ignored by a status write
    written = api.update(PODS, bound, status=True)
    assert written["status"]["phase"] == "Running" and written["spec"]["nodeName"] == "node-1"
    with pytest.raises(KubeError) as missing:
        api.get(PODS, "ns", "nope")
    assert missing.value.status == 404


def test_the_binders_patches_apply_as_on_the_api_server(scale: ModuleType) -> None:
    """The gate's JSON patch and the condition's strategic merge patch: no resourceVersion needed,
    a failed ``test`` or another object's uid refused (422) with nothing written."""
    api = scale.RecordedApi()
    created = api.create(PODS, "ns", scale.pod_object("p", "ns", None, 3))
    created["spec"]["schedulingGates"] = [{"name": "x/y"}, {"name": GATE_NAME}]
    created = api.update(PODS, created)
    ops = gate_patch(created, {"a.example/b": "c"})
    assert ops is not None
    api.update(PODS, {**created, "metadata": {**created["metadata"], "labels": {"new": "1"}}})
    for refused in (
        gate_patch({**created, "metadata": {**created["metadata"], "uid": "other"}}, {}),
        gate_patch({**created, "spec": {"schedulingGates": [{"name": GATE_NAME}]}}, {}),
    ):
        with pytest.raises(KubeError) as failed:
            api.patch(PODS, "ns", "p", refused)
        assert failed.value.status == 422
    written = api.patch(PODS, "ns", "p", ops)
    assert written["spec"]["schedulingGates"] == [{"name": "x/y"}] and written["metadata"]["labels"] == {
        "new": "1"
    }
    assert written["metadata"]["annotations"]["a.example/b"] == "c"
    written = api.update(PODS, {**written, "status": scale.running_status(3)}, status=True)
    condition = condition_patch(written, "True", "Allocated", "ok", "2026-12-06T00:00:00Z")
    written = api.patch(PODS, "ns", "p", condition, status=True, strategic=True)
    # A condition the list did not have goes first, as kube-apiserver's strategic merge puts it.
    assert written["status"]["conditions"][0]["type"] == ALLOCATED_CONDITION
    assert len(written["status"]["conditions"]) == len(scale.running_status(3).get("conditions") or ()) + 1
    with pytest.raises(KubeError) as gone:
        api.patch(PODS, "ns", "nope", condition, status=True, strategic=True)
    assert gone.value.status == 404


def test_lists_come_in_pages_and_honour_field_selectors(scale: ModuleType) -> None:
    """The controller's informers page their lists (limit/continue) and select our driver's slices
    (spec.driver): every object once across the pages, only the selected ones, the last page
    without a token."""
    api = scale.RecordedApi()
    for i in range(5):
        api.load(PODS, scale.pod_object(f"p{i}", "ns", f"node-{i % 2}", i))
    names, token, pages = [], None, 0
    while True:
        page = api.list(PODS, limit=2, continue_from=token)
        pages += 1
        names += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert names == [f"p{i}" for i in range(5)] and pages == 3
    selected = api.list(PODS, field_selector="spec.nodeName=node-1")["items"]
    assert [item["metadata"]["name"] for item in selected] == ["p1", "p3"]
