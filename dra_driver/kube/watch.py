"""Informers: list, then watch from the list's resourceVersion; resume after a dropped stream, relist on 410.

Each informer keeps a cache of its objects keyed by ``namespace/name`` and calls ``on_change(kind,
old, new)`` for every change (``new`` is None for a deletion) from its own thread. After a relist
the cache is replaced and differences are reported as changes, so a consumer that only reacts to
changes never misses a deletion that happened while the watch was down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dra_driver.kube.api import KubeApi, Obj, Resource
from dra_driver.kube.errors import KubeError

log = logging.getLogger(__name__)

ChangeHandler = Callable[[str, Obj | None, Obj | None], None]


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
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.on_change = on_change
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

    def _relist(self) -> None:
        listing = self.kube.list(self.resource)
        items = listing.get("items") or []
        fresh = {}
        for item in items:
            item.setdefault("apiVersion", self.resource.api_version)
            item.setdefault("kind", self.resource.kind)
            fresh[object_key(item)] = item
        with self.lock:
            old_cache = self.cache
            self.cache = fresh
            self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
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
        for event in self.kube.watch(self.resource, self.resource_version, self.watch_timeout):
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            if kind == "BOOKMARK":
                self.resource_version = rv or self.resource_version
                continue
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
