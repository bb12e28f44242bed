"""The pod queue's transitions (dra_driver/controller/pod_queue.py), over a bare cluster cache.

Each test moves pods between the queue's parts the way the worker does (``attempts`` then
``done``; ``binding`` then ``written``; ``wake`` for a change) and checks which pods the next pass
is given, with what nodes. The worker driving it is in test_pending_retries.py and
test_fair_pending.py; the shapes (which pods plan alike) are the allocator's, stubbed here.
"""

from __future__ import annotations

import itertools

import pytest

from dra_driver.controller.cache import Wake
from dra_driver.controller.pod_queue import Attempt, PodQueue, Step
from dra_driver.controller.reasons import Reason
from dra_driver.controller.retries import CommitBackoff, Retry
from dra_driver.resource.objects import PodView
from tests.controller.harness import claim, device_class, pod, request
from tests.controller.worlds import CacheWorld

OTHER = "other-ns"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Queue:
    """A ``PodQueue`` over a cache world, with a clock the test moves and shapes it chooses."""

    def __init__(self, *, batch: int = 16, budget: float = 10.0) -> None:
        self.world = CacheWorld(nodes=("n1", "n2"))
        self.clock = Clock()
        self.shapes: dict[str, str | None] = {}
        self.skipped = 0
        self.queue = PodQueue(
            self.world.cache,
            lambda pod: self.shapes.get(pod.name),
            batch=batch,
            backoff=CommitBackoff(initial=1.0, maximum=4.0, clock=self.clock),
            pass_budget=budget,
            clock=self.clock,
            skipped=self.count_skip,
        )

    def count_skip(self) -> None:
        self.skipped += 1

    def add(
        self,
        name: str,
        namespace: str = "default",
        klass: str | None = None,
        gated: bool = True,
        *,
        priority: int | None = None,
        second: int | None = None,
    ) -> str:
        """Claim and gated pod ``name`` in ``namespace``; ``priority``: its ``spec.priority``,
        ``second``: its creation time's second (all pods are otherwise created at once)."""
        body = claim(name, request() if klass is None else request(klass=klass))
        body["metadata"]["namespace"] = namespace
        self.world.add_claim(body)
        obj = pod(name, {"gpu": f"claim:{name}"}, gated=gated)
        obj["metadata"]["namespace"] = namespace
        if priority is not None:
            obj["spec"]["priority"] = priority
        if second is not None:
            obj["metadata"]["creationTimestamp"] = f"2026-12-01T00:00:{second:02d}Z"
        self.world.add_pod(obj)
        return f"{namespace}/{name}"

    def pod(self, key: str) -> PodView:
        return self.world.cache.pods[key]

    def attempts(self) -> list[Attempt]:
        return list(self.queue.attempts())

    def plan(self) -> list[tuple[str, frozenset[str] | None]]:
        """The next pass's pods and their nodes, each told it stayed pending as the pass goes."""
        planned = []
        for attempt in self.queue.attempts():
            planned.append((attempt.pod.key, attempt.only_nodes))
            self.queue.done(attempt, Step.PENDING)
        return planned

    def pending(self, key: str, reason: Reason | None = Reason.UNSCHEDULABLE) -> None:
        """Plan ``key`` in full and leave it pending for ``reason`` (None: not reported)."""
        self.queue.activate([key])
        (attempt,) = self.attempts()
        assert attempt == Attempt(self.pod(key), None)
        if reason is not None:
            assert self.queue.record_failure(attempt.pod, reason, f"{reason} message") is not None
        self.queue.done(attempt, Step.PENDING)


# --- active ---------------------------------------------------------------------------------------


def test_a_changed_pod_is_planned_in_full_once() -> None:
    q = Queue()
    key = q.add("a")
    assert not q.queue.busy()
    q.queue.activate([key])
    assert q.queue.busy() and not q.queue.left_over()
    assert q.attempts() == [Attempt(q.pod(key), None)]
    assert q.attempts() == [] and not q.queue.busy()


