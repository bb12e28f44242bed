"""Why each pending pod waits, as last reported: the pod queue's memory of its pending reports.

A pod is reported (event, condition, metric: ``failure.py``) when its reason or message changes,
not on every plan; the reason also decides which changes wake it (``pod_queue.py``) and feeds the
pending-pods metrics. Warnings about a pod's input are reported once per pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dra_driver.controller.metrics import PendingGroup, created_epoch
from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import PodView

#: HAMi's "<n>/<m> <Reason>" wording: the first such reason labels the failure metric.
_HAMI_REASON = re.compile(r"\d+/\d+ ([A-Za-z]+)")


@dataclass(frozen=True, slots=True)
class Report:
    """A pending report to make: the condition's reason, the message, and the metric's label."""

    reason: Reason
    message: str
    metric_reason: str


class PendingReports:
    """Pod uid -> (message, reason) last reported, and the warnings reported per pod."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[str, Reason]] = {}
        self._warned: dict[str, set[str]] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._pending

    def record(self, pod: PodView, reason: Reason, message: str) -> Report | None:
        """Remember why ``pod`` is pending; the report to make when that changed, else None."""
        previous = self._pending.get(pod.uid)
        self._pending[pod.uid] = (message, reason)
        if previous is not None and previous[0] == message:
            return None
        hami = _HAMI_REASON.search(message)
        return Report(reason, message, hami.group(1) if hami else reason)

    def clear(self, uid: str) -> bool:
        """Forget why the pod was pending; whether it was (its condition then says allocated)."""
        return self._pending.pop(uid, None) is not None

    def forget(self, uid: str) -> None:
        """The pod is gone."""
        self._pending.pop(uid, None)
        self._warned.pop(uid, None)

    def reason(self, uid: str) -> Reason | None:
        """Why the pod is pending (``Unschedulable``, ``GpuQuotaExceeded``, ...), or None."""
        entry = self._pending.get(uid)
        return None if entry is None else entry[1]

    def new_warnings(self, uid: str, warnings: Iterable[str]) -> list[str]:
        """The warnings not reported yet for this pod (now counted as reported)."""
        seen = self._warned.setdefault(uid, set())
        fresh = [warning for warning in warnings if warning not in seen]
        seen.update(fresh)
        return fresh

    def groups(self, pod_by_uid: Callable[[str], PodView | None]) -> dict[str, PendingGroup]:
        """The pods held pending, by their condition's reason: how many, and the oldest's creation."""
        counts: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for uid, (_, reason) in self._pending.items():
            counts[reason] = counts.get(reason, 0) + 1
            pod = pod_by_uid(uid)
            created = created_epoch(pod.created) if pod is not None else None
            if created is not None:
                oldest[reason] = min(created, oldest.get(reason, created))
        return {reason: PendingGroup(count, oldest.get(reason)) for reason, count in counts.items()}
