"""Informers: list, then watch from the list's resourceVersion; resume after a dropped stream, relist on 410.

Each informer keeps a cache of its objects keyed by ``namespace/name`` and calls ``on_change(kind,
old, new)`` for every change (``new`` is None for a deletion) from its own thread. After a relist
the cache is replaced and differences are reported as changes, so a consumer that only reacts to
changes never misses a deletion that happened while the watch was down.

What is cached is what the consumer keeps, not what the API sent: every object, listed or watched,
goes through the informer's ``transform`` first (client-go's ``TransformFunc``), and only its result
is stored and handed to ``on_change``; the API's dict is dropped right there. The default drops
``metadata.managedFields`` (server-side apply's bookkeeping, often the largest part of an object,
read by nothing here); a consumer that needs less passes a transform that keeps less
(dra_driver/controller/slim.py). The initial list is read in pages (dra_driver/kube/pager.py), so
the raw objects of at most one page are held at a time, and a ``field_selector`` leaves out, on
the server, the objects the consumer never looks at (another driver's ResourceSlices).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dra_driver.kube.api import KubeApi, Obj, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.kube.pager import DEFAULT_PAGE_SIZE, list_all

log = logging.getLogger(__name__)

ChangeHandler = Callable[[str, Obj | None, Obj | None], None]
#: What an informer keeps of an object the API sent: the object itself, or a smaller copy.
Transform = Callable[[Obj], Obj]


def drop_managed_fields(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields``; every informer's default transform.

    Safe for objects that are later written back whole: an update that carries no managedFields
    keeps the stored ones (the API server resets them only when asked to explicitly).
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Informer:
    """One resource's list+watch loop and cache."""

    def __init__(
        self,
        kube: KubeApi,
        resource: Resource,
        on_change: ChangeHandler,
        *,
        watch_timeout: int = 300,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        optional: bool = False,
        absent_retry: float = 30.0,
        transform: Transform = drop_managed_fields,
        field_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.on_change = on_change
        #: Applied to every object from the API before it is cached or handed on (module docstring).
        self.transform = transform
        #: Only the objects matching this are listed and watched (None: all of them).
        self.field_selector = field_selector
        #: Items per page of the initial list and of every relist (0: one unpaged call).
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        #: An optional resource (a CRD that may not be installed) counts as synced and empty
        #: while the API server does not serve it (404), and is looked for every ``absent_retry``.
        self.optional = optional
        self.absent_retry = absent_retry
        self.absent = False
        self.cache: dict[str, Obj] = {}
        self.lock = threading.RLock()
        self.resource_version = ""
        self.synced = threading.Event()
        self.relists = 0
        self.resumes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.resource.plural}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.cache.values())

    def get(self, key: str) -> Obj | None:
        with self.lock:
            return self.cache.get(key)

    def _run(self) -> None:
        delay = self.backoff
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                self._watch()
                delay = self.backoff
                self.resumes += 1
            except KubeError as err:
                if self.optional and err.not_found:
                    need_list = True
                    self._mark_absent()
                    self._stop.wait(self.absent_retry)
                    continue
                if err.gone:
                    log.info("%s: watch history gone (410), relisting", self.resource.plural)
                    need_list = True
                    continue
                log.warning("%s: %s; retrying in %.1fs", self.resource.plural, err, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self.max_backoff)
            except Exception:  # never let an informer thread die silently
                log.exception("%s: informer error", self.resource.plural)
                self._stop.wait(delay)
                delay = min(delay * 2, self.max_backoff)
                need_list = True

    def _mark_absent(self) -> None:
        if not self.absent:
            log.warning(
                "%s.%s is not served (its CustomResourceDefinition is not installed): treated as "
                "empty, looked for again every %.0fs", self.resource.plural, self.resource.group,
                self.absent_retry,
            )  # fmt: skip
        self.absent = True
        with self.lock:
            gone, self.cache = self.cache, {}
        for obj in gone.values():
            self.on_change(self.resource.kind, obj, None)
        self.synced.set()

    def _keep(self, obj: Obj) -> Obj:
        """What the cache keeps of an object from the API (a list's items carry no kind)."""
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        return self.transform(obj)

    def _relist(self) -> None:
        listing = list_all(
            self.kube, self.resource, self._keep, field_selector=self.field_selector, page_size=self.page_size
        )
        fresh = {object_key(item): item for item in listing.items}
        with self.lock:
            old_cache = self.cache
            self.cache = fresh
            self.resource_version = listing.resource_version
            self.relists += 1
        if self.absent:
            log.info("%s.%s is served now", self.resource.plural, self.resource.group)
            self.absent = False
        for key, gone in old_cache.items():
            if key not in fresh:
                self.on_change(self.resource.kind, gone, None)
        for key, new in fresh.items():
            previous = old_cache.get(key)
            if previous is None or _rv(previous) != _rv(new):
                self.on_change(self.resource.kind, previous, new)
        self.synced.set()

    def _watch(self) -> None:
        events = self.kube.watch(
            self.resource, self.resource_version, self.watch_timeout, field_selector=self.field_selector
        )
        for event in events:
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            if kind == "BOOKMARK":
                self.resource_version = rv or self.resource_version
                continue
            obj = self._keep(obj)
            key = object_key(obj)
            with self.lock:
                old = self.cache.get(key)
                if kind == "DELETED":
                    self.cache.pop(key, None)
                else:
                    self.cache[key] = obj
                if rv:
                    self.resource_version = rv
            self.on_change(self.resource.kind, old, None if kind == "DELETED" else obj)


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