def test_a_pod_that_is_gone_is_dropped_from_every_part() -> None:
    q = Queue()
    q.queue.activate(["default/gone"])
    q.queue.unschedulable.add("default/gone")
    q.queue.backoff.failed("default/gone")
    assert q.attempts() == []
    assert "default/gone" not in q.queue.unschedulable
    assert not q.queue.backoff.waiting("default/gone")


@pytest.mark.parametrize("step", [Step.WAITING, Step.SKIP, Step.RETRY])
def test_a_pod_that_is_not_pending_leaves_unschedulable_and_only_a_retry_is_planned_again(step: Step) -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.activate([key])
    (attempt,) = q.attempts()
    q.queue.done(attempt, step)
    assert key not in q.queue.unschedulable
    assert q.attempts() == ([attempt] if step is Step.RETRY else [])


def test_an_api_error_plans_the_pod_again_in_full() -> None:
    q = Queue()
    key = q.add("a")
    q.queue.retry(key)
    assert q.attempts() == [Attempt(q.pod(key), None)]


def test_a_pass_takes_namespaces_in_turn_oldest_first() -> None:
    q = Queue()
    keys = [q.add("a1"), q.add("a2"), q.add("b1", OTHER)]
    q.queue.activate(keys)
    assert [key for key, _ in q.plan()] == ["default/a1", f"{OTHER}/b1", "default/a2"]


# --- unschedulable and what wakes it -------------------------------------------------------------


def test_room_on_a_node_wakes_the_pods_that_fitted_nowhere_on_that_node_alone() -> None:
    q = Queue()
    full, quota = q.add("full"), q.add("quota")
    q.pending(full)
    q.pending(quota, Reason.QUOTA_EXCEEDED)
    assert q.queue.unschedulable == {full, quota}
    q.queue.wake(Wake(retry_nodes={"n2"}))
    assert q.queue.left_over()
    assert q.plan() == [(full, frozenset({"n2"}))]
    assert q.plan() == []


def test_room_in_a_quota_wakes_that_namespaces_refused_pods_everywhere() -> None:
    q = Queue()
    here, there, full = q.add("here"), q.add("there", OTHER), q.add("full")
    q.pending(here, Reason.QUOTA_EXCEEDED)
    q.pending(there, Reason.QUOTA_EXCEEDED)
    q.pending(full)
    q.queue.wake(Wake(retry_quota={"default"}))
    assert q.plan() == [(here, None)]


def test_a_changed_class_wakes_the_pods_whose_claims_ask_for_it() -> None:
    q = Queue()
    q.world.add_class(device_class("fast"))
    fast, plain = q.add("fast", klass="fast"), q.add("plain")
    q.pending(fast, Reason.DEVICE_CLASS_NOT_FOUND)
    q.pending(plain, Reason.DEVICE_CLASS_NOT_FOUND)
    q.queue.wake(Wake(retry_classes={"fast"}))
    assert q.plan() == [(fast, None)]


def test_a_pod_whose_reason_is_unknown_is_woken_everywhere_by_any_change() -> None:
    q = Queue()
    unknown = q.add("unknown")
    q.pending(unknown, reason=None)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    assert q.plan() == [(unknown, None)]
    q.queue.wake(Wake(retry_quota={"elsewhere"}))
    assert q.plan() == [(unknown, None)]


def test_woken_nodes_add_up_and_everywhere_wins() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    q.queue.wake(Wake(retry_nodes={"n2"}))
    assert q.plan() == [(key, frozenset({"n1", "n2"}))]
    q.queue.wake(Wake(retry_nodes={"n1"}, retry_everywhere=True))
    assert q.plan() == [(key, None)]


def test_a_woken_pod_that_changed_too_is_planned_once_in_full() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.wake(Wake(pods={key}, retry_nodes={"n1"}))
    assert q.plan() == [(key, None)]
    assert not q.queue.left_over()


