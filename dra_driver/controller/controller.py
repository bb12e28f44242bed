"""``Controller``: the worker that drives the cache, the allocator, the binder and the releaser.

Informer threads only append changes to a queue; the worker applies them to the cluster cache
(``cache.py``), which says whom each change wakes; it releases what the releaser's queue holds
(``releaser.py``), then plans the pods the pod queue gives it (``pod_queue.py``: the pods that
changed and a bounded batch of the pending ones a change may help, namespaces in turn) through
``schedule_one``: the allocator decides (``allocator.py``, no API calls), the cache assumes the
decision, and the binder writes it on a small writer pool (``binder.py``) so planning overlaps
API round trips; finished writes are folded back into the cache on the worker thread and their
outcome told to the queue. A pod that cannot be placed is the failure handler's
(``failure.py``): its fence, event and condition are written after the pass. A replica that
does not lead keeps its caches warm (a failover takes effect at once) and writes nothing.

Why a standby lists and watches everything too, as kube-scheduler's does by default (it starts
its informers and waits for their sync before it runs for the lease; ``DelayCacheUntilActive``
is its opt-out): a standby exists to become the leader, so its memory limit must fit the
leader's caches anyway (both replicas run one pod spec), and a cold standby would only lower
what it uses while it waits. What it would cost is the failover: after winning the lease it
would have to list every pod, claim, slice and node before its first decision (about two
minutes of wall clock for 5,000 nodes and 50,000 pods on a loaded 2-CPU machine,
hack/bench_memory.py), on top of the lease's expiry, with every gated pod waiting. The caches
are what our work needs (dra_driver/controller/slim.py: about 550 MiB at that size, where the
API's whole objects took 3 GiB), so keeping them warm is the better trade.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from dra_driver.config import ControllerDefaults
from dra_driver.controller.allocator import (
    AllocateOutcome,
    Allocator,
    ClaimBusy,
    Placed,
    Unschedulable,
    WaitingForClaim,
)
from dra_driver.controller.binder import Binder, BindOutcome, BindResult
from dra_driver.controller.binding import BindingPool
from dra_driver.controller.cache import ClusterCache, Wake
from dra_driver.controller.failure import FailureHandler
from dra_driver.controller.gang_refs import GROUP_RESOURCES, event_kind
from dra_driver.controller.gangs import DEFAULT_GANG_TIMEOUT, GangCoordinator
from dra_driver.controller.hami_templates import HamiTemplates
from dra_driver.controller.ledger import LedgerChanges
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.pod_queue import PASS_BUDGET_SECONDS, Attempt, PodQueue, Step
from dra_driver.controller.preemptor import Preemptor
from dra_driver.controller.reasons import Reason
from dra_driver.controller.releaser import Releaser
from dra_driver.controller.retries import PENDING_RETRIES_PER_PASS, CommitBackoff
from dra_driver.controller.slim import SliceParts, keep_pod, placement_node, slice_selector
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    KubeApi,
    Obj,
)
from dra_driver.kube.errors import KubeError
from dra_driver.kube.events import TokenBucket
from dra_driver.kube.watch import Informer
from dra_driver.resource.objects import PodView

log = logging.getLogger(__name__)
__all__ = ["PASS_BUDGET_SECONDS", "WATCHED", "WRITE_WORKERS", "Controller", "Step", "api_connections"]
#: Threads that write placements (claims' allocations, pods' gates) in parallel (binding.py).
WRITE_WORKERS = 4
#: The resources the controller watches, one informer each.
WATCHED = (DEVICE_CLASSES, NODES, RESOURCE_SLICES, RESOURCE_CLAIMS, PODS, RESOURCE_QUOTAS, GPU_QUOTAS)


def api_connections(write_workers: int = WRITE_WORKERS) -> int:
    """Connections to the API server the controller's client keeps open: one for each thread that
    may hold one at the same time. Each informer holds its watch open for minutes (or lists, on
    the same thread); each writer does its writes one at a time; the worker (fences, pending
    reports, quota status, HAMi templates), the event sender and the leader elector one each.
    With fewer, the client's default (5 per CPU: 10 on 2 CPUs) left 3 connections beside the 7
    watches, and every further concurrent request opened a connection with a new TLS handshake
    and dropped it after one use."""
    return len(WATCHED) + len(GROUP_RESOURCES) + write_workers + 3


class Controller:
    def __init__(
        self,
        kube: KubeApi,
        driver: str,
        defaults: ControllerDefaults | None = None,
        *,
        is_leader: Callable[[], bool] | None = None,
        identity: str = "hami-dra-controller",
        resync_seconds: float = 30.0,
        metrics: ControllerMetrics | None = None,
        write_workers: int = WRITE_WORKERS,
        pending_batch: int = PENDING_RETRIES_PER_PASS,
        backoff: CommitBackoff | None = None,
        background_events: bool = False,
        normal_event_budget: TokenBucket | None = None,
        pass_budget: float = PASS_BUDGET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        hami_templates: HamiTemplates | None = None,
        gang_timeout: float = DEFAULT_GANG_TIMEOUT,
        preemption: bool = True,
    ) -> None:
        self.kube = kube
        #: Makes the templates HAMi-translated pods wait for (None: translation is off).
        self.hami_templates = hami_templates
        self.driver = driver
        self.metrics = metrics or ControllerMetrics()
        self.is_leader = is_leader or (lambda: True)
        self.cache = ClusterCache(driver, self.metrics)
        self.allocator = Allocator(self.cache, defaults or ControllerDefaults(), self.metrics)
        self.binder = Binder(
            kube,
            driver,
            self.metrics,
            identity=identity,
            still_leading=lambda: self.is_leader(),
            background_events=background_events,
            normal_event_budget=normal_event_budget,
        )
        self.releaser = Releaser(kube, self.cache, self.binder, self.metrics)
        #: Every pod yet to plan, and what each waiting pod waits for (``pod_queue.py``).
        self.queue = PodQueue(
            self.cache,
            self._pending_shape,
            batch=pending_batch,
            backoff=backoff,
            pass_budget=pass_budget,
            clock=clock,
            skipped=self.metrics.pending_skipped.inc,
        )
        self.failures = FailureHandler(self.cache, self.binder, self.queue, self.metrics)
        #: Share-aware preemption for pods and gangs that fit nowhere (``preemptor.py``); with
        #: ``preemption`` off it only releases holds a previous run left.
        self.preemptor = Preemptor(
            kube, self.cache, self.allocator, self.binder, self.queue, self.metrics, enabled=preemption
        )
        #: Pods of one group placed all or nothing (``gangs.py``).
        self.gangs = GangCoordinator(
            kube,
            self.cache,
            self.allocator,
            self.queue,
            self.failures,
            self.binder,
            self.metrics,
            self._submit,
            self._waiting_for_claim,
            timeout=gang_timeout,
            clock=clock,
            pass_number=lambda: self.passes,
            waits=self.preemptor.gang_waits,
            member_placed=self.preemptor.placed,
        )
        self.resync_seconds = resync_seconds
        self._events: list[tuple[str, Obj | None, Obj | None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._was_leader = False
        self._last_resync = 0.0
        self._series_stale = True  # the per-card series are computed in full next time
        self._series_published = False  # this term has not published them yet
        self._metrics_at = 0.0
        self.passes = 0
        #: Binds in flight on the writer threads (none: each bind runs at once on the worker).
        self.binding = BindingPool(self.binder.bind, write_workers, self._wake)
        # What each informer keeps is cut down as objects arrive (dra_driver/controller/slim.py):
        # every pod is watched (node fit counts every bound pod's requests) but only those that may
        # be ours are kept whole; nodes keep what placement reads; slices only our driver's, their
        # equal attribute and capacity values once.
        self.informers = {
            DEVICE_CLASSES.kind: Informer(kube, DEVICE_CLASSES, self._on_change),
            NODES.kind: Informer(kube, NODES, self._on_change, transform=placement_node),
            RESOURCE_SLICES.kind: Informer(
                kube,
                RESOURCE_SLICES,
                self._on_change,
                transform=SliceParts(),
                field_selector=slice_selector(driver),
            ),
            RESOURCE_CLAIMS.kind: Informer(kube, RESOURCE_CLAIMS, self._on_change),
            PODS.kind: Informer(kube, PODS, self._on_change, transform=keep_pod),
            RESOURCE_QUOTAS.kind: Informer(kube, RESOURCE_QUOTAS, self._on_change),
            # Quotas are optional: without the chart's CRD the controller runs with none.
            GPU_QUOTAS.kind: Informer(kube, GPU_QUOTAS, self._on_change, optional=True),
        }
        # The objects naming gangs' minimums (gang_refs.py): each one where the cluster serves it.
        for resource in GROUP_RESOURCES:
            kind = event_kind(resource)
            deliver = functools.partial(self._on_group_change, kind)
            self.informers[kind] = Informer(kube, resource, deliver, optional=True)
        self._thread: threading.Thread | None = None
        self.metrics.ready = self.ready

    def ready(self) -> str | None:
        """``/readyz``: None once every informer has listed (a standby too: its caches are warm and
        it takes over at once), else which resources are still being listed."""
        waiting = sorted(i.resource.plural for i in self.informers.values() if not i.synced.is_set())
        return f"listing {', '.join(waiting)}" if waiting else None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> None:
        for informer in self.informers.values():
            informer.start()
        deadline = time.monotonic() + sync_timeout
        for informer in self.informers.values():
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                raise KubeError(0, f"could not list {informer.resource.plural} within {sync_timeout:.0f}s")
        # The lists' objects folded into the cache, the inventory and the placement state built
        # (with the CEL inputs of every device) before start returns: the first pass places at
        # once, and the daemon sets what was built aside from the garbage collector
        # (dra_driver/heap.py). No other thread drains yet.
        self._drain()
        self._thread = threading.Thread(target=self._loop, name="controller", daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """Stop watching and reconciling; writes already handed to the writer threads go on."""
        self._stop.set()
        self._wake.set()
        for informer in self.informers.values():
            informer.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def stop(self) -> None:
        self.halt()
        self.binding.shutdown()
        self.binder.events.flush(timeout=2.0)  # the events of the last writes, best effort

    def wake(self) -> None:
        self._wake.set()

    def _on_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            self._events.append((kind, old, new))
        self._wake.set()

    def _on_group_change(self, kind: str, _resource_kind: str, old: Obj | None, new: Obj | None) -> None:
        """A group object's event, under its own kind (two of the resources are PodGroups)."""
        self._on_change(kind, old, new)

    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = self.queue.busy() or self.releaser.queue or self.binding
            # Pending retries left over from the last batch are taken at once (after new events);
            # a replica that does not lead plans nothing, so it waits as usual.
            left = self.queue.left_over() and self._was_leader
            self._wake.wait(timeout=0.0 if left else 0.5 if busy else 2.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:  # keep reconciling; the failing item is retried on the next pass
                log.exception("controller pass failed")
                time.sleep(0.2)

    # --- one pass ------------------------------------------------------------------------------
    def run_once(self) -> None:
        self._drain()
        self._collect()
        leading = self.is_leader()
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            if self._was_leader:
                self.metrics.clear_leader_series()
                self.cache.quotas.forget_metrics()
            self._series_published = False  # a new term publishes every series at once
            now = time.monotonic()
            if now - self._metrics_at > 1.0:  # kept up to date, unpublished, like the caches
                self._metrics_at = now
                self._update_series()
            self._was_leader = False
            return
        now = time.monotonic()
        if not self._was_leader or now - self._last_resync > self.resync_seconds:
            self._resync()
            self._last_resync = now
            self._was_leader = True
        self.passes += 1
        self.releaser.run()
        self.queue.activate(self.gangs.due())
        try:
            for attempt in self.queue.attempts():
                step = self._attempt(attempt)
                if step is not None:
                    self.queue.done(attempt, step)
        finally:  # the failures of this term's pass are written in this term, whatever happened
            self.failures.handle()
        self.preemptor.run()
        if self.queue.cut_short:
            log.debug("pass cut short: the pods not reached are planned next pass")
        self.cache.quotas.sync(self.kube)
        self._update_metrics()

    def _attempt(self, attempt: Attempt) -> Step | None:
        """Plan one pod the queue gave; what became of it (None: an API error, planned again)."""
        pod = attempt.pod
        try:
            return self.schedule_one(pod, attempt.only_nodes)
        except KubeError as err:
            log.warning("pod %s: %s", pod.key, err)
            self.queue.retry(pod.key)
            return None
        except Exception as err:  # a poison pod fails alone; every other queued pod is planned
            log.exception("pod %s: unexpected error while planning; the other pods go on", pod.key)
            self.metrics.unexpected_errors.labels("Pod").inc()
            return self.fail_pod(pod, err)

    def schedule_one(self, pod: PodView, only_nodes: frozenset[str] | None = None) -> Step:
        """Decide for the pod (with its whole gang, for a member of one: ``gangs.py``), then hand
        a placement to the binder (on the writer pool)."""
        step = self.gangs.schedule(pod)
        if step is not None:
            return step
        outcome = self.decide(pod, only_nodes)
        if isinstance(outcome, Placed):
            self._submit(pod.key, outcome)
            return Step.BINDING
        if isinstance(outcome, Unschedulable):
            return Step.PENDING
        if isinstance(outcome, ClaimBusy):
            return Step.RETRY
        if isinstance(outcome, WaitingForClaim):
            self._waiting_for_claim(pod)
            return Step.WAITING
        return Step.SKIP

    def _submit(self, key: str, placed: Placed) -> None:
        """Hand a placement to the writers (without writer threads: written here and folded)."""
        self.queue.binding(key)
        self.binding.submit(key, placed)
        if not self.binding.threaded:
            self._collect()  # the bind is done already

    def _waiting_for_claim(self, pod: PodView) -> None:
        """A claim of the pod does not exist yet: make HAMi's templates it waits for, if any."""
        problem = None if self.hami_templates is None else self.hami_templates.ensure(pod)
        if problem is not None:
            self.failures.failed(pod, Reason.INVALID_REQUEST, problem)

    def _pending_shape(self, pod: PodView) -> str | None:
        """The allocator's pending shape; None for a gang member (a gang that waits says nothing
        of a lone pod of the same shape)."""
        return None if self.gangs.is_member(pod) else self.allocator.pending_shape(pod)

    def decide(self, pod: PodView, only_nodes: frozenset[str] | None = None) -> AllocateOutcome:
        """kube-scheduler's scheduling cycle for one pod: allocate, then assume the placement in
        the cache (the next pod is planned with it while it is written) or hand the failure to
        the failure handler (its writes follow the pass: ``FailureHandler.handle``)."""
        outcome = self.allocator.allocate(pod, only_nodes)
        self.failures.decided(pod, outcome)
        if isinstance(outcome, Unschedulable):
            self.preemptor.failed(pod, outcome)
        if isinstance(outcome, Placed):
            # Last, after everything that could fail: an assumption is never left behind by an error.
            self.cache.assume((write.claim, write.uses) for write in outcome.writes)
            self.queue.placed(pod)
            self.preemptor.placed(pod)
        return outcome

    def fail_pod(self, pod: PodView, err: BaseException) -> Step:
        """Report an unexpected error while planning ``pod`` as its pending reason (InvalidRequest).

        The error is most likely the pod's own input (an annotation, a claim's selector or config)
        that some check let through: the pod stays gated and pending with the error in one line,
        and is planned again when something changes, like any other pending pod.
        """
        text = " ".join(f"{type(err).__name__}: {err}".split())
        message = f"unexpected error while planning this pod: {text[:300]}"
        self.failures.failed(pod, Reason.INVALID_REQUEST, message)
        return Step.PENDING

    def _update_metrics(self) -> None:
        """The per-card and per-claim series where the ledger, a claim or a pod changed, and the
        pending pods (their ages grow), at most once a second (at once in a new term): a scrape
        reads the last snapshot."""
        now = time.monotonic()
        if now - self._metrics_at <= 1.0 and self._series_published:
            return
        self._metrics_at = now
        if self._update_series() or not self._series_published:
            self.metrics.publish_gpus()
            self._series_published = True
        self.metrics.update_pending(self.queue.pending_groups())

    def _update_series(self) -> bool:
        """Bring the per-card and per-claim series up to date where something changed (in full the
        first time), without publishing them; whether any changed. A standby does it too, so a
        new term publishes at once what a full rebuild would give."""
        cache = self.cache
        changes, claims, pods = self._take_series_changes()
        if self._series_stale:
            self._series_stale = False
            self.metrics.refresh_gpus(cache.ledger, cache.tenant, cache.tenant_pod_uids, publish=False)
            return True
        if changes.nodes or changes.inventory_nodes or changes.claims or claims or pods:
            self.metrics.update_gpus_changed(
                cache.ledger, changes, claims, pods, cache.tenant, cache.tenant_pod_uids, publish=False
            )
            return True
        return False

    def _take_series_changes(self) -> tuple[LedgerChanges, set[str], set[str]]:
        """What changed for the per-card and per-claim series since the last call."""
        claims, pods = self.cache.take_series_changes()
        return self.cache.ledger.take_changes(), claims, pods

    # --- writes on the pool, folded back here --------------------------------------------------
    def _collect(self) -> None:
        """Fold finished binds into the cache on this (the ledger's) thread."""
        for key, placed, result in self.binding.finished():
            if isinstance(result, Exception):  # a writer failed unexpectedly: undo the assumption
                log.warning("pod %s: commit failed: %s", key, result)
                # With the writes counted as not attempted, the cache takes the claims out of
                # flight and back to what it holds (they would otherwise be skipped forever).
                result = BindResult(placed, outcome=BindOutcome.RETRY)
                self.releaser.queue.update(write.claim.key for write in placed.writes)
            self.apply(result)
            pause = self.queue.written(key, completed=result.outcome is not BindOutcome.RETRY)
            if pause is not None:
                log.info("pod %s: writes not completed; planned again in %.1f s", key, pause)
            self.gangs.written(key, placed, result)
        for key, placed in self.gangs.take_lifts():  # a gang's allocations are all written
            if self.is_leader():  # else the next leader finds them allocated and lifts the gates
                self._submit(key, placed)

    def apply(self, result: BindResult) -> None:
        """Fold a bind's outcome into the cache (worker thread only)."""
        claims = (write.claim for write in result.placed.writes)
        self.cache.apply_bind(claims, result.written, result.failed, result.pod)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no bind is in flight (tests and benchmarks)."""
        return self.binding.wait_idle(timeout)

    # --- events in -----------------------------------------------------------------------------
    def _resync(self) -> None:
        """Every pending pod woken everywhere, every gated pod and every claim of ours looked at."""
        self.queue.resync()
        cache = self.cache
        for key, claim in cache.claims.items():
            if claim.ours:
                self.releaser.queue.add(key)
                self.queue.activate(cache.consumers.get(key, ()))

    def _drain(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        for kind, old, new in events:
            try:
                if self.gangs.observe(kind, old, new):
                    continue  # a group object: the gangs' directory's
                self.apply_wake(self.cache.apply_event(kind, old, new))
            except Exception:  # one malformed object must not drop the rest of the queue
                log.exception("%s event not applied; the other events go on", kind)
                self.metrics.unexpected_errors.labels(kind).inc()
        if self.cache.slices_changed():
            self.apply_wake(self.cache.refresh_slices(self.informers["ResourceSlice"].snapshot()))

    def apply_wake(self, wake: Wake) -> None:
        """Act on what a change concerns: claims to look at, pods to plan (the queue's)."""
        self.releaser.queue |= wake.claims
        for key in wake.deleted_claims:
            self.binder.forget(key)
        self.preemptor.observe(wake)
        self.queue.wake(wake)
