"""``EventRecorder`` (dra_driver/kube/events.py): events.k8s.io/v1 Events, a series for repeats.

Against the tests' in-memory API (``FakeKube``, which keeps one store of Events and serves both
shapes, as the API server does) with a clock the test moves; a real kube-apiserver's strict
events.k8s.io/v1 validation and kubectl's view are in tests/kube/test_events_apiserver.py.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from dra_driver.kube.api import EVENTS, EVENTS_V1
from dra_driver.kube.events import (
    EventRecorder,
    TokenBucket,
    core_from_v1,
    micro_time,
    truncate_note,
    utc_now,
    v1_from_core,
)
from tests.controller.fake_kube import FakeKube

START = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def pod(name: str = "web-0", uid: str = "uid-web-0", namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "41"},
        "spec": {"containers": []},
    }


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "uid": "uid-node-1"}}


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def recorder(kube: FakeKube, clock: Clock) -> EventRecorder:
    return EventRecorder(kube, controller="gpu.hami.io/controller", instance="controller-7d9f", clock=clock)


def events(kube: FakeKube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.list(EVENTS_V1)["items"]
    return items


def test_the_first_occurrence_creates_an_events_v1_event(kube: FakeKube, recorder: EventRecorder) -> None:
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "node-1/gpu-0 (t4): 4096Mi, 30% cores")

    (event,) = events(kube)
    assert (event["apiVersion"], event["kind"]) == ("events.k8s.io/v1", "Event")
    assert event["metadata"]["namespace"] == "team-a"
    assert event["metadata"]["name"].startswith("web-0.")  # generateName "<object>."
    assert event["eventTime"] == "2026-03-01T12:00:00.250000Z"  # MicroTime
    assert event["reportingController"] == "gpu.hami.io/controller"
    assert event["reportingInstance"] == "controller-7d9f"
    assert (event["type"], event["reason"], event["action"]) == ("Normal", "Allocated", "Allocate")
    assert event["note"] == "node-1/gpu-0 (t4): 4096Mi, 30% cores"
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "web-0",
        "namespace": "team-a",
        "uid": "uid-web-0",
    }
    assert "series" not in event
    # None of the deprecated core fields: the API refuses them on an events.k8s.io/v1 create.
    assert not {"deprecatedCount", "deprecatedSource", "deprecatedFirstTimestamp"} & set(event)
    assert kube.writes("events") == [("create", "events", event["metadata"]["name"])]


def test_the_core_v1_view_shows_message_and_involved_object(kube: FakeKube, recorder: EventRecorder) -> None:
    """What readers of core/v1 events (kubectl describe, tests' field selectors) see."""
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "0/1 nodes: 1 CardInsufficientMemory")
    (event,) = kube.list(EVENTS)["items"]
    assert event["apiVersion"] == "v1"
    assert event["message"] == "0/1 nodes: 1 CardInsufficientMemory"
    assert event["involvedObject"]["name"] == "web-0" and event["involvedObject"]["uid"] == "uid-web-0"
    assert event["reportingComponent"] == "gpu.hami.io/controller"
    assert "note" not in event and "regarding" not in event


def test_a_repeat_counts_on_the_series_of_the_same_event(
    kube: FakeKube, recorder: EventRecorder, clock: Clock
) -> None:
    for _ in range(3):
        recorder.emit(pod(), "Warning", "GpuOvercommitted", "Repair", "GPU node-1/gpu-0 was overcommitted")
        clock.advance(10)

    (event,) = events(kube)
    assert event["series"] == {"count": 3, "lastObservedTime": "2026-03-01T12:00:20.250000Z"}
    assert event["eventTime"] == "2026-03-01T12:00:00.250000Z"  # the first occurrence stays
    name = event["metadata"]["name"]
    assert kube.writes("events") == [
        ("create", "events", name),
        ("update", "events", name),
        ("update", "events", name),
    ]


