"""The parts of the pod queue (``pod_queue.py``) that keep order and time.

``PendingRetries``: the woken pending pods, each with the nodes to try (``None``: all), taken a
bounded batch per pass, namespaces in turn, so one tenant's pending pods can neither cost the
single worker minutes per event nor delay another tenant's pods (issue 27; the figures are in
docs/performance.md, "The pending storm"). ``fair_order``: the order a pass plans its pods in.
``CommitBackoff``: how long a pod whose writes failed waits.

Both orders are by priority first (``PodView.priority``, higher first; issue 38), then fair
between namespaces within one priority level, each namespace's pods by arrival. Each level keeps
its own place in the namespace rotation (``Turns``), so a pass that higher-priority pods cut
short does not cost a lower level's namespace its turn once that level is reached again.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

#: Pending pods replanned per pass at most (pods skipped for their shape are not counted). At 5,000
#: nodes a pending decision over every node costs about 85 ms: 16 of them keep a pass near 1.4 s,
#: so new pods, claim releases and other tenants' retries wait that long at most, not a backlog.
PENDING_RETRIES_PER_PASS = 16

#: A pod's priority by key (``PodView.priority``; 0 for a pod no longer known).
Priority = Callable[[str], int]


def no_priority(_key: str) -> int:
    """Every pod at one level: the namespace rotation alone orders them."""
    return 0


def namespace_of(key: str) -> str:
    return key.partition("/")[0]


class Turns:
    """Where each priority level's namespace rotation stands: the namespace its last planned pod
    was in (the level's next turn starts with the namespace after it)."""

    def __init__(self) -> None:
        self._last: dict[int, str] = {}

    def after(self, level: int) -> str:
        return self._last.get(level, "")

    def served(self, key: str, level: int) -> None:
        self._last[level] = namespace_of(key)


def by_priority(keys: Iterable[str], priority: Priority) -> list[tuple[int, list[str]]]:
    """``keys`` grouped by priority, the highest level first (each level's keys as given)."""
    levels: dict[int, list[str]] = {}
    for key in keys:
        levels.setdefault(priority(key), []).append(key)
    return [(level, levels[level]) for level in sorted(levels, reverse=True)]


def namespaces_in_turn(
    keys: Iterable[str], arrival: Callable[[str], tuple[object, ...]], after: str
) -> list[str]:
    """``keys`` with namespaces interleaved round-robin, starting with the first namespace after
    ``after``, each namespace's pods by ``arrival`` (earliest first)."""
    by_namespace: dict[str, list[str]] = {}
    for key in keys:
        by_namespace.setdefault(namespace_of(key), []).append(key)
    names = sorted(by_namespace)
    start = bisect.bisect_right(names, after)
    columns = [sorted(by_namespace[name], key=arrival) for name in names[start:] + names[:start]]
    return [key for row in itertools.zip_longest(*columns) for key in row if key is not None]


class PendingRetries:
    """Pending pods queued for another plan, each with the nodes where it may fit now.

    Kept across passes: each pass takes a bounded batch in ``order``: higher priorities first, and
    within a priority namespaces in turn (starting after the one the level's last batch ended
    with), each namespace's pods in the order they were queued, those queued by one change oldest
    first. A pod of another namespace at its priority therefore waits for at most one queued pod
    per namespace, however many one tenant has queued; and a pod queued again, by a
    later change, waits behind those still queued, so changes arriving every pass cannot keep the
    same few pods at the front. Nothing is dropped: a pod leaves the queue when it is planned or
    no longer pending.
    """

    def __init__(self) -> None:
        self._scopes: dict[str, frozenset[str] | None] = {}  # pod key -> nodes (None: every node)
        self._since: dict[str, int] = {}  # pod key -> the change that queued it
        self._changes = 0
        self._turns = Turns()  # per priority level, the namespace the last batch ended with

    def __len__(self) -> int:
        return len(self._scopes)

    def __contains__(self, key: object) -> bool:
        return key in self._scopes

    def add(self, pods: Iterable[tuple[str, frozenset[str] | None]]) -> None:
        """Queue the pods one change may help, each for its nodes (None: everywhere), besides
        whatever a pod is queued for already (it keeps its place then)."""
        self._changes += 1
        for key, nodes in pods:
            if key in self._scopes:
                queued = self._scopes[key]
                nodes = None if queued is None or nodes is None else queued | nodes
            else:
                self._since[key] = self._changes
            self._scopes[key] = nodes

    def scope(self, key: str) -> frozenset[str] | None:
        """The nodes ``key`` is queued for (None: every node)."""
        return self._scopes[key]

    def discard(self, key: str) -> None:
        self._scopes.pop(key, None)
        self._since.pop(key, None)

    def order(self, created: Callable[[str], str], priority: Priority = no_priority) -> list[str]:
        """The queue, highest ``priority`` first; within a priority namespaces interleaved
        round-robin, each namespace's pods in the order they were queued, those of one change
        oldest (``created``) first."""
        return [
            key
            for level, keys in by_priority(self._scopes, priority)
            for key in namespaces_in_turn(
                keys, lambda key: (self._since[key], created(key), key), self._turns.after(level)
            )
        ]

    def ended_with(self, key: str, level: int = 0) -> None:
        """The batch ended with ``key`` (of priority ``level``): that level's next batch starts
        with the namespace after its own."""
        self._turns.served(key, level)


def fair_order(
    keys: Iterable[str],
    created: Callable[[str], str],
    after: str | Callable[[int], str],
    priority: Priority = no_priority,
) -> list[str]:
    """The pods a pass plans: the highest ``priority`` first (kube-scheduler's PrioritySort);
    within one priority, namespaces interleaved round-robin starting with the first namespace
    after ``after`` (the one that level's last pass ended with: one namespace for every level, or
    by level, ``Turns.after``), each namespace's pods oldest (``created``) first.

    Fairness holds within a priority level only, as in kube-scheduler: a steady stream of
    higher-priority pods is planned before every lower one however long that waits (its answer
    is preemption, not aging), and a namespace's high-priority pods go before another
    namespace's lower ones. Admission decides who may use a high PriorityClass (a ResourceQuota
    with a ``scopeSelector`` on ``PriorityClass`` caps each namespace's).
    """
    start = after if callable(after) else lambda _level: after
    return [
        key
        for level, level_keys in by_priority(keys, priority)
        for key in namespaces_in_turn(level_keys, lambda key: (created(key), key), start(level))
    ]


class Retry(NamedTuple):
    """A queued pending pod taken into this pass: the nodes to plan it on, and its shape."""

    only_nodes: frozenset[str] | None
    shape: str | None


class CommitBackoff:
    """Pods whose writes failed wait before they are planned and written again.

    A write the API server refuses (an admission policy, a quota, RBAC) fails the same way on the
    next pass: without a pause the worker re-planned and re-wrote such a pod every few
    milliseconds (seen on the real cluster). The pause starts at ``initial`` and doubles per
    consecutive failure up to ``maximum`` (kube-scheduler backs off pods 1-10 s); a pod whose
    writes succeed, or that goes away, starts from nothing again.
    """

    def __init__(
        self, initial: float = 0.2, maximum: float = 10.0, clock: Callable[[], float] | None = None
    ) -> None:
        self.initial, self.maximum = initial, maximum
        self._clock = clock or time.monotonic
        self._failures: dict[str, tuple[int, float]] = {}  # pod key -> (consecutive failures, until)

    def failed(self, key: str) -> float:
        """Record a failed commit of ``key``; returns how long it now waits."""
        count = self._failures.get(key, (0, 0.0))[0] + 1
        delay: float = min(self.maximum, self.initial * 2.0 ** (count - 1))
        self._failures[key] = (count, self._clock() + delay)
        return delay

    def waiting(self, key: str) -> bool:
        entry = self._failures.get(key)
        return entry is not None and entry[1] > self._clock()

    def forget(self, key: str) -> None:
        """Written, or gone: the next failure starts from ``initial`` again."""
        self._failures.pop(key, None)
