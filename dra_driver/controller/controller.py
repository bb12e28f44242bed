"""``Controller``: informers feed one worker thread that drives the ``Reconciler``.

Informer threads only append changes to a queue; the worker applies them to its caches, the
ledger and the indexes, works out which pods and claims need a look, and reconciles them while it
leads (a replica that does not lead keeps its caches warm, so a failover takes effect at once).

Pods that did not fit are queued for another plan when a change may help them, and only then
(issue 27: a tenant's thousand pending pods must not cost a minute of the single worker on every
event, nor delay another tenant's pods): capacity released on a node, or a Node or its slices
changed, retries the pods that fitted nowhere on that node alone; a quota changed, or GPUs released
in its namespace, retries that namespace's pods pending for their quota; a DeviceClass changed
retries the pods whose claims use it. A pod whose pending reason is unknown is retried on any
change, and the periodic resync retries every pending pod everywhere. Each pass replans a bounded
batch of the queue (``PendingRetries``), namespaces taken in turn; the rest waits for the next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dra_driver.config import ControllerDefaults
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
from dra_driver.controller.retries import (
    PENDING_RETRIES_PER_PASS,
    QUOTA_EXCEEDED,
    CommitBackoff,
    PendingRetries,
    Retry,
)
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
from dra_driver.kube.watch import Informer, object_key

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
        pending_batch: int = PENDING_RETRIES_PER_PASS,
        backoff: CommitBackoff | None = None,
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
        #: Pending pods to plan again (and where), at most ``pending_batch`` plans per pass.
        self.retries = PendingRetries()
        self.pending_batch = max(1, pending_batch)
        #: Pods whose writes failed wait a little longer each time before the next attempt.
        self.backoff = backoff or CommitBackoff()
        #: (shape, nodes) of retried pods that stayed pending (nodes None: all nodes), since the
        #: last change that could help a pending pod: queued pods of that shape and nodes are
        #: skipped, in this pass and the next ones, as they would stay pending too.
        self._stuck: set[tuple[str, frozenset[str] | None]] = set()
        self._slices_changed = False
        #: Where the slices changed since the last inventory refresh (None: somewhere unknown).
        self._slice_nodes: set[str] | None = set()
        self._slice_pools: set[str] = set()
        self._was_leader = False
        self._last_resync = 0.0
        self._metrics_generation: tuple[int, int] | None = None
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
            # Pending retries left over from the last batch are taken at once (after new events);
            # a replica that does not lead plans nothing, so it waits as usual.
            left = self.retries and self._was_leader
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
                self.reconciler.quotas.forget_metrics()
                self._metrics_generation = None  # a new term reports everything again
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
        self._dirty_pods = set()
        batch = self._retry_batch(pods)
        for key in self._fifo(pods | batch.keys()):
            if key in self._in_flight:
                continue  # looked at again when its writes complete
            pod = self.reconciler.pods.get(key)
            if pod is None:
                self.backoff.forget(key)
                self._not_pending(key)
                continue
            if self.backoff.waiting(key):
                self._dirty_pods.add(key)  # its last writes failed: planned again once its pause ends
                continue
            retry = batch.get(key) if key not in pods else None
            only_nodes, shape = (None, None) if retry is None else retry
            self.retries.discard(key)  # planned now: what it was queued for is looked at
            try:
                if retry is not None and self._stays_pending(retry):
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
                self._not_pending(key)
                self._submit(key, outcome)
                continue
            if outcome is Outcome.PENDING:
                self.pending_pods.add(key)
                if shape is not None:
                    self._stuck.add((shape, only_nodes))
            else:
                self._not_pending(key)
                if outcome is Outcome.RETRY:
                    self._dirty_pods.add(key)
        self.reconciler.quotas.sync(self.kube)
        self._update_metrics()

    def _update_metrics(self) -> None:
        """The per-card and per-claim series when the ledger changed, and the pending pods (their
        ages grow), at most once a second: a scrape reads the last snapshot."""
        now = time.monotonic()
        if now - self._metrics_at <= 1.0:
            return
        self._metrics_at = now
        # Pods binding bump the second: a claim's pod may be learnt after its allocation.
        generation = (self.reconciler.ledger.generation, self.reconciler.bound_generation)
        if generation != self._metrics_generation:
            self._metrics_generation = generation
            self.metrics.update_gpus(self.reconciler.ledger, self.reconciler.tenants())
        self.metrics.update_pending(self.reconciler.pending_groups())

    def _not_pending(self, key: str) -> None:
        self.pending_pods.discard(key)
        self.retries.discard(key)

    # --- pending retries: which pods a change can help, and how many per pass -------------------
    def _retry_batch(self, dirty: set[str]) -> dict[str, Retry]:
        """The queued pending pods this pass replans (``dirty`` ones are planned in full anyway).

        The queue's round-robin order, up to ``pending_batch`` plans: pods of one shape queued for
        the same nodes count once, since all but the first are skipped when it stays pending.
        """
        batch: dict[str, Retry] = {}
        groups: set[tuple[str, frozenset[str] | None]] = set()
        for key in self.retries.order(self._created):
            pod = self.reconciler.pods.get(key)
            if pod is None or key not in self.pending_pods or key in self._in_flight:
                self.retries.discard(key)  # not pending any more (a commit's failure makes it dirty)
                continue
            if key in dirty:
                continue
            retry = self._retry_of(pod)
            if self._stays_pending(retry):
                self.metrics.pending_skipped.inc()
                self.retries.discard(key)
                continue
            group = (key if retry.shape is None else retry.shape, retry.only_nodes)
            if group not in groups:
                if len(groups) == self.pending_batch:
                    break
                groups.add(group)
            batch[key] = retry
            self.retries.ended_with(key)
        return batch

    def _retry_of(self, pod: PodView) -> Retry:
        """Where to plan a queued pod: only its queued nodes if it fitted nowhere (a pod pending
        for another reason, a quota say, is planned everywhere), and its shape (None: unsure)."""
        nodes = self.retries.scope(pod.key)
        if self.reconciler.pending_reason(pod.uid) != UNSCHEDULABLE:
            nodes = None
        try:
            shape = self.reconciler.pending_shape(pod)
        except Exception:  # its plan (in the pass, where errors are handled) will say what is wrong
            shape = None
        return Retry(nodes, shape)

    def _stays_pending(self, retry: Retry) -> bool:
        """Whether a pod of this shape stayed pending on these nodes (or on all) since the last
        change that could help: capacity has only shrunk since, so this pod would stay pending."""
        return retry.shape is not None and not self._stuck.isdisjoint(
            {(retry.shape, None), (retry.shape, retry.only_nodes)}
        )

    def _requeue(self, helped: Callable[[PodView, str], bool], nodes: frozenset[str] | None = None) -> None:
        """Queue the pending pods a change may help (``helped``: by the pod and its pending
        reason) to be planned on ``nodes`` (None: every node). A pod whose pending reason is not
        known is queued everywhere, whatever changed: when unsure, plan it again."""
        self._stuck.clear()  # what stayed pending before this change may not any more
        queued: list[tuple[str, frozenset[str] | None]] = []
        for key in self.pending_pods:
            pod = self.reconciler.pods.get(key)
            if pod is None:
                continue
            reason = self.reconciler.pending_reason(pod.uid)
            if reason is None:
                queued.append((key, None))
            elif helped(pod, reason):
                queued.append((key, nodes))
        self.retries.add(queued)

    def _retry_all(self) -> None:
        """Something changed that may help any pending pod anywhere (or we cannot tell)."""
        self._requeue(lambda _pod, _reason: True)

    def _retry_on(self, nodes: Iterable[str]) -> None:
        """Room appeared on ``nodes`` (capacity released, the Node or its devices changed): the
        pods that fitted on no node are planned there alone. Pods pending for another reason (a
        quota, a missing class, an invalid request) would be refused again for that reason."""
        scope = frozenset(nodes)
        if scope:  # e.g. another driver's slices changed: no room anywhere
            self._requeue(lambda _pod, reason: reason == UNSCHEDULABLE, scope)

    def _retry_quota(self, namespaces: Iterable[str]) -> None:
        """Quota may have room in ``namespaces`` (one changed, or GPUs were released there): the
        pods they refused are planned again, everywhere (they fitted somewhere before)."""
        wanted = frozenset(namespaces)
        self._requeue(lambda pod, reason: reason == QUOTA_EXCEEDED and pod.namespace in wanted)

    def _retry_class(self, name: str) -> None:
        """DeviceClass ``name`` changed: the pods whose claims ask for it are planned everywhere."""

        def uses_class(pod: PodView, _reason: str) -> bool:
            return any(
                claim is not None and name in claim.request_classes.values()
                for _, claim in self.reconciler.pod_claims(pod)
            )

        self._requeue(uses_class)

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
                log.info(
                    "pod %s: writes not completed; planned again in %.1f s", key, self.backoff.failed(key)
                )
            else:
                self.backoff.forget(key)
                self._stuck.clear()  # the capacity it had assumed is free again

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no commit is in flight (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._in_flight

    def _created(self, key: str) -> str:
        pod = self.reconciler.pods.get(key)
        return pod.created if pod is not None else ""

    def _fifo(self, keys: Iterable[str]) -> list[str]:
        return sorted(keys, key=lambda key: (self._created(key), key))

    def _resync(self) -> None:
        reconciler = self.reconciler
        # Every pending pod everywhere, but one pod per shape that stays pending: at 5,000 nodes
        # one full pending decision costs about 85 ms, so re-planning 1,000 pending pods one by one
        # would take over a minute of CPU every resync (hack/bench_storm.py); batched per pass.
        self._retry_all()
        for key, pod in reconciler.pods.items():
            if key not in self.pending_pods and pod.gated:
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
            slices = self.informers["ResourceSlice"].snapshot()
            reconciler.refresh_inventory(slices)
            nodes = self._slice_nodes
            self._slice_nodes, pools, self._slice_pools = set(), self._slice_pools, set()
            if nodes is None:
                self._retry_all()
            else:
                # Every node of a changed pool: a pool's newest complete generation is what counts.
                nodes |= {node for pool, node in map(self._slice_place, slices) if pool in pools and node}
                self._retry_on(nodes)

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
            self._slice_changed(old, new)
        elif kind == "DeviceClass":
            reconciler.class_event(key, new)
            self._retry_class(key)
        elif kind == "Node":
            self._node_changed(key, None if new is None else NodeView.parse(new))
        elif kind == "GpuQuota":
            reconciler.quotas.set_gpu_quota(key, new)
            self._quota_changed(key, old, new)
        elif kind == "ResourceQuota":
            reconciler.quotas.set_resource_quota(key, new)
            self._quota_changed(key, old, new)

    def _node_changed(self, name: str, new: NodeView | None) -> None:
        """A node added or changed may now take the pods that fitted nowhere, there alone; a node
        gone, or one changed in nothing placement reads (a status heartbeat), helps no pod."""
        before = self.reconciler.nodes.get(name)
        self.reconciler.node_event(name, new)
        if new is not None and new != before:
            self._retry_on({name})

    def _slice_place(self, obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """(pool, node) of a slice of our driver; (None, None) for another driver's (not ours to
        place, left out of the inventory)."""
        spec = obj.get("spec")
        if not isinstance(spec, Mapping) or spec.get("driver") != self.driver:
            return None, None
        pool = spec.get("pool")
        name = str(pool.get("name", "")) if isinstance(pool, Mapping) else ""
        return name, str(spec.get("nodeName") or "") or None

    def _slice_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Note where a slice changed: its node and pool (all nodes when one has no node)."""
        for obj in (old, new):
            pool, node = (None, None) if obj is None else self._slice_place(obj)
            if pool is None:
                continue
            self._slice_pools.add(pool)
            if node is None:
                self._slice_nodes = None  # not a node's devices: unsure where room appeared
            elif self._slice_nodes is not None:
                self._slice_nodes.add(node)

    def _quota_changed(self, key: str, old: Obj | None, new: Obj | None) -> None:
        """A quota added, removed or with new limits (a quota is its namespace, name and spec; its
        status is ours or kube-controller-manager's) may let its namespace's refused pods in."""
        if old is not None and new is not None and old.get("spec") == new.get("spec"):
            return
        self._retry_quota({key.partition("/")[0]})

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
                self._retry_quota({use.namespace for use in gone})  # their quota has room too
            else:
                self._retry_all()
        self._dirty_claims.add(key)
        self._dirty_pods |= reconciler.consumers.get(key, set())
        changed = new if new is not None else old
        for owner_uid in changed.owner_uids if changed is not None else ():
            pod_key = reconciler.pods_by_uid.get(owner_uid)
            if pod_key:
                self._dirty_pods.add(pod_key)
