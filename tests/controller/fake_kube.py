"""``FakeKube``: the controller's ``KubeApi`` in memory, with the API server's write rules that the
reconciler relies on, so the reconciler is unit-tested without an API server.

Rules kept: a write must carry the stored resourceVersion (409 otherwise) and bumps it; writing
``status`` (``status=True``) changes only status, any other write keeps the stored status; a
missing object is a 404; a patch (JSON patch, merge or strategic merge, applied as the server does by
tests/controller/fake_patch.py) needs no resourceVersion, a failed JSON-patch ``test`` is 422 and a
``metadata.uid`` in it that is not the object's 422 (immutable; a resourceVersion in it is a
precondition, 409), and
a pod's scheduling gates can only be removed (422), as kube-apiserver answers
(tests/cluster/test_pod_patches.py); ``create`` assigns uid, resourceVersion and a creation timestamp (or,
with ``generateName``, a name). ``fail(...)`` makes the next matching calls raise a chosen error
(a conflict, a 500, a timeout), and every call is recorded in ``calls``. An eviction
(``pods/NAME/eviction``, recorded as a create of ``evictions``) gives the pod its
deletionTimestamp and the Eviction API's DisruptionTarget condition, or is refused with 429 where
``budgets`` allows no disruption.

Events are stored once, in the core/v1 shape, and served as both ``v1`` and ``events.k8s.io/v1``
(``EVENTS_V1``: ``note``/``regarding``/``series``), as the API server does; an update of an Event
without a resourceVersion is unconditional (events allow it).
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dra_driver.kube.api import Obj, Resource, patch_content_type
from dra_driver.kube.errors import KubeError
from dra_driver.kube.events import core_from_v1, v1_from_core
from tests.controller.fake_patch import apply_patch

#: Resources with a status subresource (the others store status like any field).
WITH_STATUS = {"pods", "resourceclaims", "gpuquotas", "nodes", "resourcequotas"}
#: Resources whose updates may leave out the resourceVersion (the API's AllowUnconditionalUpdate).
UNCONDITIONAL = {"events"}


def _is_view(resource: Resource) -> bool:
    """``events.k8s.io/v1`` events: the core events in another shape."""
    return resource.group == "events.k8s.io" and resource.plural == "events"


def _stored(resource: Resource, obj: Obj) -> Obj:
    return core_from_v1(obj) if _is_view(resource) else obj


def _shown(resource: Resource, obj: Obj) -> Obj:
    return v1_from_core(obj) if _is_view(resource) else obj


@dataclass
class Failure:
    method: str
    plural: str
    status: int
    message: str
    times: int


@dataclass
class FakeKube:
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (method, plural, name)
    _failures: list[Failure] = field(default_factory=list)
    _rv: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: Pod key -> the disruptions its PodDisruptionBudget still allows (a pod not named here has
    #: none): an eviction past it is refused with 429, as the Eviction API answers.
    budgets: dict[str, int] = field(default_factory=dict)

    # --- test controls ---------------------------------------------------------------------------
    def fail(
        self, method: str, plural: str, status: int = 500, message: str = "injected", times: int = 1
    ) -> None:
        self._failures.append(Failure(method, plural, status, message, times))

    def writes(self, plural: str | None = None) -> list[tuple[str, str, str]]:
        return [
            c
            for c in self.calls
            if c[0] in ("create", "update", "update/status", "patch", "patch/status")
            and plural in (None, c[1])
        ]

    def stored(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return _shown(resource, copy.deepcopy(self.objects[(resource.plural, namespace or "", name)]))

    def put(self, resource: Resource, obj: Obj) -> Obj:
        """Store ``obj`` as if it had been there all along (test set-up; no rules applied)."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-12-01T00:00:00Z")
        meta["resourceVersion"] = str(next(self._rv))
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        stored = _stored(resource, obj)
        self.objects[(resource.plural, meta.get("namespace") or "", meta["name"])] = copy.deepcopy(stored)
        return _shown(resource, copy.deepcopy(stored))

    # --- KubeApi ---------------------------------------------------------------------------------
    def _check(self, method: str, resource: Resource, name: str) -> None:
        self.calls.append((method, resource.plural, name))
        for failure in self._failures:
            if failure.times and failure.method == method and failure.plural == resource.plural:
                failure.times -= 1
                raise KubeError(failure.status, failure.message)

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        self._check("get", resource, name)
        key = (resource.plural, namespace or "", name)
        if key not in self.objects:
            raise KubeError(404, f'{resource.plural} "{name}" not found')
        return _shown(resource, copy.deepcopy(self.objects[key]))

    def list(
        self,
        resource: Resource,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
    ) -> Obj:
        """The stored objects in key order; ``field_selector``: ``path=value`` terms joined by
        commas (equality only); ``limit``/``continue_from``: one page, whose token is the key of the
        page's last item (it never expires here)."""
        self._check("list", resource, "")
        terms = [term.partition("=")[::2] for term in (field_selector or "").split(",") if term]
        after = tuple(json.loads(continue_from)) if continue_from else None
        keys = [
            key
            for key, o in sorted(self.objects.items())
            if key[0] == resource.plural
            and (after is None or key > after)
            and all(_field(o, path) == value for path, value in terms)
        ]
        page = keys[:limit] if limit else keys
        items = [_shown(resource, copy.deepcopy(self.objects[key])) for key in page]
        meta: Obj = {"resourceVersion": str(next(self._rv))}
        if len(page) < len(keys):
            meta["continue"] = json.dumps(page[-1])
        return {"items": items, "metadata": meta}

    def create(self, resource: Resource, namespace: str | None, obj: Obj) -> Obj:
        if resource.plural.startswith("pods/") and resource.plural.endswith("/eviction"):
            return self._evict(namespace or "", resource.plural.split("/")[1], obj)
        body = copy.deepcopy(obj)
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        self._check("create", resource, str(meta.get("name")))
        if namespace:
            meta["namespace"] = namespace
        if (resource.plural, namespace or "", meta["name"]) in self.objects:
            raise KubeError(409, f'{resource.plural} "{meta["name"]}" already exists')
        meta.pop("resourceVersion", None)
        return self.put(resource, body)

    def _evict(self, namespace: str, name: str, eviction: Obj) -> Obj:
        """``POST pods/NAME/eviction``: the pod gets its deletionTimestamp (it terminates), unless
        its budget allows no disruption (429), it is gone (404) or another uid (409); a dry run
        (``deleteOptions.dryRun``) answers the same and changes nothing."""
        self._check("create", Resource("", "v1", "evictions", "Eviction", True), name)
        options = eviction.get("deleteOptions") or {}
        key = ("pods", namespace, name)
        current = self.objects.get(key)
        if current is None:
            raise KubeError(404, f'pods "{name}" not found')
        uid = (options.get("preconditions") or {}).get("uid")
        if uid is not None and uid != current["metadata"]["uid"]:
            raise KubeError(409, "Precondition failed: UID in precondition does not match")
        budget = self.budgets.get(f"{namespace}/{name}")
        if budget is not None and budget <= 0:
            raise KubeError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        if options.get("dryRun"):
            return {"kind": "Status", "status": "Success"}
        if budget is not None:
            self.budgets[f"{namespace}/{name}"] = budget - 1
        current["metadata"].setdefault("deletionTimestamp", "2026-12-01T12:00:00Z")
        # As kube-apiserver does (tests/kube/test_eviction.py): the Eviction API writes its own
        # DisruptionTarget condition, replacing one of that type already there.
        status = current.setdefault("status", {})
        others = [c for c in status.get("conditions") or () if c.get("type") != "DisruptionTarget"]
        evicting = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting"}  # fmt: skip
        status["conditions"] = [*others, evicting]
        current["metadata"]["resourceVersion"] = str(next(self._rv))
        return {"kind": "Status", "status": "Success"}

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
        meta = obj["metadata"]
        self._check("update/status" if status else "update", resource, str(meta["name"]))
        key = (resource.plural, meta.get("namespace") or "", meta["name"])
        current = self.objects.get(key)
        if current is None:
            raise KubeError(404, f'{resource.plural} "{meta["name"]}" not found')
        unconditional = resource.plural in UNCONDITIONAL and not meta.get("resourceVersion")
        if not unconditional and str(meta.get("resourceVersion")) != current["metadata"]["resourceVersion"]:
            raise KubeError(
                409, "the object has been modified; please apply your changes to the latest version"
            )
        if status:
            new = copy.deepcopy(current)
            new["status"] = copy.deepcopy(obj.get("status") or {})
        else:
            new = _stored(resource, copy.deepcopy(obj))
            if resource.plural in WITH_STATUS:
                new["status"] = copy.deepcopy(current.get("status") or {})
            new["metadata"]["uid"] = current["metadata"]["uid"]
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = new
        return _shown(resource, copy.deepcopy(new))

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        status: bool = False,
        strategic: bool = False,
    ) -> Obj:
        self._check("patch/status" if status else "patch", resource, name)
        key = (resource.plural, namespace or "", name)
        current = self.objects.get(key)
        if current is None:
            raise KubeError(404, f'{resource.plural} "{name}" not found')
        shown = _shown(resource, copy.deepcopy(current))
        patched = apply_patch(patch_content_type(patch, strategic=strategic), shown, patch)
        meta = patched.get("metadata") or {}
        if meta.get("uid") != current["metadata"]["uid"]:
            raise KubeError(422, f"metadata.uid: Invalid value: {meta.get('uid')!r}: field is immutable")
        if str(meta.get("resourceVersion")) != current["metadata"]["resourceVersion"]:
            raise KubeError(
                409, "the object has been modified; please apply your changes to the latest version"
            )
        if resource.plural == "pods" and not _only_removed(current, patched):
            raise KubeError(422, "spec.schedulingGates: Forbidden: only deletion is allowed")
        if status:
            new = copy.deepcopy(current)
            new["status"] = copy.deepcopy(patched.get("status") or {})
        else:
            new = _stored(resource, patched)
            if resource.plural in WITH_STATUS:
                new["status"] = copy.deepcopy(current.get("status") or {})
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = new
        return _shown(resource, copy.deepcopy(new))

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> Iterator[Obj]:
        return iter(())


def _field(obj: Obj, path: str) -> str:
    """A field selector's value of ``obj`` (``spec.driver``): the dotted path's string, or ''."""
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _only_removed(current: Obj, patched: Obj) -> bool:
    """Whether ``patched`` keeps the pod's scheduling gates or removes some, in order (the only
    change kube-apiserver allows)."""
    before = [gate.get("name") for gate in (current.get("spec") or {}).get("schedulingGates") or ()]
    after = iter(before)
    return all(gate.get("name") in after for gate in (patched.get("spec") or {}).get("schedulingGates") or ())