def test_another_note_reason_type_object_or_namespace_is_another_event(
    kube: FakeKube, recorder: EventRecorder
) -> None:
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "quota team-a exceeded")
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no node has 80Gi free")
    recorder.emit(pod(), "Warning", "GpuQuotaExceeded", "Allocate", "quota team-a exceeded")
    recorder.emit(pod(), "Normal", "FailedAllocation", "Allocate", "quota team-a exceeded")
    recorder.emit(
        pod(uid="uid-web-0-again"), "Warning", "FailedAllocation", "Allocate", "quota team-a exceeded"
    )
    # The same name and uid in another namespace.
    recorder.emit(pod(namespace="team-b"), "Warning", "FailedAllocation", "Allocate", "quota team-a exceeded")

    assert len(events(kube)) == 6
    assert sorted(e["metadata"]["namespace"] for e in events(kube)) == ["team-a"] * 5 + ["team-b"]
    assert all("series" not in e for e in events(kube))


def test_the_cache_is_bounded_and_forgets_the_least_recently_seen(kube: FakeKube, clock: Clock) -> None:
    recorder = EventRecorder(
        kube, controller="gpu.hami.io/controller", instance="c", clock=clock, cache_size=2
    )
    for name in ("a", "b"):
        recorder.emit(pod(name, f"uid-{name}"), "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(pod("a", "uid-a"), "Normal", "Allocated", "Allocate", "gpu-0")  # a is now the most recent
    recorder.emit(pod("c", "uid-c"), "Normal", "Allocated", "Allocate", "gpu-0")  # evicts b
    assert len(recorder) == 2

    recorder.emit(pod("a", "uid-a"), "Normal", "Allocated", "Allocate", "gpu-0")  # still known: series
    recorder.emit(pod("b", "uid-b"), "Normal", "Allocated", "Allocate", "gpu-0")  # forgotten: a new Event
    assert len(recorder) == 2

    by_object: dict[str, list[dict[str, Any]]] = {}
    for event in events(kube):
        by_object.setdefault(event["regarding"]["name"], []).append(event)
    assert [e.get("series", {}).get("count") for e in by_object["a"]] == [3]
    assert [e.get("series") for e in by_object["b"]] == [None, None]
    assert len(by_object["c"]) == 1


@pytest.mark.parametrize(
    ("gap", "finished"),
    [(6 * 60, False), (6 * 60 + 1, True)],
    ids=["seen-exactly-at-the-window-goes-on", "not-seen-for-the-window-is-finished"],
)
def test_a_series_lasts_the_window_after_its_last_occurrence(
    kube: FakeKube, recorder: EventRecorder, clock: Clock, gap: int, finished: bool
) -> None:
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    clock.advance(5 * 60)
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # within 6 minutes
    clock.advance(gap)  # more than 6 minutes after the first: the window counts from the last one
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")

    if not finished:
        (event,) = events(kube)
        assert event["series"]["count"] == 3
        return
    first, second = sorted(events(kube), key=lambda e: e["eventTime"])
    assert first["series"]["count"] == 2
    assert second["eventTime"] == micro_time(clock.now) and "series" not in second


def test_an_expired_event_is_created_again_with_its_series(
    kube: FakeKube, recorder: EventRecorder, clock: Clock
) -> None:
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    (gone,) = events(kube)
    del kube.objects[("events", "team-a", gone["metadata"]["name"])]  # the API's event TTL ran out
    clock.advance(30)

    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")

    (event,) = events(kube)
    assert event["metadata"]["name"] != gone["metadata"]["name"]
    assert event["metadata"]["name"].startswith("web-0.")
    assert event["metadata"]["namespace"] == "team-a"
    assert ("events", "team-a", event["metadata"]["name"]) in kube.objects
    assert event["series"] == {"count": 2, "lastObservedTime": micro_time(clock.now)}
    assert event["eventTime"] == gone["eventTime"]
    assert [c[0] for c in kube.writes("events")] == ["create", "update", "create"]


def test_an_expired_event_that_cannot_be_created_again_is_created_on_the_next_repeat_then_updated(
    kube: FakeKube, recorder: EventRecorder
) -> None:
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    (gone,) = events(kube)
    del kube.objects[("events", "team-a", gone["metadata"]["name"])]
    kube.fail("create", "events", 503, "the server is shutting down")
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # update 404, create 503
    assert events(kube) == []
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # created again
    (event,) = events(kube)
    assert event["series"]["count"] == 3
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # an update of it
    (event,) = events(kube)
    assert event["metadata"]["namespace"] == "team-a"
    assert event["series"]["count"] == 4
    assert [c[0] for c in kube.writes("events")][-2:] == ["create", "update"]


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (403, 'events.events.k8s.io is forbidden: User "system:serviceaccount"'),
        (0, "connection refused"),  # an unreachable API
    ],
    ids=["refused", "unreachable"],
)
def test_api_errors_are_logged_and_never_raised(
    kube: FakeKube, recorder: EventRecorder, caplog: pytest.LogCaptureFixture, status: int, message: str
) -> None:
    caplog.set_level(logging.INFO, logger="dra_driver.kube.events")
    kube.fail("create", "events", status, message)
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # no exception
    assert events(kube) == []
    assert len(recorder) == 0  # nothing to count on: the next occurrence tries to create again
    assert "event FailedAllocation about pod team-a/web-0 not recorded" in caplog.text
    assert message in caplog.text

    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    kube.fail("update", "events", 500, "etcd leader changed")
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")  # update fails
    assert "not counted (2 times)" in caplog.text
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    (event,) = events(kube)
    assert event["series"]["count"] == 3  # the failed write's occurrence is in the count