def test_the_resync_wakes_every_pending_pod_and_plans_every_other_gated_pod() -> None:
    q = Queue()
    pending, gated, ungated = q.add("pending"), q.add("gated"), q.add("ungated", gated=False)
    q.pending(pending)
    q.queue.resync()
    attempts = q.attempts()
    assert {(a.pod.key, a.retry is None) for a in attempts} == {(pending, False), (gated, True)}
    assert ungated not in {a.pod.key for a in attempts}


def test_a_deleted_pod_is_forgotten_by_the_reports() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    pod = q.pod(key)
    assert q.queue.reason(pod) == Reason.UNSCHEDULABLE
    assert q.queue.new_warnings(pod, ["w"]) == ["w"] and q.queue.new_warnings(pod, ["w"]) == []
    q.queue.wake(Wake(deleted_pods={pod.uid}))
    assert q.queue.reason(pod) is None
    assert q.queue.new_warnings(pod, ["w"]) == ["w"]


def test_a_placed_pod_leaves_the_pending_groups() -> None:
    q = Queue()
    a, b = q.add("a"), q.add("b")
    q.pending(a)
    q.pending(b, Reason.QUOTA_EXCEEDED)
    groups = q.queue.pending_groups()
    assert {reason: group.count for reason, group in groups.items()} == {
        Reason.UNSCHEDULABLE: 1,
        Reason.QUOTA_EXCEEDED: 1,
    }
    q.queue.placed(q.pod(a))
    assert set(q.queue.pending_groups()) == {Reason.QUOTA_EXCEEDED}


# --- the woken batch -------------------------------------------------------------------------------


def test_pods_of_a_shape_that_stayed_pending_are_skipped_until_a_change() -> None:
    q = Queue()
    keys = [q.add(f"s{i}") for i in range(3)]
    for key in keys:
        q.pending(key)
        q.shapes[q.pod(key).name] = "shape"
    q.queue.wake(Wake(retry_nodes={"n1"}))
    assert q.plan() == [(keys[0], frozenset({"n1"}))]  # one plan for the shape: the others skipped
    assert q.queue.stuck == {("shape", frozenset({"n1"}))}
    assert q.skipped == 2 and not q.queue.left_over()
    q.queue.wake(Wake(retry_nodes={"n1"}))  # a change: what stayed pending may not any more
    assert q.queue.stuck == set()
    assert [key for key, _ in q.plan()] == [keys[0]]


def test_a_shape_stuck_everywhere_is_stuck_on_any_nodes() -> None:
    q = Queue()
    first, second = q.add("first"), q.add("second")
    q.queue.stuck.add(("shape", None))
    assert q.queue.stays_pending(Retry(frozenset({"n1"}), "shape"))
    assert not q.queue.stays_pending(Retry(frozenset({"n1"}), "other"))
    assert not q.queue.stays_pending(Retry(None, None))
    q.queue.stuck = {("shape", frozenset({"n1"}))}
    assert q.queue.stays_pending(Retry(frozenset({"n1"}), "shape"))
    assert not q.queue.stays_pending(Retry(frozenset({"n2"}), "shape"))
    assert not q.queue.stays_pending(Retry(None, "shape"))
    assert first != second


def test_a_shape_that_cannot_be_told_is_planned_alone() -> None:
    q = Queue(batch=1)
    a, b = q.add("a"), q.add("b")
    q.pending(a)
    q.pending(b)

    def broken(_pod: PodView) -> str | None:
        raise ValueError("bad input")

    q.queue._shape = broken
    q.queue.wake(Wake(retry_nodes={"n1"}))
    assert [(at.pod.key, at.retry) for at in q.attempts()] == [(a, Retry(frozenset({"n1"}), None))]
    assert q.queue.left_over()


