"""``events.k8s.io/v1`` Events, with series so that a repeated event does not flood the API.

:class:`EventRecorder` is what client-go's ``tools/events`` recorder does, synchronously and in a
few lines: the first occurrence of an event creates an Event (``eventTime``, ``action``,
``reportingController``/``reportingInstance``, ``regarding``, ``note``); each later occurrence of
the same event (same object, type, reason, action and note) updates that Event's ``series``
(``count``, ``lastObservedTime``) instead of creating another one. ``kubectl get events`` then
shows one line with the count and the last time.

Differences from client-go, on purpose:

* the note is part of what makes two events "the same" (client-go keys on everything but the
  note and keeps the first note): our notes carry the detail (which GPU, which quota) and a
  series must not hide a new one; the API refuses to change an Event's note anyway;
* the series is written with an unconditional PUT (events allow it: ``AllowUnconditionalUpdate``)
  rather than a strategic merge patch, so the recorder needs only ``create`` and ``update``;
* writes happen on the caller's thread; an API error is logged (info) and dropped, never raised
  and never retried (the log line is the record, as it was for core/v1 events).

Normal events can be sampled (``normal_budget``, a :class:`TokenBucket`): past the budget a Normal
event is dropped and counted (``sampled_out``), never a Warning. Each is an API write (a POST and a
watch event to every events watcher) about a different object, so series cannot fold them: at
hundreds of pods a second the controller's ``Allocated`` events cost the API server as much as a
write of the allocation path, while the pod's decision annotation already says the same.

Memory stays flat: the recorder remembers at most ``cache_size`` series (least recently seen
dropped first), and forgets a series not seen for ``series_window`` seconds (client-go's
``finishTime``, six minutes), so the next occurrence starts a new Event. An update that finds the
Event gone (its TTL expired, someone deleted it) creates a new one that carries the series on.

Events about a cluster-scoped object (a Node) go to the ``default`` namespace, as client-go's
recorders do (the API accepts ``default`` or ``kube-system`` for an event with ``eventTime`` whose
object has no namespace). ``note`` is cut at 1024 bytes, the API's limit.

The module also converts between the two shapes of one Event (:func:`core_from_v1`,
:func:`v1_from_core`), as the API server does: both versions are views of the same objects, so
what the recorder writes is listed by ``GET /api/v1/events`` with ``message``/``involvedObject``.
The simulated control plane and the tests' in-memory API use them.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_driver.kube.api import EVENTS_V1, KubeApi, Obj
from dra_driver.kube.errors import KubeError, NotFound

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
#: The API's limits (pkg/apis/core/validation/events.go): note in bytes, the others in characters.
NOTE_LIMIT = 1024
#: An object name (a DNS subdomain) is at most this long.
NAME_LIMIT = 253
REPORTING_INSTANCE_LIMIT = 128
#: Where events about cluster-scoped objects go (client-go: metav1.NamespaceDefault).
CLUSTER_EVENT_NAMESPACE = "default"
#: How many events a ``background`` recorder holds for its sender thread at most.
DEFAULT_QUEUE_SIZE = 1000
#: How many series the recorder remembers at most.
DEFAULT_CACHE_SIZE = 4096
#: A series not seen for this long is finished; the next occurrence starts a new Event.
DEFAULT_SERIES_WINDOW = 6 * 60.0

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def micro_time(moment: datetime) -> str:
    """``moment`` as Kubernetes serialises ``metav1.MicroTime`` (UTC, microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def truncate_note(note: str, limit: int = NOTE_LIMIT) -> str:
    """``note`` cut to ``limit`` UTF-8 bytes (the API counts bytes) without splitting a character."""
    data = note.encode()
    if len(data) <= limit:
        return note
    return data[:limit].decode(errors="ignore")


def object_reference(obj: Mapping[str, Any]) -> Obj | None:
    """The ``ObjectReference`` an event about ``obj`` carries; None without a kind and a name."""
    meta = obj.get("metadata") or {}
    kind, name = obj.get("kind"), meta.get("name")
    if not kind or not name:
        return None
    ref: Obj = {"apiVersion": str(obj.get("apiVersion") or "v1"), "kind": str(kind), "name": str(name)}
    if meta.get("namespace"):
        ref["namespace"] = str(meta["namespace"])
    if meta.get("uid"):
        ref["uid"] = str(meta["uid"])
    return ref


@dataclass
class _Series:
    """What the recorder remembers of one event: the Event as last written, and when last seen."""

    event: Obj
    count: int
    last_seen: datetime


_Key = tuple[str, str, str, str, str, str, str, str, str]


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``take`` spends one if there is one.

    Thread-safe (a background recorder's ``emit`` runs on the callers' threads)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 0:
            raise ValueError("an event budget needs a rate and a burst of at least 0")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()
        #: How many ``take`` calls found no token.
        self.refused = 0

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1.0:
                self.refused += 1
                return False
            self._tokens -= 1.0
            return True


class EventRecorder:
    """Writes ``events.k8s.io/v1`` Events with series (see the module docstring).

    ``controller`` is the ``reportingController`` (a qualified name such as
    ``gpu.hami.io/controller``), ``instance`` the ``reportingInstance`` (this replica: the pod
    name, the node name; cut at 128 characters). ``clock`` returns the current time (aware).
    """

    def __init__(
        self,
        kube: KubeApi,
        *,
        controller: str,
        instance: str,
        clock: Clock = utc_now,
        cache_size: int = DEFAULT_CACHE_SIZE,
        series_window: float | None = DEFAULT_SERIES_WINDOW,
        background: bool = False,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        normal_budget: TokenBucket | None = None,
    ) -> None:
        if not controller:
            raise ValueError("an event recorder needs a reporting controller name")
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        self.kube = kube
        self.controller = controller
        self.instance = instance[:REPORTING_INSTANCE_LIMIT]
        self.clock = clock
        self.cache_size = cache_size
        self.series_window = series_window
        self._series: OrderedDict[_Key, _Series] = OrderedDict()
        # One event at a time: two threads reporting the same event must not create two Events.
        self._lock = threading.Lock()
        #: ``background``: ``emit`` only queues; one sender thread writes (as client-go's
        #: broadcaster does), so a caller on a write path (the controller's binder) does not wait
        #: an API round trip per event. A full queue drops the event (counted in ``dropped``).
        self._queue: queue.Queue[tuple[Mapping[str, Any], str, str, str, str]] | None = (
            queue.Queue(queue_size) if background else None
        )
        self.dropped = 0
        #: Normal events past it are dropped (None: every Normal event is recorded).
        self.normal_budget = normal_budget
        self._last_nanos = 0
        if self._queue is not None:
            threading.Thread(target=self._send_queued, name="event-sender", daemon=True).start()

    @property
    def sampled_out(self) -> int:
        """Normal events dropped past the ``normal_budget``."""
        return 0 if self.normal_budget is None else self.normal_budget.refused

    def __len__(self) -> int:
        """How many series the recorder remembers (bounded by ``cache_size``)."""
        return len(self._series)

    def emit(self, regarding: Mapping[str, Any], type: str, reason: str, action: str, note: str) -> None:
        """Record that ``action`` happened (or failed) to ``regarding``: written now, or queued
        for the sender thread of a ``background`` recorder (dropped, and counted, when it is full).
        A Normal event past the ``normal_budget`` is dropped and counted in ``sampled_out``."""
        if type == NORMAL and self.normal_budget is not None and not self.normal_budget.take():
            log.debug("event %s not recorded: past the Normal event budget", reason)
            return
        if self._queue is None:
            self.write(regarding, type, reason, action, note)
            return
        try:
            self._queue.put_nowait((regarding, type, reason, action, note))
        except queue.Full:
            self.dropped += 1
            log.info("event %s not recorded: %d events are waiting to be sent", reason, self._queue.qsize())

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event was sent (or given up); whether that happened in time."""
        if self._queue is None:
            return True
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._queue.unfinished_tasks

    def _send_queued(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                self.write(*item)
            finally:
                self._queue.task_done()

    def write(self, regarding: Mapping[str, Any], type: str, reason: str, action: str, note: str) -> None:
        """Record that ``action`` happened (or failed) to ``regarding``, a raw Kubernetes object.

        ``type`` is ``Normal`` or ``Warning``; ``reason`` and ``action`` are short CamelCase words,
        ``note`` the human-readable text. Never raises: a refused write is logged.
        """
        ref = object_reference(regarding)
        if ref is None:
            log.info("event %s not recorded: the object has no kind or name", reason)
            return
        if type not in (NORMAL, WARNING):
            log.info(
                "event %s about %s not recorded: type %r is not Normal or Warning", reason, ref["name"], type
            )
            return
        note = truncate_note(note)
        key: _Key = (
            ref["apiVersion"],
            ref["kind"],
            ref.get("namespace", ""),
            ref["name"],
            ref.get("uid", ""),
            type,
            reason,
            action,
            note,
        )
        with self._lock:
            try:
                self._record(key, ref, type, reason, action, note)
            except Exception:  # events are best effort: a bug here must not fail the caller's work
                log.warning("event %s about %s not recorded", reason, _describe(ref), exc_info=True)

    # ------------------------------------------------------------------------------------- internals

    def _record(self, key: _Key, ref: Obj, type: str, reason: str, action: str, note: str) -> None:
        now = self.clock()
        series = self._series.get(key)
        if series is not None and self._finished(series, now):
            del self._series[key]
            series = None
        if series is None:
            event = self._new_event(ref, type, reason, action, note, now)
            created = self._create(event, ref)
            if created is not None:
                self._remember(key, _Series(created, 1, now))
            return
        self._series.move_to_end(key)
        series.count += 1
        series.last_seen = now
        series.event = self._repeat(series, ref)

    def _finished(self, series: _Series, now: datetime) -> bool:
        return (
            self.series_window is not None and (now - series.last_seen).total_seconds() > self.series_window
        )

    def _remember(self, key: _Key, series: _Series) -> None:
        self._series[key] = series
        self._series.move_to_end(key)
        while len(self._series) > self.cache_size:
            self._series.popitem(last=False)

    def _new_event(self, ref: Obj, type: str, reason: str, action: str, note: str, now: datetime) -> Obj:
        return {
            "apiVersion": EVENTS_V1.api_version,
            "kind": EVENTS_V1.kind,
            "metadata": {
                "name": self._event_name(ref),
                "namespace": ref.get("namespace") or CLUSTER_EVENT_NAMESPACE,
            },
            "eventTime": micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "regarding": ref,
            "note": note,
            "type": type,
        }

    def _event_name(self, ref: Obj) -> str:
        """``<object>.<nanoseconds in hex>``, as client-go names events: kube-apiserver validates an
        events.k8s.io/v1 Event's ``generateName`` as a whole DNS subdomain, so ``<object>.`` (the
        core/v1 habit) is refused with 422. Unique per recorder even within one nanosecond."""
        self._last_nanos = max(self._last_nanos + 1, time.time_ns())
        suffix = f".{self._last_nanos:x}"
        return str(ref["name"])[: NAME_LIMIT - len(suffix)] + suffix

    def _create(self, event: Obj, ref: Obj) -> Obj | None:
        namespace = event["metadata"]["namespace"]
        try:
            return self.kube.create(EVENTS_V1, namespace, event)
        except KubeError as err:
            log.info("event %s about %s not recorded: %s", event.get("reason"), _describe(ref), err)
            return None

    def _repeat(self, series: _Series, ref: Obj) -> Obj:
        """Write the new count on the series' Event; returns the Event to remember."""
        event = copy.deepcopy(series.event)
        event["series"] = {"count": series.count, "lastObservedTime": micro_time(series.last_seen)}
        if not event["metadata"].get("name"):  # gone, and creating it again failed: try again now
            return self._create(event, ref) or event
        # Unconditional: another writer's change to the Event (there is none in practice) must not
        # cost the count; the API allows it for events.
        event["metadata"].pop("resourceVersion", None)
        try:
            return self.kube.update(EVENTS_V1, event)
        except NotFound:
            # Expired or deleted: a new Event carries the series on (client-go does the same).
            namespace = event["metadata"].get("namespace")
            event["metadata"] = {"name": self._event_name(ref), "namespace": namespace}
            return self._create(event, ref) or event
        except KubeError as err:
            log.info(
                "event %s about %s not counted (%d times): %s",
                event.get("reason"),
                _describe(ref),
                series.count,
                err,
            )
            return event  # the next occurrence writes the count, this one included


