"""The changes the controller writes to Pods and ResourceClaims, each a pure function.

A claim's write starts from the object as the API last returned it (a raw mapping: fields newer
than our model must round-trip untouched) and returns an edited deep copy, so a cached object is
never changed in place. A pod's writes are patches that name only what they change (the cache
keeps pods slim: dra_driver/controller/slim.py). The binder and the releaser
(dra_driver/controller/binder.py, releaser.py) only choose which edit to send; what a finalizer,
an allocation, a gate or a condition looks like on the wire is written here, once.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dra_driver.contract import ALLOCATED_CONDITION, FINALIZER, GATE_NAME
from dra_driver.kube.api import Obj


def _copy(obj: Mapping[str, Any]) -> Obj:
    edited: Obj = copy.deepcopy(dict(obj))
    edited.setdefault("metadata", {})
    return edited


def with_finalizer(claim: Mapping[str, Any]) -> Obj | None:
    """The claim with our finalizer added; None when it is there already (nothing to write)."""
    edited = _copy(claim)
    finalizers = edited["metadata"].get("finalizers") or []
    if FINALIZER in finalizers:
        return None
    edited["metadata"]["finalizers"] = [*finalizers, FINALIZER]
    return edited


def without_finalizer(claim: Mapping[str, Any]) -> Obj:
    """The claim with our finalizer removed (other components' finalizers kept)."""
    edited = _copy(claim)
    edited["metadata"]["finalizers"] = [
        item for item in edited["metadata"].get("finalizers") or () if item != FINALIZER
    ]
    return edited


def with_allocation(claim: Mapping[str, Any], allocation: Mapping[str, Any], pod: Mapping[str, str]) -> Obj:
    """The claim's status with ``allocation``, reserved for ``pod`` (``name`` and ``uid``).

    Reserving in the same UpdateStatus saves kube-scheduler's PreBind a write: it only appends a
    pod that is not reserved yet (docs/performance.md, "API writes per pod").
    """
    edited = _copy(claim)
    status = edited.setdefault("status", {})
    status["allocation"] = copy.deepcopy(dict(allocation))
    status["reservedFor"] = [{"resource": "pods", "name": pod["name"], "uid": pod["uid"]}]
    return edited


def without_allocation(claim: Mapping[str, Any]) -> Obj:
    """The claim's status without its allocation (and the per-device status that came with it)."""
    edited = _copy(claim)
    status = edited.setdefault("status", {})
    status.pop("allocation", None)
    status.pop("devices", None)
    return edited


def with_annotation(obj: Mapping[str, Any], key: str, value: str) -> Obj:
    """The object with one annotation set, without its status (a metadata-only Update)."""
    edited = _copy(obj)
    edited.pop("status", None)
    edited["metadata"]["annotations"] = {**(edited["metadata"].get("annotations") or {}), key: value}
    return edited


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) to ``parts``: ``~`` and ``/`` in a key escaped (``a/b`` -> ``a~1b``)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def gate_patch(
    pod: Mapping[str, Any], annotations: Mapping[str, str], gate: str = GATE_NAME
) -> list[Obj] | None:
    """A JSON patch (RFC 6902) that removes our scheduling gate (``gate``) and sets ``annotations``;
    None when ``pod`` does not carry the gate (nothing to write).

    Unlike an Update it needs no resourceVersion, so a write of another component in between
    (kube-controller-manager's of the pod's status, nearly always) does not make it fail, and it
    can clobber nothing: its ``test`` ops make the API server refuse it (422, nothing written)
    unless the pod is still the object ``pod`` is (its uid) and our gate is still at the index it
    is removed from; annotations are added one by one, or, where ``pod`` had none, as a map after a
    ``test`` that there still is none (a ``test`` of null passes on a missing member). The real
    API server's answers are checked in tests/cluster/test_pod_patches.py.
    """
    meta = pod.get("metadata") or {}
    gates = list((pod.get("spec") or {}).get("schedulingGates") or ())
    index = next((i for i, entry in enumerate(gates) if entry.get("name") == gate), None)
    if index is None:
        return None
    gate_path = _pointer("spec", "schedulingGates", str(index))
    ops: list[Obj] = [
        {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
        {"op": "test", "path": gate_path, "value": copy.deepcopy(dict(gates[index]))},
        {"op": "remove", "path": gate_path},
    ]
    if annotations and meta.get("annotations") is None:
        ops.append({"op": "test", "path": "/metadata/annotations", "value": None})
        ops.append({"op": "add", "path": "/metadata/annotations", "value": dict(annotations)})
    else:
        ops.extend(
            {"op": "add", "path": _pointer("metadata", "annotations", key), "value": value}
            for key, value in annotations.items()
        )
    return ops


def condition_patch(pod: Mapping[str, Any], status: str, reason: str, message: str, now: str) -> Obj:
    """A strategic merge patch of ``pods/status`` that sets our condition (``message`` cut to what
    the API accepts): conditions merge by ``type``, so the others are kept without reading the pod
    first. The pod's uid is in it, so a pod of the same name that is another object refuses it
    (422: a uid is immutable, tests/cluster/test_pod_patches.py)."""
    meta = pod.get("metadata") or {}
    condition = {
        "type": ALLOCATED_CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    return {"metadata": {"uid": meta.get("uid")}, "status": {"conditions": [condition]}}
