"""The API semantics, independent of HTTP: what create / update / patch / delete / watch mean.

The HTTP handler and the in-process simulator both go through this class, so a write from the
simulated kube-scheduler is validated and admitted exactly like one from the driver.

Write path (as in kube-apiserver's generic registry): decode -> mutating admission ->
PrepareForCreate/Update (server fields, status subresource rules, generation) -> validation
(schema + rules) -> validating admission -> optimistic-concurrency commit. Unconditional
updates and patches retry on a concurrent change; a stale ``resourceVersion`` is 409 Conflict.
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.admission import Admission
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.patch import apply_patch
from hami_dra_dev.sandbox.resources import RESOURCE_TYPES, ResourceType, by_key, require, to_storage, to_view
from hami_dra_dev.sandbox.selectors import make_filter
from hami_dra_dev.sandbox.store import Event, Store, Watcher
from hami_dra_dev.sandbox.validation import Validator

log = logging.getLogger(__name__)

NAMESPACES = require("", "v1", "namespaces")
PODS = require("", "v1", "pods")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_RETRIES = 50


def now() -> str:
    """RFC 3339 seconds, UTC, as Kubernetes serializes metav1.Time."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def default_pod(pod: Obj) -> None:
    """The Pod defaults kube-apiserver fills in that clients commonly read back."""
    spec = pod.setdefault("spec", {})
    for key, value in (
        ("restartPolicy", "Always"),
        ("dnsPolicy", "ClusterFirst"),
        ("schedulerName", "default-scheduler"),
        ("terminationGracePeriodSeconds", 30),
        ("securityContext", {}),
        ("enableServiceLinks", True),
        ("priority", 0),
        ("preemptionPolicy", "PreemptLowerPriority"),
    ):
        spec.setdefault(key, value)
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("resources", {})


@dataclass
class WriteOptions:
    """Per-request options: ``dryRun=All``, the requesting user, and warnings collected for the reply."""

    dry_run: bool = False
    user: str = "sandbox-admin"
    warnings: list[str] | None = None


