"""How ``FakeKube`` applies a PATCH: the three kinds our controller sends, as kube-apiserver does.

- JSON patch (RFC 6902): ``add``, ``remove``, ``replace``, ``move``, ``copy`` and ``test``; a failed
  ``test``, a missing path or an index out of range is 422 and nothing is written. A ``test`` of
  null passes on a missing member of an object (kube-apiserver's json-patch library reads it as
  null: the binder tests that a pod still has no annotations that way).
- JSON merge patch (RFC 7386): maps merge, null removes, anything else replaces.
- Strategic merge patch, for the lists a pod's status patch touches: lists of objects with a merge
  key (``conditions`` by ``type``, ...) merge item by item, in the order kube-apiserver gives them
  (a new item first), ``finalizers`` as a set, other lists are replaced whole; a ``$patch``,
  ``$retainKeys``, ... directive is refused (the fake would apply it wrongly; none of ours sends
  one).

The real server's answers to the binder's patches are checked against these in
tests/controller/test_fake_patch.py (on the API server tier) and tests/cluster/test_pod_patches.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from dra_driver.kube.errors import KubeError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

#: List fields strategic merge patch merges by a key (k8s.io/api's ``patchMergeKey`` tags), for
#: the objects our controller patches.
MERGE_KEYS = {
    "conditions": "type",
    "containerStatuses": "name",
    "resourceClaimStatuses": "name",
    "schedulingGates": "name",
    "ownerReferences": "uid",
}
#: Primitive lists strategic merge patch merges as sets.
SET_LISTS = frozenset({"finalizers"})


def apply_patch(content_type: str, target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` applied (``target`` untouched); KubeError as the server answers."""
    kind = content_type.split(";")[0].strip()
    if kind == JSON_PATCH:
        return json_patch(target, patch)
    if kind == MERGE_PATCH:
        return merge_patch(target, patch)
    if kind == STRATEGIC_PATCH:
        return strategic_merge_patch(target, patch)
    raise KubeError(415, f"the body of the request was in an unknown format: {content_type}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _invalid(message: str) -> KubeError:
    return KubeError(422, f"the server rejected our request due to an error in our request: {message}")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KubeError(400, f"the JSON pointer {path!r} does not start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _at(doc: Any, parts: list[str], path: str) -> Any:
    """The value at ``parts`` (422 when a step is missing)."""
    current = doc
    for part in parts:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise _invalid(f"doc is missing path: {path!r}")
    return current


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, last = _at(doc, parts[:-1], path), parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _invalid(f"replace operation does not apply: doc is missing key: {path}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list) and last == "-" and not replace:
        parent.append(copy.deepcopy(value))
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent) + (0 if replace else 1):
        if replace:
            parent[int(last)] = copy.deepcopy(value)
        else:
            parent.insert(int(last), copy.deepcopy(value))
    else:
        raise _invalid(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise KubeError(400, "a JSON patch cannot remove the whole document")
    parent, last = _at(doc, parts[:-1], path), parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _invalid(f"unable to remove nonexistent key: {path!r}")
    return doc


def _tested(doc: Any, path: str, value: Any) -> Any:
    """What a ``test`` op compares with ``value``: a missing member of an object is null when the
    op tests for null."""
    parts = _pointer(path)
    if value is None and parts:
        parent = _at(doc, parts[:-1], path)
        if isinstance(parent, dict):
            return parent.get(parts[-1])
    return _at(doc, parts, path)


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902, all operations or none."""
    if not isinstance(ops, list):
        raise KubeError(400, "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise KubeError(400, f"invalid JSON patch operation: {json.dumps(op)}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "replace":
            doc = _add(doc, path, op.get("value"), replace=True)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_at(doc, _pointer(op["from"]), op["from"]))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "test":
            if _tested(doc, path, op.get("value")) != op.get("value"):
                raise _invalid(f"testing value {path} failed")
        else:
            raise KubeError(400, f"unexpected JSON patch operation {kind!r}")
    return doc


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch without directives (see the module's docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise ValueError(f"FakeKube does not apply the strategic merge directive {key!r}")
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    existing = list(current) if isinstance(current, list) else []
    if field in SET_LISTS:
        return existing + [value for value in patch if value not in existing]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return copy.deepcopy(patch)
    return _merge_by_key(key, existing, patch)


def _merge_by_key(key: str, existing: list[Any], patch: list[dict[str, Any]]) -> list[Any]:
    """The patch's items (each merged into the item of its key, in the patch's order) and the
    items only the object has (in its order), interleaved as kube-apiserver does: of the next
    two, the one earlier in the object goes first when the object has both, else the patch's."""
    order = [item.get(key) if isinstance(item, dict) else None for item in existing]
    current = {name: item for name, item in zip(order, existing, strict=True) if name is not None}
    patched = [strategic_merge_patch(current.get(item.get(key)), item) for item in patch]
    named = {item.get(key) for item in patch}
    kept = [copy.deepcopy(item) for name, item in zip(order, existing, strict=True) if name not in named]
    merged: list[Any] = []
    while patched and kept:
        ours, theirs = patched[0].get(key), kept[0].get(key) if isinstance(kept[0], dict) else None
        if ours in order and theirs in order and order.index(theirs) < order.index(ours):
            merged.append(kept.pop(0))
        else:
            merged.append(patched.pop(0))
    return merged + patched + kept
