"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge patch is implemented for what clients actually send (``kubectl apply``,
``kubectl patch``, ``kubectl label``): maps merge recursively, lists of objects with a known
merge key merge by that key, ``$patch: delete|replace``, ``$retainKeys``,
``$deleteFromPrimitiveList/<field>`` and ``$setElementOrder/<field>`` directives, and the
primitive lists Kubernetes merges (``finalizers``). Every other list is atomic, which is what
``resource.k8s.io`` declares for its lists.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hami_dra_dev.sandbox.errors import ApiError, bad_request

JSON = Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

#: List fields (by field name) that strategic merge patch merges by a key, as in k8s.io/api's tags.
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
    "taints": "key",
    "addresses": "type",
    "resourceClaimStatuses": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
#: Primitive lists that strategic merge patch merges as sets.
MERGE_PRIMITIVE_LISTS: frozenset[str] = frozenset({"finalizers"})


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386: objects merge, ``null`` deletes, everything else replaces."""
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
        raise bad_request(f"the JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: JSON, parts: list[str], path: str) -> JSON:
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: "
                f"doc is missing path: {path!r}",
            )
    return cur


def _get(doc: JSON, path: str) -> JSON:
    return _container(doc, _pointer(path), path)


def _tested(doc: JSON, path: str, value: JSON) -> JSON:
    """The value a ``test`` op compares: a missing member of an object reads as null when the op
    tests for null (as kube-apiserver's json-patch does: a patch can test that a map is absent)."""
    parts = _pointer(path)
    if value is None and parts:
        parent = _container(doc, parts[:-1], path)
        if isinstance(parent, dict):
            return parent.get(parts[-1])
    return _get(doc, path)


def _add(doc: JSON, path: str, value: JSON, replace: bool = False) -> JSON:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing key: {path}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise ApiError(422, "Invalid", f"index out of range for path {path!r}")
    else:
        raise ApiError(422, "Invalid", f"doc is missing path: {path!r}")
    return doc


def _remove(doc: JSON, path: str) -> JSON:
    parts = _pointer(path)
    if not parts:
        raise bad_request("cannot remove the whole document")
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise ApiError(
            422,
            "Invalid",
            f"the server rejected our request due to an error in our request: "
            f"unable to remove nonexistent key: {path!r}",
        )
    return doc


def json_patch(target: JSON, ops: JSON) -> JSON:
    """RFC 6902 including ``test`` (a failed test is 422 like the real server)."""
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {json.dumps(op)}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "replace":
            doc = _add(doc, path, op.get("value"), replace=True)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op["from"]))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "test":
            if _tested(doc, path, op.get("value")) != op.get("value"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: "
                    f"testing value {path} failed",
                )
        else:
            raise bad_request(f"unexpected json patch operation {kind!r}")
    return doc


def strategic_merge_patch(target: JSON, patch: JSON, field: str = "") -> JSON:
    """Apply a strategic merge patch (see module docstring for what is supported)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, key)
        else:
            result[key] = value
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: JSON, patch: list[Any], field: str) -> list[Any]:
    current_list = current if isinstance(current, list) else []
    if field in MERGE_PRIMITIVE_LISTS:
        return current_list + [v for v in patch if v not in current_list]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return [p for p in copy.deepcopy(patch) if not (isinstance(p, dict) and p.get("$patch") == "delete")]
    if any(p.get("$patch") == "replace" for p in patch):
        return [p for p in copy.deepcopy(patch) if p.get("$patch") != "replace"]
    out = copy.deepcopy(current_list)
    for item in patch:
        idx = next(
            (i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item.get(key)), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def apply_patch(content_type: str, target: JSON, body: bytes) -> JSON:
    """Dispatch on the request's Content-Type; 415 for anything else (as the real server)."""
    ctype = content_type.split(";")[0].strip()
    try:
        patch = json.loads(body or b"null")
    except ValueError as err:
        raise bad_request(f"error decoding patch: {err}") from err
    if ctype == MERGE_PATCH:
        return merge_patch(target, patch)
    if ctype == JSON_PATCH:
        return json_patch(target, patch)
    if ctype == STRATEGIC_PATCH:
        return strategic_merge_patch(target, patch)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted "
        f"media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}",
    )
