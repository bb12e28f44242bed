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


def test_without_gate_on_a_pod_without_spec_is_nothing_to_write() -> None:
    assert edits.without_gate({"metadata": {}}, {"a": "b"}) is None


def test_without_gate_lifts_only_our_gate_and_merges_annotations() -> None:
    pod = {
        "metadata": {"annotations": {"keep": "me"}},
        "spec": {"schedulingGates": [{"name": GATE_NAME}, {"name": "other"}]},
    }
    edited = edits.without_gate(pod, {"k": "v"})
    assert edited is not None
    assert edited["spec"]["schedulingGates"] == [{"name": "other"}]
    assert edited["metadata"]["annotations"] == {"keep": "me", "k": "v"}
    assert pod["spec"]["schedulingGates"][0] == {"name": GATE_NAME}


def test_with_condition_replaces_ours_and_keeps_other_conditions() -> None:
    other = {"type": "PodScheduled", "status": "False"}
    pod = {"status": {"conditions": [other, {"type": ALLOCATED_CONDITION, "status": "False"}]}}
    before = copy.deepcopy(pod)
    edited = edits.with_condition(pod, "True", "Allocated", "done", "2026-01-01T00:00:00Z")
    assert edited["status"]["conditions"] == [
        other,
        {
            "type": ALLOCATED_CONDITION,
            "status": "True",
            "reason": "Allocated",
            "message": "done",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ]
    assert pod == before


def test_with_condition_cuts_the_message_to_32768_characters() -> None:
    edited = edits.with_condition({}, "False", "Unschedulable", "x" * 40000, "t")
    assert len(edited["status"]["conditions"][0]["message"]) == 32768