def test_a_pass_replans_a_bounded_batch_one_plan_per_shape_and_nodes() -> None:
    q = Queue(batch=2)
    keys = [q.add(f"p{i}") for i in range(4)]
    for index, key in enumerate(keys):
        q.pending(key)
        q.shapes[q.pod(key).name] = "twin" if index < 2 else f"own-{index}"
    q.queue.wake(Wake(retry_nodes={"n1"}))
    attempts = q.attempts()
    # p0 and p1 are one plan (p1 runs only if p0 fits); p2 is the second; p3 waits.
    assert [a.pod.key for a in attempts] == keys[:3]
    assert attempts[0].retry == Retry(frozenset({"n1"}), "twin")
    assert q.queue.left_over()
    for attempt in attempts:
        q.queue.done(attempt, Step.PENDING)
    assert [key for key, _ in q.plan()] == [keys[3]]
    assert not q.queue.left_over()


def test_a_woken_pod_that_is_no_longer_pending_leaves_the_woken_queue() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    q.queue.unschedulable.discard(key)
    assert q.attempts() == [] and not q.queue.left_over()


# --- in flight and backoff ------------------------------------------------------------------------


def test_a_pod_in_flight_is_neither_planned_nor_woken_and_a_failed_write_backs_off() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.binding(key)
    assert key in q.queue.in_flight and key not in q.queue.unschedulable
    # Changes that arrive while its writes run: the pod itself, room everywhere.
    q.queue.wake(Wake(pods={key}, retry_everywhere=True))
    assert q.attempts() == []
    assert q.queue.written(key, completed=False) == 1.0
    assert key not in q.queue.in_flight and key not in q.queue.unschedulable  # backoff, not unschedulable
    assert q.attempts() == [] and q.queue.busy()  # its pause has not ended
    q.clock.now += 0.99
    assert q.attempts() == []
    q.clock.now += 0.01
    assert q.attempts() == [Attempt(q.pod(key), None)]  # planned in full: what changed is seen


def test_the_backoff_doubles_per_failed_write_and_ends_with_a_completed_one() -> None:
    q = Queue()
    key = q.add("a")
    pauses = []
    for _ in range(4):
        q.queue.binding(key)
        pauses.append(q.queue.written(key, completed=False))
    assert pauses == [1.0, 2.0, 4.0, 4.0]
    q.queue.binding(key)
    q.queue.stuck.add(("shape", None))
    assert q.queue.written(key, completed=True) is None
    assert not q.queue.backoff.waiting(key) and q.queue.stuck == set()
    q.queue.binding(key)
    assert q.queue.written(key, completed=False) == 1.0


def test_a_pod_in_flight_is_dropped_from_the_woken_queue() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    q.queue.in_flight.add(key)
    assert q.attempts() == [] and not q.queue.left_over()


# --- the pass budget --------------------------------------------------------------------------------


def test_a_pass_stops_at_its_budget_and_keeps_the_rest() -> None:
    q = Queue(budget=0.5)
    ticks = itertools.count()
    q.queue.clock = lambda: float(next(ticks))
    fresh = [q.add("a1"), q.add("a2")]
    woken = q.add("w", OTHER)
    q.pending(woken)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    q.queue.activate(fresh)
    assert [a.pod.key for a in q.attempts()] == [fresh[0]]
    assert q.queue.cut_short and q.queue.left_over() and q.queue.busy()
    # The next pass starts after the namespace planned last: the other one's woken pod first.
    q.queue.clock = lambda: 0.0
    assert [a.pod.key for a in q.attempts()] == [woken, fresh[1]]
    assert not q.queue.cut_short


def test_a_pass_runs_while_its_time_is_within_the_budget_and_keeps_what_it_requeued() -> None:
    q = Queue(budget=1.0)
    ticks = itertools.count()
    q.queue.clock = lambda: 0.5 * next(ticks)  # each look at the clock: half a second on
    keys = [q.add(f"a{i}") for i in range(4)]
    q.queue.activate(keys)
    planned = []
    for attempt in q.queue.attempts():
        planned.append(attempt.pod.key)
        q.queue.done(attempt, Step.RETRY)  # e.g. its shared claim was being written
    # 0.0 (the start), then 0.5 and 1.0 within the budget; 1.5 past it.
    assert planned == keys[:3] and q.queue.cut_short
    q.queue.clock = lambda: 0.0
    assert [a.pod.key for a in q.attempts()] == keys  # those cut and those told to retry


