"""``PodQueue``: every pod the worker has yet to plan, and what each waiting pod waits for.

Modelled on kube-scheduler's scheduling queue; one object holds what a pod's walk through the
worker leaves behind, so the worker only asks it for the next pass and tells it outcomes:

* **active** -- pods to plan in full: a change to the pod itself or its claims, a resync, a
  shared claim that was being written, a backoff that ended;
* **woken** -- pending pods a cluster change may help, each with the nodes to try (``None``:
  every node; ``retries.PendingRetries``). A bounded batch per pass, namespaces in turn, and
  pods of one shape that stayed pending since the last helpful change are skipped (``stuck``),
  so a tenant's thousand pending pods cost neither minutes of the worker per event nor another
  tenant's turn (issue 27; docs/performance.md, "The pending storm");
* **backoff** -- pods whose writes failed wait ``retries.CommitBackoff``'s growing pause, then
  are planned in full;
* **unschedulable** -- pending pods, woken only by a change their reason says may help (the
  QueueingHint): room on a node for ``Unschedulable``, their namespace's quota for
  ``GpuQuotaExceeded``, a DeviceClass their claims ask for; a pod whose reason is unknown by any
  change, and every pending pod at the periodic resync (kube-scheduler's flush);
* **in flight** -- pods whose placement is being written: no change requeues them while their
  writes run, and a failed write sends them to backoff, never to unschedulable (the change that
  arrived meanwhile is then seen by their full plan).

**Order.** Every pass plans its pods by priority (``PodView.priority``: the PriorityClass value
admission wrote into ``spec.priority``; higher first), then by arrival, as kube-scheduler's
activeQ does (PrioritySort): a pod that arrives, ends its backoff or is woken while lower-priority
pods wait is planned in the next pass before them, and the woken batch takes the highest
priorities first. Namespaces take turns within one priority level only (``retries.fair_order``),
so a steady stream of higher-priority pods holds lower ones back for as long as it lasts: what
kube-scheduler does too, whose answer is preemption, not aging. ``pending_by_priority`` is where
preemption starts: the pods that could not be placed, most urgent first.

The reports (``pending.PendingReports``: the reason and message last reported per pod) are the
queue's too: a pod's reason decides what wakes it. The I/O of a failure (fence, event,
condition) is ``failure.FailureHandler``'s, after the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from dra_driver.controller.cache import ClusterCache, Wake
from dra_driver.controller.metrics import PendingGroup
from dra_driver.controller.pending import PendingReports, Report
from dra_driver.controller.reasons import Reason
from dra_driver.controller.retries import (
    PENDING_RETRIES_PER_PASS,
    CommitBackoff,
    PendingRetries,
    Retry,
    Turns,
    fair_order,
)
from dra_driver.resource.objects import PodView

#: A pass stops planning once it has run this long (wall clock); the pods it did not reach are
#: planned next pass, which starts with the namespace after the last one planned. With pods taken
#: namespaces in turn, a pod waits for at most one pod of each other namespace with work queued
#: (each pod's selectors bounded by their cost budget, dra_driver/cel/cost.py), not for every pod
#: one tenant created before it (issue 34; docs/multi-tenant.md, "Planner fairness").
PASS_BUDGET_SECONDS = 0.5

Shape = tuple[str, frozenset[str] | None]


class Step(StrEnum):
    """What the worker did with a pod it was given (``PodQueue.done`` files it accordingly)."""

    BINDING = "binding"  # its allocations (or just its gate) handed to the binder: in flight
    PENDING = "pending"  # cannot be placed now; the reason is on the pod: unschedulable
    WAITING = "waiting"  # a template claim does not exist yet: its creation wakes the pod up
    RETRY = "retry"  # plan again next pass (a shared claim is being written, an API error)
    SKIP = "skip"  # nothing for us to do


@dataclass(frozen=True, slots=True)
class Attempt:
    """A pod the pass plans now: in full (``retry`` None), or a woken pending pod on its nodes."""

    pod: PodView
    retry: Retry | None = None

    @property
    def only_nodes(self) -> frozenset[str] | None:
        return None if self.retry is None else self.retry.only_nodes


class PodQueue:
    """Active, woken, backoff, unschedulable and in-flight pods (by key), and their reports."""

    def __init__(
        self,
        cache: ClusterCache,
        shape: Callable[[PodView], str | None],
        *,
        batch: int = PENDING_RETRIES_PER_PASS,
        backoff: CommitBackoff | None = None,
        pass_budget: float = PASS_BUDGET_SECONDS,
        clock: Callable[[], float],
        skipped: Callable[[], None] = lambda: None,
    ) -> None:
        self.cache = cache
        self._shape = shape
        self.batch_size = max(1, batch)
        self.pass_budget = pass_budget
        #: The pass budget's clock (a test steps it).
        self.clock = clock
        self._skipped = skipped
        self._active: set[str] = set()
        self.woken = PendingRetries()
        #: Pods whose writes failed wait a little longer each time before the next attempt.
        self.backoff = backoff or CommitBackoff()
        self.unschedulable: set[str] = set()
        #: (shape, nodes) of woken pods that stayed pending (nodes None: all nodes), since the last
        #: change that could help a pending pod: woken pods of that shape and nodes are skipped,
        #: in this pass and the next ones, as they would stay pending too.
        self.stuck: set[Shape] = set()
        self.in_flight: set[str] = set()
        self.reports = PendingReports()
        #: Per priority level, the namespace the last pass planned last (the next starts after it).
        self._turns = Turns()
        self.cut_short = False  # the last pass left pods for the next one

    # --- what the worker's loop asks ---------------------------------------------------------------
    def busy(self) -> bool:
        """Pods to plan in full are waiting (some may be in backoff): the worker polls sooner."""
        return bool(self._active)

    def left_over(self) -> bool:
        """The last pass left work (woken pods past its batch, or pods past its budget): the next
        pass runs at once."""
        return bool(self.woken) or self.cut_short

    # --- in: changes -------------------------------------------------------------------------------
    def activate(self, keys: Iterable[str]) -> None:
        """These pods changed (or their claims did): plan them in full next pass."""
        self._active.update(keys)

    def wake(self, wake: Wake) -> None:
        """Move to ``woken`` the pending pods a change may help; forget the pods that are gone."""
        self._active |= wake.pods
        for uid in wake.deleted_pods:
            self.reports.forget(uid)
        if wake.retry_everywhere:
            self.retry_all()
        if wake.retry_nodes:
            self.retry_on(wake.retry_nodes)
        if wake.retry_quota:
            self.retry_quota(wake.retry_quota)
        for name in sorted(wake.retry_classes):
            self.retry_class(name)

    def resync(self) -> None:
        """The periodic flush: every pending pod is woken everywhere, every other gated pod planned.

        One pod per shape that stays pending: at 5,000 nodes one full pending decision costs about
        85 ms, so re-planning 1,000 pending pods one by one would take over a minute of CPU every
        resync (hack/bench_storm.py); woken pods are batched per pass.
        """
        self.retry_all()
        for key, pod in self.cache.pods.items():
            if key not in self.unschedulable and pod.gated:
                self._active.add(key)

    # --- out: one pass -----------------------------------------------------------------------------
    def attempts(self) -> Iterator[Attempt]:
        """The pods this pass plans, highest priority first, namespaces in turn within a priority,
        until the pass budget runs out.

        Pods past the budget stay active for the next pass (woken ones stay woken), right after
        the events that arrive meanwhile: one namespace's costly pods cannot hold the others.
        The caller tells ``done`` (or ``retry``) what became of each pod it is given.
        """
        fresh, self._active = self._active, set()
        batch = self._batch(fresh)
        order = fair_order(fresh | batch.keys(), self._created, self._turns.after, self.priority)
        started, self.cut_short = self.clock(), False
        for position, key in enumerate(order):
            if position and self.clock() - started > self.pass_budget:
                self._active |= {later for later in order[position:] if later in fresh}
                self.cut_short = True
                return
            self._turns.served(key, self.priority(key))
            if key in self.in_flight:
                continue  # looked at again when its writes complete
            pod = self.cache.pods.get(key)
            if pod is None:
                self.backoff.forget(key)
                self._not_pending(key)
                continue
            if self.backoff.waiting(key):
                self._active.add(key)  # its last writes failed: planned again once its pause ends
                continue
            retry = batch.get(key)  # None for a fresh pod: the batch leaves them out
            self.woken.discard(key)  # planned now: what it was woken for is looked at
            if retry is not None and self.stays_pending(retry):
                self._skipped()
                continue  # an older pod of the same shape just stayed pending: so would this one
            yield Attempt(pod, retry)

    def done(self, attempt: Attempt, step: Step) -> None:
        """File the pod by what its plan came to."""
        key = attempt.pod.key
        if step is Step.PENDING:
            self.unschedulable.add(key)
            retry = attempt.retry
            if retry is not None and retry.shape is not None:
                self.stuck.add((retry.shape, retry.only_nodes))
        elif step is not Step.BINDING:
            self._not_pending(key)
            if step is Step.RETRY:
                self._active.add(key)

    def retry(self, key: str) -> None:
        """Planning or reporting the pod met an API error: plan it again in full next pass."""
        self._active.add(key)

    # --- the binding cycle -------------------------------------------------------------------------
    def binding(self, key: str) -> None:
        """The pod's placement is handed to the writers: in flight until ``written``."""
        self._not_pending(key)
        self.in_flight.add(key)

    def written(self, key: str, completed: bool) -> float | None:
        """The pod's writes ended; when they did not complete, it backs off (how long, in seconds)
        and is planned in full after that."""
        self.in_flight.discard(key)
        if not completed:
            self._active.add(key)
            return self.backoff.failed(key)
        self.backoff.forget(key)
        self.stuck.clear()  # the capacity it had assumed may be free again
        return None

    # --- reports (what the failure handler and the metrics read) -----------------------------------
    def record_failure(self, pod: PodView, reason: Reason, message: str) -> Report | None:
        """Remember why ``pod`` waits; the report to make when that changed, else None."""
        return self.reports.record(pod, reason, message)

    def placed(self, pod: PodView) -> None:
        """The pod is placed: it no longer waits for anything."""
        self.reports.clear(pod.uid)

    def new_warnings(self, pod: PodView, warnings: Iterable[str]) -> list[str]:
        """The warnings about ``pod``'s input not reported yet (now counted as reported)."""
        return self.reports.new_warnings(pod.uid, warnings)

    def reason(self, pod: PodView) -> str | None:
        """Why the pod waits, as last reported (None: not reported, or no longer waiting)."""
        return self.reports.reason(pod.uid)

    def pending_by_priority(self) -> list[PodView]:
        """The pods that could not be placed (unschedulable, not being written), most urgent
        first: the highest priority, then the oldest (namespaces take no turns here: among pods
        of one priority, kube-scheduler too lets the one queued first preempt first). The first is
        the pod preemption would make room for."""
        pods = [
            pod
            for key in self.unschedulable - self.in_flight
            if (pod := self.cache.pods.get(key)) is not None
        ]
        return sorted(pods, key=lambda pod: (-pod.priority, pod.created, pod.key))

    def pending_groups(self) -> dict[str, PendingGroup]:
        """The waiting pods by reason: how many, and the oldest's creation (the metrics)."""
        return self.reports.groups(self.cache.pod_by_uid)

    # --- the woken batch ---------------------------------------------------------------------------
    def _batch(self, fresh: set[str]) -> dict[str, Retry]:
        """The woken pods this pass replans (``fresh`` ones are planned in full anyway).

        The woken queue's order (highest priority first, then namespaces in turn), up to
        ``batch_size`` plans: pods of one shape woken for the same nodes count once, since all but
        the first are skipped when it stays pending.
        """
        batch: dict[str, Retry] = {}
        groups: set[Shape] = set()
        for key in self.woken.order(self._created, self.priority):
            pod = self.cache.pods.get(key)
            if pod is None or key not in self.unschedulable or key in self.in_flight:
                self.woken.discard(key)  # not pending any more (a failed write activates it)
                continue
            if key in fresh:
                continue
            retry = self._retry_of(pod)
            if self.stays_pending(retry):
                self._skipped()
                self.woken.discard(key)
                continue
            group = (key if retry.shape is None else retry.shape, retry.only_nodes)
            if group not in groups:
                if len(groups) == self.batch_size:
                    break
                groups.add(group)
            batch[key] = retry
            self.woken.ended_with(key, self.priority(key))
        return batch

    def _retry_of(self, pod: PodView) -> Retry:
        """Where to plan a woken pod: only its woken nodes if it fitted nowhere (a pod pending
        for another reason, a quota say, is planned everywhere), and its shape (None: unsure)."""
        nodes = self.woken.scope(pod.key)
        if self.reports.reason(pod.uid) != Reason.UNSCHEDULABLE:
            nodes = None
        try:
            shape = self._shape(pod)
        except Exception:  # its plan (in the pass, where errors are handled) will say what is wrong
            shape = None
        return Retry(nodes, shape)

    def stays_pending(self, retry: Retry) -> bool:
        """Whether a pod of this shape stayed pending on these nodes (or on all) since the last
        change that could help: capacity has only shrunk since, so this pod would stay pending."""
        return retry.shape is not None and not self.stuck.isdisjoint(
            {(retry.shape, None), (retry.shape, retry.only_nodes)}
        )

    def priority(self, key: str) -> int:
        """The pod's priority (0 for a pod no longer known: it is dropped when reached)."""
        pod = self.cache.pods.get(key)
        return pod.priority if pod is not None else 0

    def _created(self, key: str) -> str:
        pod = self.cache.pods.get(key)
        return pod.created if pod is not None else ""

    def _not_pending(self, key: str) -> None:
        self.unschedulable.discard(key)
        self.woken.discard(key)

    # --- hints: which pending pods a change helps ----------------------------------------------------
    def _wake_pending(
        self, helped: Callable[[PodView, str], bool], nodes: frozenset[str] | None = None
    ) -> None:
        """Wake the pending pods a change may help (``helped``: by the pod and its reason) to be
        planned on ``nodes`` (None: every node). A pod whose pending reason is not known is woken
        everywhere, whatever changed: when unsure, plan it again."""
        self.stuck.clear()  # what stayed pending before this change may not any more
        woken: list[tuple[str, frozenset[str] | None]] = []
        for key in self.unschedulable:
            pod = self.cache.pods.get(key)
            if pod is None:
                continue
            reason = self.reports.reason(pod.uid)
            if reason is None:
                woken.append((key, None))
            elif helped(pod, reason):
                woken.append((key, nodes))
        self.woken.add(woken)

    def retry_all(self) -> None:
        """Something changed that may help any pending pod anywhere (or we cannot tell)."""
        self._wake_pending(lambda _pod, _reason: True)

    def retry_on(self, nodes: Iterable[str]) -> None:
        """Room appeared on ``nodes`` (capacity released, the Node or its devices changed): the
        pods that fitted on no node are planned there alone. Pods pending for another reason (a
        quota, a missing class, an invalid request) would be refused again for that reason."""
        scope = frozenset(nodes)
        if scope:  # e.g. another driver's slices changed: no room anywhere
            self._wake_pending(lambda _pod, reason: reason == Reason.UNSCHEDULABLE, scope)

    def retry_quota(self, namespaces: Iterable[str]) -> None:
        """Quota may have room in ``namespaces`` (one changed, or GPUs were released there): the
        pods they refused are planned again, everywhere (they fitted somewhere before)."""
        wanted = frozenset(namespaces)
        self._wake_pending(lambda pod, reason: reason == Reason.QUOTA_EXCEEDED and pod.namespace in wanted)

    def retry_class(self, name: str) -> None:
        """DeviceClass ``name`` changed: the pods whose claims ask for it are planned everywhere."""

        def uses_class(pod: PodView, _reason: str) -> bool:
            return any(
                claim is not None and name in claim.request_classes.values()
                for _, claim in self.cache.pod_claims(pod)
            )

        self._wake_pending(uses_class)