def test_not_even_a_bug_in_the_api_layer_reaches_the_caller(
    kube: FakeKube, recorder: EventRecorder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(kube, "create", broken)
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")  # no exception
    assert "event Allocated about pod team-a/web-0 not recorded" in caplog.text
    assert "RuntimeError: unexpected" in caplog.text


@pytest.mark.parametrize(
    ("regarding", "reference"),
    [
        (NODE, {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-node-1"}),
        # An object without an apiVersion is referred to as core/v1.
        ({"kind": "Pod", "metadata": {"name": "bare"}}, {"apiVersion": "v1", "kind": "Pod", "name": "bare"}),
    ],
    ids=["cluster-scoped", "no-api-version"],
)
def test_events_about_an_object_without_a_namespace_go_to_default(
    kube: FakeKube, recorder: EventRecorder, regarding: dict[str, Any], reference: dict[str, str]
) -> None:
    recorder.emit(regarding, "Warning", "DevicePluginPresent", "PublishDevices", "4 GPU(s) not published")
    (event,) = events(kube)
    assert event["metadata"]["namespace"] == "default"
    assert event["regarding"] == reference
    assert event["metadata"]["name"].startswith(f"{reference['name']}.")


def test_the_note_is_cut_at_1024_bytes_without_splitting_a_character(
    kube: FakeKube, recorder: EventRecorder
) -> None:
    note = "é" * 1000  # 2000 bytes
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", note)
    (event,) = events(kube)
    assert event["note"] == "é" * 512 and len(event["note"].encode()) == 1024


@pytest.mark.parametrize(
    ("note", "cut"),
    [
        ("short", "short"),
        ("x" * 1024, "x" * 1024),
        ("x" * 1025, "x" * 1024),
        ("a" + "€" * 400, "a" + "€" * 341),  # 1 + 3*341 = 1024 bytes
        ("€" * 400, "€" * 341),  # 1023 bytes: the 342nd euro's first byte is dropped
    ],
    ids=["short", "at-the-limit", "over", "cut-between-characters", "cut-inside-a-character"],
)
def test_truncate_note_keeps_1024_bytes_and_drops_a_partial_character(note: str, cut: str) -> None:
    assert truncate_note(note) == cut


def test_what_cannot_be_an_event_is_dropped_with_a_log_line(
    kube: FakeKube, recorder: EventRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dra_driver.kube.events"):
        recorder.emit({"metadata": {"name": "no-kind"}}, "Normal", "Allocated", "Allocate", "gpu-0")
        recorder.emit(pod(), "Error", "Allocated", "Allocate", "gpu-0")
    assert kube.calls == []
    assert "has no kind or name" in caplog.text and "'Error' is not Normal or Warning" in caplog.text


def test_the_instance_is_cut_to_the_api_limit_and_a_cache_of_one_series_is_allowed(kube: FakeKube) -> None:
    assert EventRecorder(kube, controller="gpu.hami.io/x", instance="i" * 300).instance == "i" * 128
    assert len(EventRecorder(kube, controller="gpu.hami.io/x", instance="i", cache_size=1)) == 0


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({"controller": "gpu.hami.io/x", "cache_size": 0}, r"^cache_size must be at least 1$"),
        ({"controller": ""}, r"^an event recorder needs a reporting controller name$"),
    ],
    ids=["no-cache", "no-controller"],
)
def test_a_recorder_without_a_cache_or_a_controller_is_refused(
    kube: FakeKube, arguments: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        EventRecorder(kube, instance="i", **arguments)


def test_the_two_shapes_convert_both_ways() -> None:
    v1 = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "web-0.1", "namespace": "team-a"},
        "eventTime": "2026-03-01T12:00:00.250000Z",
        "series": {"count": 2, "lastObservedTime": "2026-03-01T12:00:10.250000Z"},
        "reportingController": "gpu.hami.io/controller",
        "reportingInstance": "c",
        "action": "Allocate",
        "reason": "Allocated",
        "regarding": {"kind": "Pod", "name": "web-0"},
        "note": "gpu-0",
        "type": "Normal",
        "deprecatedCount": 4,
        "deprecatedSource": {"component": "old"},
    }
    core = core_from_v1(v1)
    assert core["apiVersion"] == "v1" and core["message"] == "gpu-0" and core["count"] == 4
    assert core["involvedObject"] == {"kind": "Pod", "name": "web-0"} and core["source"] == {
        "component": "old"
    }
    assert core["reportingComponent"] == "gpu.hami.io/controller" and core["series"] == v1["series"]
    assert v1_from_core(core) == v1
    legacy = v1_from_core({"metadata": {"name": "x"}, "message": "m", "involvedObject": {"name": "p"}})
    assert legacy["eventTime"] is None and legacy["note"] == "m"


def test_the_clock_and_micro_time_are_utc_whatever_the_machines_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert utc_now().utcoffset() == timedelta(0)
        assert micro_time(datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)) == "2026-03-01T12:00:00.000000Z"
        paris = timezone(timedelta(hours=1))
        assert micro_time(datetime(2026, 3, 1, 13, 0, 0, 5, tzinfo=paris)) == "2026-03-01T12:00:00.000005Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_event_is_created_in_its_objects_namespace(
    kube: FakeKube, recorder: EventRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespaces: list[str | None] = []
    create = kube.create

    def spy(resource: Any, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        namespaces.append(namespace)  # the real client puts it in the URL
        return create(resource, namespace, obj)

    monkeypatch.setattr(kube, "create", spy)
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(NODE, "Normal", "Allocated", "Allocate", "gpu-0")
    (gone,) = [e for e in events(kube) if e["metadata"]["namespace"] == "team-a"]
    del kube.objects[("events", "team-a", gone["metadata"]["name"])]
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")  # update 404: created again
    assert namespaces == ["team-a", "default", "team-a"]


def test_a_refused_write_is_an_info_line_naming_the_object(
    kube: FakeKube, recorder: EventRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dra_driver.kube.events")
    kube.fail("create", "events", 403, "forbidden")
    recorder.emit(NODE, "Warning", "DevicePluginPresent", "PublishDevices", "gpu-0")
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")
    (gone,) = events(kube)
    del kube.objects[("events", "team-a", gone["metadata"]["name"])]
    kube.fail("create", "events", 503, "shutting down", times=2)
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")  # update 404, create 503
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")  # nameless: create 503
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages == [
        (logging.INFO, "event DevicePluginPresent about node node-1 not recorded: 403: forbidden"),
        (logging.INFO, "event Allocated about pod team-a/web-0 not recorded: 503: shutting down"),
        (logging.INFO, "event Allocated about pod team-a/web-0 not recorded: 503: shutting down"),
    ]
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")  # created again, the count kept
    (event,) = events(kube)
    assert event["series"]["count"] == 5


def test_the_count_is_written_even_after_another_writer_changed_the_event(
    kube: FakeKube, recorder: EventRecorder
) -> None:
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    (event,) = events(kube)
    event["metadata"]["labels"] = {"seen-by": "someone"}
    kube.update(EVENTS_V1, event)  # bumps the resourceVersion the recorder remembers
    recorder.emit(pod(), "Warning", "FailedAllocation", "Allocate", "no GPU free")
    (event,) = events(kube)
    assert event["series"]["count"] == 2


def test_conversion_copies_and_fills_the_object_reference() -> None:
    v1 = {"metadata": {"name": "e", "labels": {"team": "a"}}, "regarding": {"kind": "Pod", "name": "web-0"}}
    core = core_from_v1(v1)
    core["involvedObject"]["name"] = "changed"
    core["metadata"]["labels"]["team"] = "b"  # a view written to must leave the other shape alone
    assert v1["regarding"]["name"] == "web-0" and v1["metadata"]["labels"] == {"team": "a"}
    back = v1_from_core(core)
    back["regarding"]["name"] = "again"
    back["metadata"]["labels"]["team"] = "c"
    assert core["involvedObject"]["name"] == "changed" and core["metadata"]["labels"] == {"team": "b"}
    assert core_from_v1({"note": "m"})["involvedObject"] == {}
    assert v1_from_core({"message": "m"})["regarding"] == {}


class GatedKube(FakeKube):
    """FakeKube whose event creates wait until the test opens the gate (a slow API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def create(self, resource: Any, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.gate.wait(10), "the gate was never opened"
        created: dict[str, Any] = super().create(resource, namespace, obj)
        return created


def test_a_background_recorder_returns_at_once_and_its_sender_writes_in_order(clock: Clock) -> None:
    kube = GatedKube()
    recorder = EventRecorder(kube, controller="c", instance="i", clock=clock, background=True)
    started = time.monotonic()
    recorder.emit(pod("a", "uid-a"), "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(pod("b", "uid-b"), "Normal", "Allocated", "Allocate", "gpu-1")
    assert time.monotonic() - started < 5  # the caller never waited for the held API
    assert not recorder.flush(timeout=0.2) and events(kube) == []
    kube.gate.set()
    assert recorder.flush()
    assert [e["regarding"]["name"] for e in sorted(events(kube), key=lambda e: e["note"])] == ["a", "b"]
    assert recorder.dropped == 0


def test_a_full_background_queue_drops_and_counts_the_event(clock: Clock) -> None:
    kube = GatedKube()
    recorder = EventRecorder(kube, controller="c", instance="i", clock=clock, background=True, queue_size=1)
    recorder.emit(pod("a", "uid-a"), "Normal", "Allocated", "Allocate", "first")
    deadline = time.monotonic() + 5
    while recorder._queue is not None and recorder._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.005)  # the sender took the first one and waits on the API with it
    recorder.emit(pod("b", "uid-b"), "Normal", "Allocated", "Allocate", "second")  # queued
    recorder.emit(pod("c", "uid-c"), "Normal", "Allocated", "Allocate", "third")  # no room
    assert recorder.dropped == 1
    kube.gate.set()
    assert recorder.flush()
    assert sorted(e["note"] for e in events(kube)) == ["first", "second"]


def test_an_inline_recorder_has_nothing_to_flush(kube: FakeKube, recorder: EventRecorder) -> None:
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")
    assert len(events(kube)) == 1 and recorder.flush(timeout=0)


# --- sampling ---------------------------------------------------------------------------------------


class Seconds:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_normal_events_past_the_budget_are_dropped_and_counted_warnings_never(kube: FakeKube) -> None:
    seconds = Seconds()
    budget = TokenBucket(rate=2.0, burst=3, clock=seconds)
    recorder = EventRecorder(kube, controller="gpu.hami.io/controller", instance="c", normal_budget=budget)
    for index in range(5):
        recorder.emit(pod(f"p-{index}", f"uid-{index}"), "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(pod("p-9", "uid-9"), "Warning", "FailedAllocation", "Allocate", "no GPU fits")
    assert sorted(e["regarding"]["name"] for e in events(kube)) == ["p-0", "p-1", "p-2", "p-9"]
    assert recorder.sampled_out == 2
    seconds.now += 1.0  # two tokens a second
    for index in range(5, 8):
        recorder.emit(pod(f"p-{index}", f"uid-{index}"), "Normal", "Allocated", "Allocate", "gpu-0")
    assert len(events(kube)) == 6 and recorder.sampled_out == 3


def test_a_budget_saves_up_at_most_its_burst_and_zero_turns_normal_events_off(kube: FakeKube) -> None:
    seconds = Seconds()
    budget = TokenBucket(rate=1.0, burst=2, clock=seconds)
    seconds.now += 3600.0
    assert [budget.take() for _ in range(3)] == [True, True, False]
    off = TokenBucket(rate=0.0, burst=0, clock=seconds)
    recorder = EventRecorder(kube, controller="gpu.hami.io/controller", instance="c", normal_budget=off)
    recorder.emit(pod(), "Normal", "Allocated", "Allocate", "gpu-0")
    assert events(kube) == [] and recorder.sampled_out == 1
    with pytest.raises(ValueError, match="at least 0"):
        TokenBucket(rate=-1.0, burst=1)
