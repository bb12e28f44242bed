"""``Controller``: informers feed one worker thread that drives the ``Reconciler``.

Informer threads only append changes to a queue; the worker applies them to its caches, the
ledger and the indexes, works out which pods and claims need a look, and reconciles them while it
leads (a replica that does not lead keeps its caches warm, so a failover takes effect at once).
Pods that did not fit are retried whenever capacity may have appeared: a claim released or
shrunk, a slice, node or DeviceClass changed. A periodic resync looks at everything again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from dra_driver.config import ControllerDefaults
from dra_driver.controller.kube import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    KubeApi,
    KubeError,
    Obj,
)
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.objects import ClaimView, PodView
from dra_driver.controller.pods import NodeView
from dra_driver.controller.reconciler import (
    UNSCHEDULABLE,
    CommitJob,
    CommitResult,
    Outcome,
    Reconciler,
)
from dra_driver.controller.watch import Informer, object_key

log = logging.getLogger(__name__)


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
        write_workers: int = 4,
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.metrics = metrics or ControllerMetrics()
        self.is_leader = is_leader or (lambda: True)
        self.reconciler = Reconciler(
            kube,
            driver,
            defaults or ControllerDefaults(),
            self.metrics,
            identity=identity,
            still_leading=lambda: self.is_leader(),
        )
        self.resync_seconds = resync_seconds
        self._queue: list[tuple[str, Obj | None, Obj | None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty_pods: set[str] = set()
        self._dirty_claims: set[str] = set()
        self.pending_pods: set[str] = set()
        #: Pending pods are looked at again: everywhere (``_retry_pending``), or only on the nodes
        #: where capacity was released since (``_released_on``, when that is all that changed).
        self._retry_pending = False
        self._released_on: set[str] = set()
        self._slices_changed = False
        self._was_leader = False
        self._last_resync = 0.0
        self._metrics_generation = -1
        self._metrics_at = 0.0
        self.passes = 0
        #: Writes run on a small pool so planning (one thread, owns the ledger) overlaps API round trips.
        self._writers = (
            ThreadPoolExecutor(write_workers, thread_name_prefix="writer") if write_workers else None
        )
        self._in_flight: dict[str, Future[CommitResult]] = {}
        self._jobs: dict[str, CommitJob] = {}  # pod key -> the job its in-flight future writes
        self.informers = {
            resource.kind: Informer(kube, resource, self._on_change)
            for resource in (DEVICE_CLASSES, NODES, RESOURCE_SLICES, RESOURCE_CLAIMS, PODS, RESOURCE_QUOTAS)
        }
        # Quotas are optional: without the chart's CRD the controller runs with none.
        self.informers[GPU_QUOTAS.kind] = Informer(kube, GPU_QUOTAS, self._on_change, optional=True)
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self, sync_timeout: float = 30.0) -> None:
        for informer in self.informers.values():
            informer.start()
        deadline = time.monotonic() + sync_timeout
        for informer in self.informers.values():
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                raise KubeError(0, f"could not list {informer.resource.plural} within {sync_timeout:.0f}s")
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
        if self._writers is not None:
            self._writers.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        self._wake.set()

    def _on_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            self._queue.append((kind, old, new))
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = self._dirty_pods or self._dirty_claims or self._in_flight
            self._wake.wait(timeout=0.5 if busy else 2.0)
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
            self._was_leader = False
            return
        now = time.monotonic()
        if not self._was_leader or now - self._last_resync > self.resync_seconds:
            self._resync()
            self._last_resync = now
            self._was_leader = True
        self.passes += 1
        claims, self._dirty_claims = self._dirty_claims, set()
        for key in sorted(claims):
            if self.reconciler.assumed.writing(key):
                self._dirty_claims.add(key)
                continue
            namespace, _, name = key.partition("/")
            claim = self.reconciler.claim(namespace, name)
            if claim is None:
                continue
            try:
                if self.reconciler.repair_overcommit(claim) is Outcome.RETRY:
                    self._dirty_claims.add(key)
                if self.reconciler.reconcile_claim(claim) is Outcome.RETRY:
                    self._dirty_claims.add(key)
            except KubeError as err:
                log.warning("claim %s: %s", key, err)
                self._dirty_claims.add(key)
            except Exception:  # one claim must never stop the others: looked at again at resync
                log.exception("claim %s: unexpected error; the other claims go on", key)
                self.metrics.unexpected_errors.labels("ResourceClaim").inc()
        pods = self._dirty_pods
        retried, scope = self._pending_retry()
        self._dirty_pods = set()
        stuck_shapes: set[str] = set()  # shapes that stayed pending in this pass
        for key in self._fifo(pods | retried):
            if key in self._in_flight:
                continue  # looked at again when its writes complete
            pod = self.reconciler.pods.get(key)
            if pod is None:
                self.pending_pods.discard(key)
                continue
            only_nodes, shape = None, None
            try:
                if key in retried and key not in pods:
                    if scope is not None and self.reconciler.pending_reason(pod.uid) == UNSCHEDULABLE:
                        only_nodes = scope  # it fitted nowhere before; only these nodes gained room
                    shape = self.reconciler.pending_shape(pod)
                    if shape is not None and shape in stuck_shapes:
                        self.metrics.pending_skipped.inc()
                        continue  # an older pod of the same shape just stayed pending: so would this one
                outcome = self.reconciler.reconcile_pod(pod, only_nodes)
            except KubeError as err:
                log.warning("pod %s: %s", key, err)
                self._dirty_pods.add(key)
                continue
            except Exception as err:  # a poison pod fails alone; every other queued pod is planned
                log.exception("pod %s: unexpected error while planning; the other pods go on", key)
                self.metrics.unexpected_errors.labels("Pod").inc()
                outcome = self.reconciler.fail_pod(pod, err)
            if isinstance(outcome, CommitJob):
                self.pending_pods.discard(key)
                self._submit(key, outcome)
                continue
            if outcome is Outcome.PENDING:
                self.pending_pods.add(key)
                if shape is not None:
                    stuck_shapes.add(shape)
            else:
                self.pending_pods.discard(key)
                if outcome is Outcome.RETRY:
                    self._dirty_pods.add(key)
        self.reconciler.quotas.sync(self.kube)
        generation = self.reconciler.ledger.generation
        if generation != self._metrics_generation and time.monotonic() - self._metrics_at > 1.0:
            self._metrics_generation, self._metrics_at = generation, time.monotonic()
            self.metrics.update_gpus(self.reconciler.ledger)

    def _retry_on(self, nodes: set[str]) -> None:
        """Capacity was released on ``nodes`` only: pending pods need to be tried there alone."""
        if not self._retry_pending:
            self._released_on |= nodes

    def _pending_retry(self) -> tuple[set[str], frozenset[str] | None]:
        """The pending pods to look at in this pass, and the nodes to look at (None: all)."""
        if self._retry_pending:
            self._retry_pending, self._released_on = False, set()
            return set(self.pending_pods), None
        if self._released_on:
            scope, self._released_on = frozenset(self._released_on), set()
            return set(self.pending_pods), scope
        return set(), None

    def _submit(self, key: str, job: CommitJob) -> None:
        if self._writers is None:
            future: Future[CommitResult] = Future()
            try:
                future.set_result(self.reconciler.commit(job))
            except Exception as err:  # handled by ``_collect`` like a failed writer thread
                future.set_exception(err)
        else:
            future = self._writers.submit(self.reconciler.commit, job)
            future.add_done_callback(lambda _: self._wake.set())
        self._in_flight[key] = future
        self._jobs[key] = job
        if self._writers is None:
            self._collect()

    def _collect(self) -> None:
        """Apply finished commits on this (the ledger's) thread."""
        for key, future in list(self._in_flight.items()):
            if not future.done():
                continue
            del self._in_flight[key]
            job = self._jobs.pop(key)
            try:
                result = future.result()
            except Exception as err:  # a writer failed unexpectedly: undo the assumption, retry
                log.warning("pod %s: commit failed: %s", key, err)
                # With the job's writes counted as not attempted, ``apply`` takes its claims out of
                # flight and back to what the cache says (they would otherwise be skipped forever).
                result = CommitResult(job, outcome=Outcome.RETRY)
                for claim, _ in job.writes:
                    self._dirty_claims.add(f"{claim['metadata']['namespace']}/{claim['metadata']['name']}")
            self.reconciler.apply(result)
            if result.outcome is Outcome.RETRY:
                self._dirty_pods.add(key)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no commit is in flight (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._in_flight

    def _fifo(self, keys: set[str]) -> list[str]:
        def created(key: str) -> tuple[str, str]:
            pod = self.reconciler.pods.get(key)
            return (pod.created if pod is not None else "", key)

        return sorted(keys, key=created)

    def _resync(self) -> None:
        reconciler = self.reconciler
        for key, pod in reconciler.pods.items():
            if key in self.pending_pods:
                # Everywhere, but one pod per shape that stays pending: at 5,000 nodes one full
                # pending decision costs about 85 ms, so re-planning 1,000 pending pods one by one
                # would take over a minute of CPU every resync (hack/bench_storm.py).
                self._retry_pending = True
            elif pod.gated:
                self._dirty_pods.add(key)
        for key, claim in reconciler.claims.items():
            if claim.ours:
                self._dirty_claims.add(key)
                self._dirty_pods |= reconciler.consumers.get(key, set())

    def _drain(self) -> None:
        with self._lock:
            queue, self._queue = self._queue, []
        reconciler = self.reconciler
        for kind, old, new in queue:
            try:
                self._apply_event(kind, old, new)
            except Exception:  # one malformed object must not drop the rest of the queue
                log.exception("%s event not applied; the other events go on", kind)
                self.metrics.unexpected_errors.labels(kind).inc()
        if self._slices_changed:
            self._slices_changed = False
            reconciler.refresh_inventory(self.informers["ResourceSlice"].snapshot())
            self._retry_pending = True

    def _apply_event(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """One informer event into the caches (and what it makes dirty)."""
        reconciler = self.reconciler
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        # The informer boundary: pods and claims are parsed into typed views once, here.
        if kind == "Pod":
            self._pod_changed(
                key,
                None if old is None else PodView.parse(old),
                None if new is None else PodView.parse(new),
            )
        elif kind == "ResourceClaim":
            self._claim_changed(
                key,
                None if old is None else reconciler.claim_view(old),
                None if new is None else reconciler.claim_view(new),
            )
        elif kind == "ResourceSlice":
            self._slices_changed = True
        elif kind == "DeviceClass":
            reconciler.class_event(key, new)
            self._retry_pending = True
        elif kind == "Node":
            reconciler.node_event(key, None if new is None else NodeView.parse(new))
            self._retry_pending = True
        elif kind == "GpuQuota":
            reconciler.quotas.set_gpu_quota(key, new)
            self._retry_pending = True  # a quota raised or removed may let pending pods in
        elif kind == "ResourceQuota":
            reconciler.quotas.set_resource_quota(key, new)
            self._retry_pending = True

    def _pod_changed(self, key: str, old: PodView | None, new: PodView | None) -> None:
        reconciler = self.reconciler
        new = reconciler.pod_event(key, old, new)
        self._dirty_pods.add(key)
        if (new is None or not new.active) and old is not None:
            self._dirty_claims.update(old.claim_keys)
            for claim_key, pods in reconciler.consumers.items():
                if key in pods:
                    self._dirty_claims.add(claim_key)
            for (owner, _), claim_name in reconciler.owned.items():
                if owner == old.uid:
                    self._dirty_claims.add(f"{old.namespace}/{claim_name}")
            if old.bound_to:
                self._retry_on({old.bound_to})  # its CPU/memory there is free again

    def _claim_changed(self, key: str, old: ClaimView | None, new: ClaimView | None) -> None:
        reconciler = self.reconciler
        reconciler.claim_event(key, old, new)
        before = old.uses if old is not None else ()
        after = new.uses if new is not None else ()
        if len(after) < len(before):  # capacity was released, where the uses that went were
            gone = set(before) - set(after)
            devices = [reconciler.ledger.device(use.device) for use in gone]
            if all(device is not None for device in devices):
                self._retry_on({device.node for device in devices if device is not None})
            else:
                self._retry_pending = True
        self._dirty_claims.add(key)
        self._dirty_pods |= reconciler.consumers.get(key, set())
        changed = new if new is not None else old
        for owner_uid in changed.owner_uids if changed is not None else ():
            pod_key = reconciler.pods_by_uid.get(owner_uid)
            if pod_key:
                self._dirty_pods.add(pod_key)