def test_the_next_pass_starts_after_the_namespace_planned_last() -> None:
    """Namespace ``a-b`` sorts between ``a`` and any ``a/...`` key: the turn is the namespace's."""
    q = Queue(budget=0.5)
    ticks = itertools.count()
    q.queue.clock = lambda: float(next(ticks))
    keys = [q.add("1", "a"), q.add("2", "a"), q.add("1", "a-b")]
    q.queue.activate(keys)
    assert [a.pod.key for a in q.attempts()] == ["a/1"]
    assert [a.pod.key for a in q.attempts()] == ["a-b/1"]
    assert [a.pod.key for a in q.attempts()] == ["a/2"]


def test_a_pod_in_flight_or_gone_does_not_end_the_pass() -> None:
    q = Queue()
    flying, live = q.add("a"), q.add("b")
    q.queue.binding(flying)
    q.queue.activate(["default/0-gone", flying, live])
    assert [a.pod.key for a in q.attempts()] == [live]


def test_stale_and_fresh_woken_pods_do_not_end_the_batch() -> None:
    q = Queue()
    stale, fresh, woken = q.add("a"), q.add("b"), q.add("c")
    for key in (stale, fresh, woken):
        q.pending(key)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    q.queue.unschedulable.discard(stale)  # woken, then no longer pending
    q.queue.activate([fresh])
    attempts = q.attempts()
    assert [(a.pod.key, a.only_nodes) for a in attempts] == [(fresh, None), (woken, frozenset({"n1"}))]


def test_a_pod_handed_to_the_writers_leaves_the_woken_queue() -> None:
    q = Queue()
    key = q.add("a")
    q.pending(key)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    assert q.queue.left_over()
    q.queue.binding(key)
    assert not q.queue.left_over()


def test_an_attempt_gives_its_nodes() -> None:
    q = Queue()
    pod = q.pod(q.add("a"))
    assert Attempt(pod).only_nodes is None
    assert Attempt(pod, Retry(frozenset({"n1"}), None)).only_nodes == frozenset({"n1"})
    assert Attempt(pod, Retry(None, "s")).only_nodes is None


# --- priority order (issue 38) -------------------------------------------------------------------


def test_a_pass_plans_higher_priorities_first_then_namespaces_in_turn_then_the_oldest() -> None:
    q = Queue()
    keys = [
        q.add("low-old", second=1),
        q.add("low-young", second=5),
        q.add("low", OTHER, second=2),
        q.add("mid", OTHER, priority=10, second=3),
        q.add("high", priority=1000, second=9),  # the youngest of all
        q.add("below", OTHER, priority=-1, second=0),  # the oldest of all
    ]
    q.queue.activate(keys)
    assert [key for key, _ in q.plan()] == [
        "default/high", f"{OTHER}/mid",  # by priority, whatever their age
        "default/low-old", f"{OTHER}/low", "default/low-young",  # priority 0: namespaces in turn
        f"{OTHER}/below",  # a negative priority: after every pod without one
    ]  # fmt: skip


def test_a_high_priority_pod_woken_from_unschedulable_goes_before_lower_fresh_pods() -> None:
    q = Queue()
    high = q.add("high", OTHER, priority=100, second=9)
    q.pending(high)
    lower = [q.add("a", second=1), q.add("b", second=2)]
    q.queue.activate(lower)
    q.queue.wake(Wake(retry_nodes={"n1"}))
    assert q.plan() == [(high, frozenset({"n1"})), (lower[0], None), (lower[1], None)]


def test_a_high_priority_pod_whose_backoff_ended_goes_before_lower_pods() -> None:
    q = Queue()
    high = q.add("high", OTHER, priority=100, second=9)
    q.queue.binding(high)
    assert q.queue.written(high, completed=False) == 1.0
    lower = [q.add("low", second=1), q.add("low", OTHER, second=2)]
    q.queue.activate(lower)
    assert [key for key, _ in q.plan()] == lower  # still in its pause
    q.queue.activate(lower)
    q.clock.now += 1.0
    assert [key for key, _ in q.plan()] == [high, *lower]