class Api:
    """See module docstring. ``history_window`` bounds the watch history (older RVs get 410)."""

    def __init__(self, kube_version: str = "1.36", history_window: int = 10000) -> None:
        self.kube_version = kube_version
        self.store = Store(history_window)
        self.validator = Validator(kube_version)
        self.admission = Admission(self._webhook_configs, lambda ns: self.store.get("namespaces", ("", ns)))
        self._gc_queue: queue.Queue[tuple[str, Obj] | None] = queue.Queue()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="sandbox-gc", daemon=True)
        self._gc_thread.start()
        for ns in DEFAULT_NAMESPACES:
            self.create(NAMESPACES, "", {"metadata": {"name": ns}})

    def close(self) -> None:
        self._gc_queue.put(None)
        self.store.close_watches()

    def _webhook_configs(self, resource: str) -> list[Obj]:
        return self.store.items(f"{resource}.admissionregistration.k8s.io")[0]

    # ----------------------------------------------------------------------------------- reads

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        obj = self.store.get(rt.storage_key, (ns if rt.namespaced else "", name))
        if obj is None:
            raise e.not_found(rt, name)
        return to_view(rt, obj)

    def list_objects(
        self,
        rt: ResourceType,
        ns: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], int]:
        predicate = make_filter(label_selector, field_selector, rt)
        items, rv = self.store.items(rt.storage_key, ns or None if rt.namespaced else None)
        return [o for o in (to_view(rt, item) for item in items) if predicate(o)], rv

    def watch(self, rt: ResourceType, ns: str | None, since: int | None) -> tuple[Watcher, list[Event]]:
        """Watch ``rt``'s objects; the events carry stored objects: :meth:`present` shows them as ``rt``."""
        return self.store.watch(rt.storage_key, ns or None if rt.namespaced else None, since)

    @staticmethod
    def present(rt: ResourceType, obj: Obj) -> Obj:
        """A stored object (from a watch event) as ``rt`` shows it."""
        return to_view(rt, obj)

    def _put(self, rt: ResourceType, key: tuple[str, str], obj: Obj, expect_rv: str | None, kind: str) -> Obj:
        """``store.put`` for ``rt``'s objects: views are converted to the stored shape and back."""
        return to_view(rt, self.store.put(rt.storage_key, key, to_storage(rt, obj), expect_rv, kind))

    def _remove(self, rt: ResourceType, key: tuple[str, str], expect_rv: str) -> Obj:
        return to_view(rt, self.store.remove(rt.storage_key, key, expect_rv))

    # ----------------------------------------------------------------------------------- helpers

    def _check_body(self, rt: ResourceType, ns: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise e.bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        if obj.get("apiVersion", rt.api_version) != rt.api_version or obj.get("kind", rt.kind) != rt.kind:
            raise e.bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
                f"API version ({rt.api_version})"
                if obj.get("kind", rt.kind) == rt.kind
                else f"the kind in the data ({obj.get('kind')}) does not match the expected kind ({rt.kind})"
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise e.bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise e.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        for k in list(meta):
            if meta[k] is None:
                del meta[k]
        return obj

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if not rt.namespaced:
            return
        nsobj = self.store.get("namespaces", ("", ns))
        if nsobj is None:
            raise e.not_found(NAMESPACES, ns)
        if nsobj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{rt.plural} "{ns}" is forbidden: unable to create new content in '
                f"namespace {ns} because it is being terminated",
            )

    def _admit(
        self,
        mutating: bool,
        op: str,
        rt: ResourceType,
        sub: str,
        obj: Obj,
        old: Obj | None,
        ns: str,
        opts: WriteOptions,
    ) -> Obj:
        if rt.group == "admissionregistration.k8s.io":
            return obj  # like kube-apiserver: webhooks are never called for webhook configurations
        return self.admission.run(mutating, op, rt, sub, obj, old, ns, opts.user, opts.dry_run, opts.warnings)

    # ----------------------------------------------------------------------------------- create

    def create(self, rt: ResourceType, ns: str, body: Any, opts: WriteOptions | None = None) -> Obj:
        opts = opts or WriteOptions()
        obj = self._check_body(rt, ns, body)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise e.bad_request("resourceVersion should not be set on objects to be created")
        self._check_namespace(rt, ns)
        obj = self._admit(True, "CREATE", rt, "", obj, None, ns, opts)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "managedFields"):
            meta.pop(k, None)
        self._prepare_create(rt, obj)
        self.validator.validate(rt, obj, None)
        self._admit(False, "CREATE", rt, "", obj, None, ns, opts)
        if opts.dry_run:
            return obj
        try:
            return self._put(rt, (meta.get("namespace", ""), meta["name"]), obj, None, "ADDED")
        except KeyError as err:
            raise e.already_exists(rt, meta["name"]) from err

    def _prepare_create(self, rt: ResourceType, obj: Obj) -> None:
        if rt.reset_status_on_create:
            obj.pop("status", None)
        if rt.key == "pods":
            default_pod(obj)
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            if obj["spec"].get("schedulingGates"):
                obj["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "SchedulingGated",
                        "message": "Scheduling is blocked due to non-empty scheduling gates",
                        "lastTransitionTime": now(),
                    }
                ]
        elif rt.key == "namespaces":
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["status"] = {"phase": "Active"}

    # ----------------------------------------------------------------------------------- update / patch

    def update(
        self, rt: ResourceType, ns: str, name: str, body: Any, sub: str = "", opts: WriteOptions | None = None
    ) -> Obj:
        """PUT: the body replaces the object (or only its status for ``sub == "status"``)."""
        obj = self._check_body(rt, ns, body)
        if obj["metadata"].get("name", name) != name:
            raise e.bad_request(
                f"the name of the object ({obj['metadata']['name']}) does not match the name on the "
                f"URL ({name})"
            )
        want_rv = obj["metadata"].get("resourceVersion") or None
        return self._guaranteed_update(
            rt, ns, name, lambda _current: obj, want_rv, sub, opts or WriteOptions()
        )

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        body: bytes,
        sub: str = "",
        opts: WriteOptions | None = None,
    ) -> Obj:
        def mutate(current: Obj) -> Obj:
            patched = apply_patch(content_type, current, body)
            if not isinstance(patched, dict):
                raise e.bad_request("the patch did not produce an object")
            return self._check_body(rt, ns, patched)

        want: list[str | None] = [None]

        def mutate_checked(current: Obj) -> Obj:
            patched = mutate(current)
            rv = patched["metadata"].get("resourceVersion")
            # A resourceVersion inside the patch is a precondition, as for the real server.
            want[0] = rv if rv and rv != current["metadata"]["resourceVersion"] else None
            if want[0] is not None:
                raise e.conflict(rt, name, e.STALE)
            uid = patched["metadata"].get("uid")
            if uid and uid != current["metadata"]["uid"]:
                # A patch's uid is not a precondition (an Update's is, 409): the real server
                # answers as for any edit of an immutable field (tests/cluster/test_pod_patches.py).
                raise e.invalid_object(rt, name, [e.invalid("metadata.uid", uid, "field is immutable")])
            return patched

        return self._guaranteed_update(rt, ns, name, mutate_checked, None, sub, opts or WriteOptions())

    def _guaranteed_update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        want_rv: str | None,
        sub: str,
        opts: WriteOptions,
    ) -> Obj:
        if sub and (sub != "status" or not rt.has_status):
            raise e.not_found(rt, f"{name}/{sub}")
        key = (ns if rt.namespaced else "", name)
        for _ in range(_RETRIES):
            current = self.get(rt, ns, name)
            cur_rv = current["metadata"]["resourceVersion"]
            if want_rv is not None and want_rv != cur_rv:
                raise e.conflict(rt, name, e.STALE)
            new = mutate(copy.deepcopy(current))
            uid = new["metadata"].get("uid")
            if uid and uid != current["metadata"]["uid"]:
                raise e.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    f"{current['metadata']['uid']}",
                )
            if new["metadata"].get("name", name) != name:
                raise e.invalid_object(
                    rt, name, [e.invalid("metadata.name", new["metadata"]["name"], "field is immutable")]
                )
            new["metadata"]["name"] = name
            new = self._prepare_update(rt, new, current, sub)
            new = self._admit(True, "UPDATE", rt, sub, new, current, ns, opts)
            new = self._prepare_update(rt, new, current, sub)
            if self._same(new, current):
                return current
            self.validator.validate(rt, new, current, status_only=sub == "status")
            self._admit(False, "UPDATE", rt, sub, new, current, ns, opts)
            if opts.dry_run:
                return new
            meta = new["metadata"]
            try:
                if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                    # The last finalizer is gone: record the update, then the object disappears.
                    stored = self._put(rt, key, new, cur_rv, "MODIFIED")
                    gone = self._remove(rt, key, stored["metadata"]["resourceVersion"])
                    self._gc_queue.put((rt.storage_key, gone))
                    return gone
                return self._put(rt, key, new, cur_rv, "MODIFIED")
            except KeyError:
                if want_rv is not None:
                    raise e.conflict(rt, name, e.STALE) from None
        raise e.conflict(rt, name, "too many concurrent updates, please retry")

    @staticmethod
    def _same(a: Obj, b: Obj) -> bool:
        a2, b2 = copy.deepcopy(a), copy.deepcopy(b)
        a2["metadata"].pop("resourceVersion", None)
        b2["metadata"].pop("resourceVersion", None)
        return a2 == b2

    def _prepare_update(self, rt: ResourceType, new: Obj, old: Obj, sub: str) -> Obj:
        """Status subresource rules, server-managed metadata and generation."""
        if sub == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            if rt.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            meta, old_meta = new["metadata"], old["metadata"]
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if k in old_meta:
                    meta[k] = old_meta[k]
                else:
                    meta.pop(k, None)
            meta.pop("managedFields", None)
            if _spec_part(new) != _spec_part(old):
                meta["generation"] = old_meta.get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return new

    # ----------------------------------------------------------------------------------- pods/binding

    def bind(self, ns: str, name: str, body: Any, opts: WriteOptions | None = None) -> Obj:
        """``POST pods/<name>/binding``: what kube-scheduler uses to set ``spec.nodeName``."""
        node = ((body or {}).get("target") or {}).get("name")
        if not node:
            raise e.invalid_object(PODS, name, [e.required("target.name")])
        for _ in range(_RETRIES):
            pod = self.get(PODS, ns, name)
            if pod["spec"].get("nodeName"):
                raise e.conflict(
                    PODS, name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
                )
            if pod["spec"].get("schedulingGates"):
                raise e.conflict(PODS, name, "pod has scheduling gates")
            rv = pod["metadata"]["resourceVersion"]
            pod["spec"]["nodeName"] = node
            conds = [
                c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"
            ]
            conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()})
            pod.setdefault("status", {})["conditions"] = conds
            try:
                self.store.put(PODS.key, (ns, name), pod, rv, "MODIFIED")
                return {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                }
            except KeyError:
                continue
        raise e.conflict(PODS, name, "too many concurrent updates")

    # ----------------------------------------------------------------------------------- pods/eviction

    def evict(self, ns: str, name: str, body: Any, opts: WriteOptions | None = None) -> Obj:
        """``POST pods/<name>/eviction`` (``policy/v1`` Eviction): the sandbox serves no
        PodDisruptionBudgets, so every eviction is allowed: the pod is deleted with the
        eviction's ``deleteOptions`` (a uid precondition, a dry run), as the Eviction API does
        once the budgets agree."""
        options = dict((body or {}).get("deleteOptions") or {})
        dry_run = bool(options.pop("dryRun", None)) or (opts is not None and opts.dry_run)
        user = opts.user if opts is not None else WriteOptions().user
        self.delete(PODS, ns, name, options, WriteOptions(dry_run=dry_run, user=user))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # ----------------------------------------------------------------------------------- delete

    def delete(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        options: Obj | None = None,
        opts: WriteOptions | None = None,
    ) -> tuple[Obj, bool]:
        """Delete now, or set ``deletionTimestamp`` while finalizers remain; dependents are GC'd."""
        options = options or {}
        opts = opts or WriteOptions()
        key = (ns if rt.namespaced else "", name)
        for _ in range(_RETRIES):
            current = self.get(rt, ns, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
                raise e.conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                    f"meta: {current['metadata']['uid']}",
                )
            if (
                pre.get("resourceVersion")
                and pre["resourceVersion"] != current["metadata"]["resourceVersion"]
            ):
                raise e.conflict(
                    rt,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{current['metadata']['resourceVersion']}",
                )
            self._admit(False, "DELETE", rt, "", current, current, ns, opts)
            if opts.dry_run:
                return current, False
            orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
            meta = current["metadata"]
            rv = meta["resourceVersion"]
            try:
                if meta.get("finalizers") or rt.key == "namespaces":
                    if meta.get("deletionTimestamp"):
                        return current, False
                    meta["deletionTimestamp"] = now()
                    meta["deletionGracePeriodSeconds"] = 0
                    if rt.key == "namespaces":
                        current.setdefault("status", {})["phase"] = "Terminating"
                    stored = self._put(rt, key, current, rv, "MODIFIED")
                    if orphan:
                        self._gc_queue.put(("__orphan__", stored))
                    if rt.key == "namespaces":
                        self._gc_queue.put(("__namespace__", stored))
                    return stored, False
                gone = self._remove(rt, key, rv)
            except KeyError:
                continue
            self._gc_queue.put(("__orphan__" if orphan else rt.storage_key, gone))
            if rt.returns_deleted_object:
                return gone, True
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": meta["uid"]},
            }, True
        raise e.conflict(rt, name, "too many concurrent updates")

    # ----------------------------------------------------------------------------------- garbage collection

    def _gc_loop(self) -> None:
        while (item := self._gc_queue.get()) is not None:
            kind, owner = item
            if kind == "__barrier__":
                owner["_event"].set()
                continue
            try:
                if kind == "__namespace__":
                    self._drain_namespace(owner["metadata"]["name"])
                else:
                    self._collect(owner["metadata"]["uid"], orphan=kind == "__orphan__")
            except Exception:  # the GC must survive anything a test throws at it
                log.exception("sandbox garbage collector failed on %s", owner.get("metadata", {}).get("name"))

    def _collect(self, owner_uid: str, orphan: bool) -> None:
        """Delete (or orphan) every object owned by ``owner_uid`` that has no other owner left."""
        live = {o["metadata"]["uid"] for _, o in self.store.iter_all()}
        for key, obj in self.store.iter_all():
            refs = obj["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == owner_uid for r in refs):
                continue
            rt = by_key(key)
            ns, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
            remaining = [r for r in refs if r.get("uid") != owner_uid and r.get("uid") in live]
            try:
                if remaining or orphan:
                    patch = json.dumps({"metadata": {"ownerReferences": remaining or None}}).encode()
                    self.patch(rt, ns, name, "application/merge-patch+json", patch)
                else:
                    self.delete(rt, ns, name, {"propagationPolicy": "Background"})
            except ApiError as err:
                if err.code != 404:
                    log.warning("garbage collection of %s %s/%s failed: %s", key, ns, name, err.message)

    def _drain_namespace(self, ns: str) -> None:
        for rt in RESOURCE_TYPES:
            if not rt.namespaced or rt.storage:  # a view's objects are deleted as their own resource's
                continue
            for obj in self.store.items(rt.key, ns)[0]:
                try:
                    self.delete(rt, ns, obj["metadata"]["name"])
                except ApiError as err:
                    if err.code != 404:
                        log.warning(
                            "namespace cleanup of %s/%s failed: %s", ns, obj["metadata"]["name"], err.message
                        )
        current = self.store.get("namespaces", ("", ns))
        if current is not None:
            remaining = any(self.store.items(rt.key, ns)[0] for rt in RESOURCE_TYPES if rt.namespaced)
            if not remaining:
                self.store.remove("namespaces", ("", ns), current["metadata"]["resourceVersion"])
            else:  # objects with finalizers: try again when they are gone
                threading.Timer(0.2, lambda: self._gc_queue.put(("__namespace__", current))).start()

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Block until queued garbage collection has run (tests use this instead of sleeping)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = threading.Event()
            self._gc_queue.put(("__barrier__", {"_event": done}))
            done.wait(max(0.0, deadline - time.monotonic()))
            if self._gc_queue.empty():
                return


def decode_continue(token: str | None) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["ns"]), str(data["name"])
    except (ValueError, KeyError, TypeError) as err:
        raise e.bad_request("continue key is not valid: illegal base64 data") from err


def encode_continue(obj: Obj) -> str:
    meta = obj["metadata"]
    return base64.urlsafe_b64encode(
        json.dumps({"ns": meta.get("namespace", ""), "name": meta["name"]}).encode()
    ).decode()
