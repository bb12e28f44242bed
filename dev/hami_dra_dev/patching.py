"""PATCH bodies as kube-apiserver applies them, once for the sandbox API server and the unit tests'
``FakeKube`` (``sandbox/patch.py`` and ``tests/controller/fake_patch.py`` turn a refusal into their
own error type).

- JSON patch (RFC 6902): ``add``, ``remove``, ``replace``, ``move``, ``copy`` and ``test``, all or
  nothing; a failed ``test``, a missing path or an index out of range is 422. A ``test`` of null
  passes on a missing member of an object (kube-apiserver's json-patch reads it as null: the
  binder tests that a pod still has no annotations that way).
- JSON merge patch (RFC 7386): maps merge, null removes, anything else replaces.
- Strategic merge patch, for what clients send (``kubectl apply|patch|label``, our controller's
  status patches): maps merge; lists of objects with a merge key (k8s.io/api's ``patchMergeKey``)
  merge item by item in kube-apiserver's order (of the next two, the one earlier in the object
  goes first when the object has both, else the patch's: a new item goes first); ``finalizers``
  as a set; every other list is replaced whole. Directives: ``$patch: replace|delete`` (on a map or
  a list item), ``$retainKeys``, ``$deleteFromPrimitiveList/<field>``; ``$setElementOrder/<field>``
  is read past.

The order and the directives were checked against kube-apiserver 1.37 (a pod's status conditions)
and the controller's patches are, side by side, in tests/controller/test_fake_patch.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

#: List fields (by name) that strategic merge patch merges by a key, as k8s.io/api tags them. A
#: node's ``taints`` have no merge key: kube-apiserver 1.37 replaces them whole ([d] on [a, b]).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "addresses": "type",
    "resourceClaimStatuses": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
#: Primitive lists that strategic merge patch merges as sets.
SET_LISTS: frozenset[str] = frozenset({"finalizers"})

_REJECTED = "the server rejected our request due to an error in our request: "


class PatchError(Exception):
    """A patch the server refuses: its HTTP status, ``Status`` reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def _bad(message: str) -> PatchError:
    return PatchError(400, "BadRequest", message)


def _invalid(message: str) -> PatchError:
    return PatchError(422, "Invalid", _REJECTED + message)


def apply_patch(content_type: str, target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` (decoded) applied, by the request's Content-Type; ``target`` is
    left as it was. PatchError 415 for a kind the server does not take here."""
    kind = content_type.split(";")[0].strip()
    if kind == JSON_PATCH:
        return json_patch(target, patch)
    if kind == MERGE_PATCH:
        return merge_patch(target, patch)
    if kind == STRATEGIC_PATCH:
        return strategic_merge_patch(target, patch)
    raise PatchError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}",
    )


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


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _bad(f"the JSON pointer {path!r} does not start with /")
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
        raise _bad("a JSON patch cannot remove the whole document")
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
        raise _bad("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise _bad(f"invalid JSON patch operation: {json.dumps(op)}")
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
            raise _bad(f"unexpected JSON patch operation {kind!r}")
    return doc


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch (see the module's docstring); None where ``$patch: delete`` removes
    the whole ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {key: copy.deepcopy(value) for key, value in patch.items() if key != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [item for item in result.get(name) or [] if item not in value]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {key: value for key, value in result.items() if key in retain}
    return result


def _directive(item: Any, name: str) -> bool:
    return isinstance(item, dict) and item.get("$patch") == name


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    existing = list(current) if isinstance(current, list) else []
    if field in SET_LISTS:
        return existing + [value for value in patch if value not in existing]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [copy.deepcopy(item) for item in patch if not _directive(item, "delete")]
    if any(_directive(item, "replace") for item in patch):
        return [copy.deepcopy(item) for item in patch if not _directive(item, "replace")]
    return _merge_by_key(key, existing, patch)


def _merge_by_key(key: str, existing: list[Any], patch: list[dict[str, Any]]) -> list[Any]:
    """The patch's items (each merged into the item of its key, in the patch's order; those with
    ``$patch: delete`` gone) and the items only the object has (in its order), interleaved as
    kube-apiserver does: of the next two, the one earlier in the object goes first when the object
    has both, else the patch's."""
    order = [item.get(key) if isinstance(item, dict) else None for item in existing]
    current = {name: item for name, item in zip(order, existing, strict=True) if name is not None}
    patched = [
        strategic_merge_patch(current.get(item.get(key)), item)
        for item in patch
        if not _directive(item, "delete")
    ]
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