def test_the_woken_batch_takes_the_highest_priorities_first() -> None:
    q = Queue(batch=1)
    low, high = q.add("low", second=1), q.add("high", OTHER, priority=5, second=2)
    q.shapes.update(low="s-low", high="s-high")
    q.pending(low)
    q.pending(high)
    q.queue.wake(Wake(retry_everywhere=True))
    assert q.plan() == [(high, None)]
    assert q.plan() == [(low, None)]


def test_the_woken_batch_keeps_each_levels_turn_apart() -> None:
    """A batch that ended with a high pod of namespace b leaves the low level's turn where it was:
    its next batch starts with a, not with the namespace after b."""
    q = Queue(batch=1)
    keys = [q.add("1", "a", second=1), q.add("hi", "b", priority=5, second=2), q.add("1", "c", second=3)]
    for key in keys:
        q.pending(key)
    q.queue.wake(Wake(retry_everywhere=True))
    assert [key for key, _ in q.plan()] == ["b/hi"]
    assert [key for key, _ in q.plan()] == ["a/1"]
    assert [key for key, _ in q.plan()] == ["c/1"]


def test_namespaces_take_turns_within_a_level_whatever_higher_pods_come_between() -> None:
    """Each level keeps its own turn: a pass cut short in the low level resumes that level after
    the namespace it ended with, even when higher pods of another namespace came first."""
    q = Queue(budget=0.5)
    ticks = itertools.count()
    q.queue.clock = lambda: float(next(ticks))  # one pod per pass
    low = [q.add("1", "a", second=1), q.add("2", "a", second=2), q.add("1", "b", second=3)]
    q.queue.activate(low)
    assert [a.pod.key for a in q.attempts()] == ["a/1"]
    high = q.add("1", "c", priority=7, second=4)
    q.queue.activate([high])
    assert [a.pod.key for a in q.attempts()] == ["c/1"]  # the high pod first, though c sorts after b
    assert [a.pod.key for a in q.attempts()] == ["b/1"]  # then the low level's turn: after a
    assert [a.pod.key for a in q.attempts()] == ["a/2"]


def test_a_stream_of_higher_priority_pods_holds_a_lower_one_back_as_in_kube_scheduler() -> None:
    """No aging: while a higher pod arrives before every pass, a lower one waits (preemption,
    not fairness, is what helps it; fairness holds within a level)."""
    q = Queue(budget=0.5)
    ticks = itertools.count()
    q.queue.clock = lambda: float(next(ticks))
    low = q.add("low", "a", second=0)
    q.queue.activate([low])
    for turn in range(3):
        high = q.add(f"high-{turn}", "b", priority=1, second=turn + 1)
        q.queue.activate([high])
        assert [a.pod.key for a in q.attempts()] == [high]
    assert [a.pod.key for a in q.attempts()] == [low]


def test_the_pending_pods_by_priority_start_with_the_one_preemption_would_help() -> None:
    q = Queue()
    keys = {
        "low": q.add("low", second=1),
        "high-young": q.add("high-young", OTHER, priority=50, second=8),
        "high-old": q.add("high-old", priority=50, second=3),
        "flying": q.add("flying", priority=99, second=0),
    }
    assert q.queue.pending_by_priority() == []
    for key in keys.values():
        q.pending(key)
    q.queue.binding(keys["flying"])  # placed, being written: no longer pending
    assert [p.key for p in q.queue.pending_by_priority()] == [
        keys[n] for n in ("high-old", "high-young", "low")
    ]


def test_a_new_queue_leaves_nothing_over_and_a_pod_no_longer_known_has_priority_0() -> None:
    q = Queue()
    assert q.queue.left_over() is False and q.queue.cut_short is False
    assert q.queue.priority("default/gone") == 0  # dropped when reached, wherever it sorts
    assert q.queue.priority(q.add("a", priority=5)) == 5