def _describe(ref: Mapping[str, Any]) -> str:
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    return f"{str(ref.get('kind', '')).lower()} {where}{ref.get('name', '')}"


# ----------------------------------------------------------------------------------------- conversion

#: events.k8s.io/v1 field -> core/v1 field (pkg/apis/events/v1/conversion.go); the rest are equal.
_V1_TO_CORE = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_CORE_TO_V1 = {core: v1 for v1, core in _V1_TO_CORE.items()}

#: events.k8s.io/v1 field selector labels and the core/v1 fields they select on.
V1_FIELD_LABELS = {
    "regarding.kind": "involvedObject.kind",
    "regarding.namespace": "involvedObject.namespace",
    "regarding.name": "involvedObject.name",
    "regarding.uid": "involvedObject.uid",
    "regarding.apiVersion": "involvedObject.apiVersion",
    "regarding.resourceVersion": "involvedObject.resourceVersion",
    "regarding.fieldPath": "involvedObject.fieldPath",
    "reportingController": "reportingComponent",
    "reason": "reason",
    "source": "source",
    "type": "type",
}


def core_from_v1(event: Mapping[str, Any]) -> Obj:
    """An ``events.k8s.io/v1`` Event as ``GET /api/v1`` shows it (``message``, ``involvedObject``)."""
    out: Obj = {_V1_TO_CORE.get(k, k): copy.deepcopy(v) for k, v in event.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    out.setdefault("involvedObject", {})
    return out


def v1_from_core(event: Mapping[str, Any]) -> Obj:
    """A core/v1 Event as ``GET /apis/events.k8s.io/v1`` shows it (``note``, ``regarding``)."""
    out: Obj = {_CORE_TO_V1.get(k, k): copy.deepcopy(v) for k, v in event.items()}
    out["apiVersion"], out["kind"] = EVENTS_V1.api_version, EVENTS_V1.kind
    out.setdefault("regarding", {})
    out.setdefault("eventTime", None)  # a legacy event has none (MicroTime's zero is null)
    return out
