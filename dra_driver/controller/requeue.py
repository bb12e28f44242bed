"""Which pending pods a change may help, and the bounded batch a pass replans.

Pods that did not fit are planned again when a change may help them, and only then (a tenant's
thousand pending pods must not cost a minute of the single worker on every event, nor delay
another tenant's pods): capacity released on a node, or a Node or its slices changed, retries the
pods that fitted nowhere on that node alone; a quota changed, or GPUs released in its namespace,
retries that namespace's pods pending for their quota; a DeviceClass changed retries the pods
whose claims use it. A pod whose pending reason is unknown is retried on any change, and the
periodic resync retries every pending pod everywhere. Each pass replans a bounded batch of the
queue (``PendingRetries``), namespaces taken in turn; the rest waits for the next pass. Pods of
one shape (``Allocator.pending_shape``) that stayed pending are skipped until something changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dra_driver.controller.allocator import UNSCHEDULABLE, Allocator
from dra_driver.controller.cache import ClusterCache, Wake
from dra_driver.controller.pending import PendingReports
from dra_driver.controller.retries import PENDING_RETRIES_PER_PASS, QUOTA_EXCEEDED, PendingRetries, Retry
from dra_driver.resource.objects import PodView

Shape = tuple[str, frozenset[str] | None]


class Requeue:
    """The pending pods (by key), the queue of those to replan, and the shapes known to be stuck."""

    def __init__(
        self,
        cache: ClusterCache,
        allocator: Allocator,
        reports: PendingReports,
        *,
        batch: int = PENDING_RETRIES_PER_PASS,
        skipped: Callable[[], None] = lambda: None,
    ) -> None:
        self.cache = cache
        self.allocator = allocator
        self.reports = reports
        self.batch_size = max(1, batch)
        self._skipped = skipped
        self.pending_pods: set[str] = set()
        self.retries = PendingRetries()
        #: (shape, nodes) of retried pods that stayed pending (nodes None: all nodes), since the
        #: last change that could help a pending pod: queued pods of that shape and nodes are
        #: skipped, in this pass and the next ones, as they would stay pending too.
        self.stuck: set[Shape] = set()

    def __bool__(self) -> bool:
        return bool(self.retries)

    def pending(self, key: str, retry: Retry | None) -> None:
        """The pod stayed pending (after a retry of ``retry``'s shape and nodes, if any)."""
        self.pending_pods.add(key)
        if retry is not None and retry.shape is not None:
            self.stuck.add((retry.shape, retry.only_nodes))

    def not_pending(self, key: str) -> None:
        self.pending_pods.discard(key)
        self.retries.discard(key)

    def wake(self, wake: Wake) -> None:
        """Queue the pending pods a change may help."""
        if wake.retry_everywhere:
            self.retry_all()
        if wake.retry_nodes:
            self.retry_on(wake.retry_nodes)
        if wake.retry_quota:
            self.retry_quota(wake.retry_quota)
        for name in sorted(wake.retry_classes):
            self.retry_class(name)

    # --- the batch -----------------------------------------------------------------------------
    def batch(self, dirty: set[str], in_flight: Iterable[str]) -> dict[str, Retry]:
        """The queued pending pods this pass replans (``dirty`` ones are planned in full anyway).

        The queue's round-robin order, up to ``batch_size`` plans: pods of one shape queued for
        the same nodes count once, since all but the first are skipped when it stays pending.
        """
        flying = set(in_flight)
        batch: dict[str, Retry] = {}
        groups: set[Shape] = set()
        for key in self.retries.order(self.created):
            pod = self.cache.pods.get(key)
            if pod is None or key not in self.pending_pods or key in flying:
                self.retries.discard(key)  # not pending any more (a commit's failure makes it dirty)
                continue
            if key in dirty:
                continue
            retry = self.retry_of(pod)
            if self.stays_pending(retry):
                self._skipped()
                self.retries.discard(key)
                continue
            group = (key if retry.shape is None else retry.shape, retry.only_nodes)
            if group not in groups:
                if len(groups) == self.batch_size:
                    break
                groups.add(group)
            batch[key] = retry
            self.retries.ended_with(key)
        return batch

    def retry_of(self, pod: PodView) -> Retry:
        """Where to plan a queued pod: only its queued nodes if it fitted nowhere (a pod pending
        for another reason, a quota say, is planned everywhere), and its shape (None: unsure)."""
        nodes = self.retries.scope(pod.key)
        if self.reports.reason(pod.uid) != UNSCHEDULABLE:
            nodes = None
        try:
            shape = self.allocator.pending_shape(pod)
        except Exception:  # its plan (in the pass, where errors are handled) will say what is wrong
            shape = None
        return Retry(nodes, shape)

    def stays_pending(self, retry: Retry) -> bool:
        """Whether a pod of this shape stayed pending on these nodes (or on all) since the last
        change that could help: capacity has only shrunk since, so this pod would stay pending."""
        return retry.shape is not None and not self.stuck.isdisjoint(
            {(retry.shape, None), (retry.shape, retry.only_nodes)}
        )

    def created(self, key: str) -> str:
        pod = self.cache.pods.get(key)
        return pod.created if pod is not None else ""

    # --- what a change helps -------------------------------------------------------------------
    def _requeue(self, helped: Callable[[PodView, str], bool], nodes: frozenset[str] | None = None) -> None:
        """Queue the pending pods a change may help (``helped``: by the pod and its pending
        reason) to be planned on ``nodes`` (None: every node). A pod whose pending reason is not
        known is queued everywhere, whatever changed: when unsure, plan it again."""
        self.stuck.clear()  # what stayed pending before this change may not any more
        queued: list[tuple[str, frozenset[str] | None]] = []
        for key in self.pending_pods:
            pod = self.cache.pods.get(key)
            if pod is None:
                continue
            reason = self.reports.reason(pod.uid)
            if reason is None:
                queued.append((key, None))
            elif helped(pod, reason):
                queued.append((key, nodes))
        self.retries.add(queued)

    def retry_all(self) -> None:
        """Something changed that may help any pending pod anywhere (or we cannot tell)."""
        self._requeue(lambda _pod, _reason: True)

    def retry_on(self, nodes: Iterable[str]) -> None:
        """Room appeared on ``nodes`` (capacity released, the Node or its devices changed): the
        pods that fitted on no node are planned there alone. Pods pending for another reason (a
        quota, a missing class, an invalid request) would be refused again for that reason."""
        scope = frozenset(nodes)
        if scope:  # e.g. another driver's slices changed: no room anywhere
            self._requeue(lambda _pod, reason: reason == UNSCHEDULABLE, scope)

    def retry_quota(self, namespaces: Iterable[str]) -> None:
        """Quota may have room in ``namespaces`` (one changed, or GPUs were released there): the
        pods they refused are planned again, everywhere (they fitted somewhere before)."""
        wanted = frozenset(namespaces)
        self._requeue(lambda pod, reason: reason == QUOTA_EXCEEDED and pod.namespace in wanted)

    def retry_class(self, name: str) -> None:
        """DeviceClass ``name`` changed: the pods whose claims ask for it are planned everywhere."""

        def uses_class(pod: PodView, _reason: str) -> bool:
            return any(
                claim is not None and name in claim.request_classes.values()
                for _, claim in self.cache.pod_claims(pod)
            )

        self._requeue(uses_class)
