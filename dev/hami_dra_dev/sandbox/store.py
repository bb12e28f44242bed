"""The sandbox's etcd: one lock, one global resourceVersion, a bounded event history, watchers.

Every write bumps the global resourceVersion (like etcd's revision) and appends an event to the
history. Watches resume from any resourceVersion still in the history; older ones get 410 Gone,
which is how clients learn to relist. ``history_window`` bounds the number of events kept.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from dra_driver.kube.api import Obj

Key = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Event:
    """One change: ``type`` is ADDED / MODIFIED / DELETED; ``old`` is the previous state (if any)."""

    type: str
    rv: int
    resource: str
    obj: Obj
    old: Obj | None = None


@dataclass
class Watcher:
    """A subscription to one resource (optionally one namespace); events arrive on ``queue``.

    ``None`` on the queue means "stop" (server shutdown or an injected watch close).
    """

    resource: str
    namespace: str | None
    queue: queue.Queue[Event | None] = field(default_factory=queue.Queue)
    closed: bool = False

    def wants(self, event: Event) -> bool:
        if event.resource != self.resource:
            return False
        return self.namespace is None or event.obj["metadata"].get("namespace") == self.namespace

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put(None)


class TooOld(Exception):
    """The requested resourceVersion has been compacted away (HTTP 410 Gone)."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class Store:
    """Thread-safe objects by resource and (namespace, name); see module docstring."""

    def __init__(self, history_window: int = 10000) -> None:
        self.lock = threading.RLock()
        self.rv = 1
        self.history_window = history_window
        self._objects: dict[str, dict[Key, Obj]] = {}
        self._history: deque[Event] = deque()
        self._compacted = 0  # every event with rv <= this has been dropped
        self._watchers: list[Watcher] = []

    # ----------------------------------------------------------------------------------- reads

    def get(self, resource: str, key: Key) -> Obj | None:
        with self.lock:
            obj = self._objects.get(resource, {}).get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def items(self, resource: str, namespace: str | None = None) -> tuple[list[Obj], int]:
        """All objects of a resource sorted like etcd keys (namespace, name), and the current RV."""
        with self.lock:
            objs = self._objects.get(resource, {})
            keys = sorted(k for k in objs if namespace is None or k[0] == namespace)
            return [copy.deepcopy(objs[k]) for k in keys], self.rv

    def iter_all(self) -> Iterator[tuple[str, Obj]]:
        """Snapshot of every object (resource key, object) - for garbage collection scans."""
        with self.lock:
            snapshot = [(r, copy.deepcopy(o)) for r, objs in self._objects.items() for o in objs.values()]
        return iter(snapshot)

    # ----------------------------------------------------------------------------------- writes

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, resource: str, key: Key, obj: Obj, expect_rv: str | None, event_type: str) -> Obj:
        """Store ``obj`` if the current object's RV is ``expect_rv`` (None = must not exist).

        Returns the stored copy (with its new resourceVersion); raises KeyError on a mismatch.
        Callers hold no lock: the check and the write happen atomically here.
        """
        with self.lock:
            objs = self._objects.setdefault(resource, {})
            current = objs.get(key)
            current_rv = current["metadata"]["resourceVersion"] if current is not None else None
            if current_rv != expect_rv:
                raise KeyError(current_rv)
            stored = copy.deepcopy(obj)
            rv = self._next_rv()
            stored["metadata"]["resourceVersion"] = str(rv)
            objs[key] = stored
            self._emit(Event(event_type, rv, resource, stored, current))
            return copy.deepcopy(stored)

    def remove(self, resource: str, key: Key, expect_rv: str) -> Obj:
        """Remove an object whose RV is ``expect_rv``; the DELETED event carries a fresh RV."""
        with self.lock:
            objs = self._objects.setdefault(resource, {})
            current = objs.get(key)
            if current is None or current["metadata"]["resourceVersion"] != expect_rv:
                raise KeyError(current["metadata"]["resourceVersion"] if current else None)
            del objs[key]
            rv = self._next_rv()
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(rv)
            self._emit(Event("DELETED", rv, resource, gone, current))
            return copy.deepcopy(gone)

    def _emit(self, event: Event) -> None:
        self._history.append(event)
        while len(self._history) > self.history_window:
            self._compacted = self._history.popleft().rv
        for w in self._watchers:
            if not w.closed and w.wants(event):
                w.queue.put(event)

    def compact(self) -> None:
        """Drop the whole history, as an etcd compaction would: every older RV now gets 410."""
        with self.lock:
            if self._history:
                self._compacted = self._history[-1].rv
                self._history.clear()

    # ----------------------------------------------------------------------------------- watch

    def watch(self, resource: str, namespace: str | None, since: int | None) -> tuple[Watcher, list[Event]]:
        """Subscribe; with ``since`` also return the retained events after it (410 if compacted).

        The backlog and the subscription are taken under one lock, so no event is lost or doubled.
        """
        with self.lock:
            backlog: list[Event] = []
            watcher = Watcher(resource, namespace)
            if since is not None:
                if since < self._compacted:
                    raise TooOld(since, self._compacted + 1)
                backlog = [ev for ev in self._history if ev.rv > since and watcher.wants(ev)]
            self._watchers.append(watcher)
            return watcher, backlog

    def watch_count(self) -> int:
        """Open watches (tests check that abandoned ones are cleaned up)."""
        with self.lock:
            return len(self._watchers)

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            watcher.closed = True
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def close_watches(self, resource: str | None = None) -> int:
        """End matching watches (clients see the stream end and must re-watch). Returns how many."""
        with self.lock:
            hit = [w for w in self._watchers if resource is None or w.resource == resource]
            for w in hit:
                w.close()
                self._watchers.remove(w)
            return len(hit)
