"""``FailureHandler``: what happens to a pod that cannot be placed, after the pass that planned it.

Like kube-scheduler's ``handleSchedulingFailure``, one place owns a failure: the queue learns the
reason at once (``PodQueue.record_failure``: it decides which changes wake the pod, and whether the
reason or message changed since the last report), and the API writes wait until the pass has
planned every pod it could (``handle``), so a pass's planning never waits on them:

1. the pod's unallocated claims of ours are fenced (``Binder.fence``: a predecessor's allocation
   write still in flight can no longer land; one that landed already is counted in the cache);
2. when its reason or message changed: the failure metric (labelled by HAMi's first reason),
   a log line, a Warning ``FailedAllocation`` event and the pod's condition (False, the reason),
   whose written pod replaces the cached one.

Warnings about a pod's input (an unknown policy name) are Warning events too, once per pod and text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dra_driver.controller.allocator import AllocateOutcome, Placed, Unschedulable
from dra_driver.controller.binder import Binder, kept_view
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.pending import Report
from dra_driver.controller.pod_queue import PodQueue
from dra_driver.controller.reasons import EventReason, Reason
from dra_driver.kube.errors import KubeError
from dra_driver.resource.objects import PodView

log = logging.getLogger("dra_driver.controller")


@dataclass(frozen=True, slots=True)
class Failure:
    """A pod that waits: its claims to fence, and the report to make (None: made already)."""

    pod: PodView
    report: Report | None


class FailureHandler:
    """Failures and warnings recorded while planning; their writes made by ``handle``."""

    def __init__(
        self, cache: ClusterCache, binder: Binder, queue: PodQueue, metrics: ControllerMetrics
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.queue = queue
        self.metrics = metrics
        self._failures: list[Failure] = []
        self._warnings: list[tuple[PodView, str]] = []

    def __bool__(self) -> bool:
        return bool(self._failures or self._warnings)

    # --- on the planning path: no API calls --------------------------------------------------------
    def decided(self, pod: PodView, outcome: AllocateOutcome) -> None:
        """What a decision leaves to report: warnings about the pod's input, and why it waits
        unless the plan was a quiet retry on a few nodes (the pod keeps its last full reason)."""
        if isinstance(outcome, Placed | Unschedulable):
            self.warn(pod, outcome.warnings)
        if isinstance(outcome, Unschedulable) and not outcome.quiet:
            self.failed(pod, outcome.reason, outcome.message)

    def failed(self, pod: PodView, reason: Reason, message: str) -> None:
        """``pod`` waits for ``reason``: the queue knows at once, the writes follow the pass."""
        self._failures.append(Failure(pod, self.queue.record_failure(pod, reason, message)))

    def quiet(self, pod: PodView) -> None:
        """``pod`` waits without a report yet (a gang within its timeout, gangs.py): its claims
        are fenced all the same, so a predecessor's allocation write can no longer land."""
        self._failures.append(Failure(pod, None))

    def warn(self, pod: PodView, warnings: tuple[str, ...]) -> None:
        """Warnings about ``pod``'s input; each is reported once per pod."""
        self._warnings += [(pod, warning) for warning in self.queue.new_warnings(pod, warnings)]

    # --- after the pass ------------------------------------------------------------------------------
    def handle(self) -> None:
        """Make the writes of every failure and warning recorded since the last call, in order.

        One pod's failing report stops no other: an API error plans the pod again next pass (its
        fence and report are then retried as needed); anything else is logged and counted.
        """
        warnings, self._warnings = self._warnings, []
        for pod, warning in warnings:
            self.binder.event(pod, "Warning", EventReason.UNKNOWN_POLICY, warning)
        failures, self._failures = self._failures, []
        for failure in failures:
            try:
                self._handle(failure)
            except KubeError as err:
                log.warning("pod %s: pending report not made: %s", failure.pod.key, err)
                self.queue.retry(failure.pod.key)
            except Exception:  # reporting must not become the next poison
                log.exception("pod %s: pending reason not reported", failure.pod.key)
                self.metrics.unexpected_errors.labels("Pod").inc()

    def _handle(self, failure: Failure) -> None:
        """Read the pod's claims from the cache, make the writes, then fold what they returned."""
        pod, report = failure.pod, failure.report
        claims = [claim for _, claim in self.cache.pod_claims(pod) if claim is not None]
        seen = self.binder.fence(claims)
        written = None
        if report is not None:
            self.metrics.failures.labels(report.metric_reason).inc()
            log.warning("pod %s pending: %s", pod.key, report.message)
            self.binder.event(pod, "Warning", EventReason.FAILED_ALLOCATION, report.message)
            written = self.binder.set_condition(pod, "False", report.reason, report.message)
        for claim in seen:
            self.cache.wrote(claim)
        if written is None:
            return
        view = kept_view(written)  # slim, as the informer keeps it: the cache holds it from now on
        cached = self.cache.pods.get(pod.key)
        if cached is not None and cached.uid == view.uid:  # not gone, nor replaced by a namesake
            self.cache.pods[pod.key] = view
