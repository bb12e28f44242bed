"""The edits the controller writes to Pods and ResourceClaims: each an edited deep copy, with
fields it does not own kept, and the wire shape of what it does own pinned."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.contract import ALLOCATED_CONDITION, FINALIZER, GATE_NAME
from dra_driver.resource import edits


def test_an_object_without_metadata_gains_it_on_every_edit() -> None:
    """A raw object missing ``metadata`` gets an empty mapping (no KeyError further on)."""
    assert edits.without_allocation({"status": {}})["metadata"] == {}
    assert edits.with_finalizer({}) == {"metadata": {"finalizers": [FINALIZER]}}
    assert edits.without_finalizer({}) == {"metadata": {"finalizers": []}}


def test_with_allocation_reserves_the_pod_and_deep_copies_the_allocation() -> None:
    allocation: dict[str, Any] = {"devices": {"results": [{"device": "gpu-0"}]}}
    claim = {"metadata": {"name": "c"}}
    edited = edits.with_allocation(claim, allocation, {"name": "p", "uid": "u1"})
    assert edited["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "u1"}]
    assert edited["status"]["allocation"] == allocation
    allocation["devices"]["results"].append({"device": "gpu-1"})
    assert edited["status"]["allocation"]["devices"]["results"] == [{"device": "gpu-0"}]
    assert "status" not in claim


def test_with_allocation_keeps_other_status_fields() -> None:
    claim = {"metadata": {}, "status": {"devices": [{"device": "gpu-0"}]}}
    edited = edits.with_allocation(claim, {"a": 1}, {"name": "p", "uid": "u"})
    assert edited["status"]["devices"] == [{"device": "gpu-0"}]
    assert edited["status"]["allocation"] == {"a": 1}


def test_without_allocation_drops_allocation_and_device_status_only() -> None:
    claim = {"metadata": {}, "status": {"allocation": {"a": 1}, "devices": [1], "reservedFor": [2]}}
    edited = edits.without_allocation(claim)
    assert edited["status"] == {"reservedFor": [2]}
    assert claim["status"]["allocation"] == {"a": 1}


def test_without_allocation_of_a_claim_without_status_writes_an_empty_status() -> None:
    assert edits.without_allocation({"metadata": {}}) == {"metadata": {}, "status": {}}
    assert edits.without_allocation({"metadata": {}, "status": {"devices": []}})["status"] == {}


def test_with_annotation_merges_with_existing_annotations_and_drops_status() -> None:
    pod = {"metadata": {"annotations": {"keep": "me"}}, "status": {"phase": "Pending"}, "spec": {}}
    edited = edits.with_annotation(pod, "k", "v")
    assert edited["metadata"]["annotations"] == {"keep": "me", "k": "v"}
    assert "status" not in edited
    assert edited["spec"] == {}
    assert pod["status"] == {"phase": "Pending"}


def test_gate_patch_on_a_pod_without_our_gate_is_nothing_to_write() -> None:
    assert edits.gate_patch({"metadata": {}}, {"a": "b"}) is None
    assert edits.gate_patch({"spec": {"schedulingGates": [{"name": "other"}]}}, {}) is None


def test_gate_patch_tests_the_uid_and_our_gate_at_its_index_then_adds_each_annotation() -> None:
    pod = {
        "metadata": {"uid": "u1", "annotations": {"keep": "me"}},
        "spec": {"schedulingGates": [{"name": "other"}, {"name": GATE_NAME}]},
    }
    before = copy.deepcopy(pod)
    assert edits.gate_patch(pod, {"hami.io/vgpu~x": "v", "k": "w"}) == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": GATE_NAME}},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
        {"op": "add", "path": "/metadata/annotations/hami.io~1vgpu~0x", "value": "v"},
        {"op": "add", "path": "/metadata/annotations/k", "value": "w"},
    ]
    assert pod == before


def test_gate_patch_adds_the_map_to_a_pod_without_annotations_only_while_it_has_none() -> None:
    pod = {"metadata": {"uid": "u1"}, "spec": {"schedulingGates": [{"name": GATE_NAME}]}}
    ops = edits.gate_patch(pod, {"a/b": "c"})
    assert ops is not None and ops[3:] == [
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "c"}},
    ]
    ops = edits.gate_patch(pod, {})
    assert ops is not None and len(ops) == 3  # nothing to add: no test of the map either


def test_condition_patch_names_the_pod_and_only_our_condition() -> None:
    assert edits.condition_patch({"metadata": {"uid": "u1"}}, "True", "Allocated", "done", "t0") == {
        "metadata": {"uid": "u1"},
        "status": {
            "conditions": [
                {
                    "type": ALLOCATED_CONDITION,
                    "status": "True",
                    "reason": "Allocated",
                    "message": "done",
                    "lastTransitionTime": "t0",
                }
            ]
        },
    }


def test_condition_patch_cuts_the_message_to_32768_characters() -> None:
    patch = edits.condition_patch({}, "False", "Unschedulable", "x" * 40000, "t")
    assert len(patch["status"]["conditions"][0]["message"]) == 32768
