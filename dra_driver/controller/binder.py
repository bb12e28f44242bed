"""The binder: every write that follows a decision, in kube-scheduler's PreBind order.

Writes are those of an allocator beside kube-scheduler: our finalizer is added to a claim
(Update) before its allocation is written (UpdateStatus), both with the resourceVersion just
read, so a concurrent allocator (another replica, kube-scheduler) makes one of the writes fail
with 409 instead of allocating a device twice; only then is the pod's gate removed (with HAMi's
annotation and our decision record), its condition set and a Normal event recorded. The pod's
writes are patches that cannot clobber a concurrent writer (``gate_patch``, ``condition_patch``
in dra_driver/resource/edits.py), so they need neither a read first nor the whole pod. A crash
between any two writes leaves a state the next pass completes: a finalizer without allocation is
reused or dropped, an allocated claim of a still-gated pod pins the pod's node, an allocated pod's
gate is removed.

``bind`` may run on a writer thread: it makes API calls only and returns a ``BindResult`` that
the worker folds into the cache (``ClusterCache.apply_bind``). Every write goes through the one
retry helper (dra_driver/kube/writes.py); API failures are the classes of dra_driver/kube/errors.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from dra_driver.controller.allocation import rfc3339_now
from dra_driver.controller.allocator import ClaimWrite, Placed
from dra_driver.controller.decision_record import decision_annotation, placement_summary
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.slim import keep_pod
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, KubeApi, Obj
from dra_driver.kube.errors import KubeError, NotFound
from dra_driver.kube.events import EventRecorder, TokenBucket
from dra_driver.kube.writes import retry_on_conflict
from dra_driver.resource.edits import (
    condition_patch,
    gate_patch,
    with_allocation,
    with_annotation,
    with_finalizer,
)
from dra_driver.resource.objects import ClaimView, ObjectView, PodView

log = logging.getLogger("dra_driver.controller")
#: Written to a claim to fence it (see ``Binder.fence``); its value says who and when.
FENCE_ANNOTATION = "gpu.hami.io/fenced-by"


def _same_object(current: Obj, planned: ObjectView) -> None:
    """Raise NotFound when ``current`` (re-read by name after a conflict) is another object than
    the one planned: the claim or pod was deleted and one of the same name created since, whose
    requests (a claim's class, capacity, namespace quota) the plan never saw. Writing the planned
    allocation or lifting the planned pod's gate on it would hand out what nobody checked, so the
    bind treats the planned object as gone; the new one is planned on its own."""
    uid = ObjectView(current).uid
    if uid != planned.uid:
        raise NotFound(404, f"{planned.key} is now another object (uid {uid or '-'}, planned {planned.uid})")


def kept_view(pod: Mapping[str, object]) -> PodView:
    """A pod the API returned, as the informer keeps it (``keep_pod``): what a bind returns is
    folded into the cache in its place."""
    return PodView.parse(keep_pod(dict(pod)))


class BindOutcome(StrEnum):
    BOUND = "bound"  # allocations written and the gate lifted
    RETRY = "retry"  # a write failed (a conflict, an API error, no longer leading): plan again
    GONE = "gone"  # the pod no longer exists


@dataclass(slots=True)
class BindResult:
    """What ``Binder.bind`` wrote: claims written (as the API returned them), claims whose write
    failed with the API's current copy (None: gone), and the pod after its gate was lifted."""

    placed: Placed
    written: list[ClaimView] = field(default_factory=list)
    failed: list[tuple[ClaimView, ClaimView | None]] = field(default_factory=list)
    pod: PodView | None = None
    outcome: BindOutcome = BindOutcome.BOUND


class Binder:
    """Writes through ``kube``; holds no cache (what it wrote is returned to the worker)."""

    def __init__(
        self,
        kube: KubeApi,
        driver: str,
        metrics: ControllerMetrics,
        *,
        identity: str = "hami-dra-controller",
        still_leading: Callable[[], bool] | None = None,
        background_events: bool = False,
        normal_event_budget: TokenBucket | None = None,
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.metrics = metrics
        self.identity = identity
        #: Checked before each allocation write: a replica deposed while its commit is in flight
        #: must not write an allocation the new leader's ledger does not know about.
        self.still_leading = still_leading or (lambda: True)
        self.fenced: dict[str, str] = {}  # claim key -> resourceVersion our fence write produced
        #: ``background_events``: events are queued for the recorder's sender thread, so a bind
        #: does not wait an extra round trip (the production controller); tests write them inline.
        #: ``normal_event_budget``: Normal events (``Allocated``) past it are dropped (events.py).
        self.events = EventRecorder(
            kube,
            controller=f"{driver}/controller",
            instance=identity,
            background=background_events,
            normal_budget=normal_event_budget,
        )

    # --- bind ----------------------------------------------------------------------------------
    def bind(self, placed: Placed) -> BindResult:
        """Write the claims' allocations in order, then lift the gate; stops at the first failure.

        A pod whose condition said pending (it waited before) is marked allocated.
        """
        result = BindResult(placed)
        try:
            for write in placed.writes:
                written, current = self._write_allocation(write, placed.pod)
                if written is None:
                    result.failed.append((write.claim, current))
                    result.outcome = BindOutcome.RETRY
                    return result
                result.written.append(written)
                self.metrics.allocations.inc()
            if placed.hold_gate:
                return result  # a gang member: its gate is lifted with the others' (gangs.py)
            result.pod, result.outcome = self._lift_gate(placed.pod, placed.annotations)
            if result.pod is not None and placed.pod.allocated_condition == "False":
                condition = self.set_condition(
                    result.pod, "True", "Allocated", "all GPU claims are allocated"
                )
                result.pod = kept_view(condition) if condition is not None else result.pod
        except KubeError as err:
            # A re-read after a conflict failed: the claim being written counts as not attempted
            # (the worker falls back to the cache), so it is neither wedged in flight nor lost.
            log.warning("pod %s: writes interrupted: %s", placed.pod.key, err)
            result.outcome = BindOutcome.RETRY
        return result

    def _write_allocation(self, write: ClaimWrite, pod: PodView) -> tuple[ClaimView | None, ClaimView | None]:
        """Finalizer (Update) then allocation (UpdateStatus), both guarded by resourceVersion.

        The same UpdateStatus reserves the claim for ``pod`` (``reservedFor``), which kube-scheduler's
        PreBind would otherwise write once more after the gate is lifted: it only appends a pod that
        is not reserved yet (docs/performance.md, "API writes per pod"). A pod that goes away
        before it is bound is dropped from ``reservedFor`` by kube-controller-manager, after which
        the claim is released as before.

        Returns ``(written, None)`` on success, else ``(None, current)`` with the claim as the API
        holds it (``None`` when it is gone).
        """
        claim = write.claim

        def attempt(current: Obj) -> tuple[bool, Obj]:
            """(written?, the claim as written, or as the API holds it when not written)."""
            _same_object(current, claim)
            if self._view(current).allocation:
                return False, current  # allocated elsewhere in the meantime: plan again with it counted
            if not self.still_leading():
                log.warning("claim %s: allocation not written: no longer leading", claim.key)
                return False, current
            finalized = with_finalizer(current)
            if finalized is not None:
                current = self.kube.update(RESOURCE_CLAIMS, finalized)
                if not self.still_leading():
                    log.warning("claim %s: allocation not written: no longer leading", claim.key)
                    return False, current
            allocated = with_allocation(current, write.allocation, {"name": pod.name, "uid": pod.uid})
            return True, self.kube.update(RESOURCE_CLAIMS, allocated, status=True)

        try:
            written, obj = retry_on_conflict(
                attempt,
                dict(claim),
                lambda: self.read_claim(claim),
                on_conflict=self._conflict,
            )
        except NotFound:
            return None, None
        except KubeError as err:
            log.warning("claim %s: allocation not written: %s", claim.key, err)
            try:
                return None, self._view(self.read_claim(claim))
            except KubeError:
                return None, claim
        return (self._view(obj), None) if written else (None, self._view(obj))

    def _lift_gate(self, pod: PodView, annotations: Mapping[str, str]) -> tuple[PodView | None, BindOutcome]:
        """Remove our gate, in the same patch setting ``annotations``; a Normal event says where.

        A JSON patch (``gate_patch``) rather than an Update: kube-controller-manager writes the
        pod's status between our read and our write on nearly every pod, which made the Update
        fail with 409 and cost a read and a second write (docs/performance.md, "API writes per
        pod"). The patch needs no resourceVersion and its ``test`` ops refuse it (nothing written)
        when the pod is another object or our gate moved; then the pod is read once: gone or
        another object is GONE, a gate lifted already (a write of ours whose answer was lost)
        BOUND without writing, else the patch is made again from what was read.
        """
        try:
            current = self._patch_gate(pod, annotations)
        except NotFound:
            return None, BindOutcome.GONE
        except KubeError as err:
            log.warning("pod %s: gate not removed: %s", pod.key, err)
            return None, BindOutcome.RETRY
        record = annotations.get(decision_annotation(self.driver))
        if record is not None:
            self.event(pod, "Normal", "Allocated", placement_summary(record))
        return kept_view(current), BindOutcome.BOUND

    def _patch_gate(self, pod: PodView, annotations: Mapping[str, str]) -> Mapping[str, object]:
        """The pod as the gate's patch left it (as ``pod`` is when it carries no gate); raises
        NotFound when the pod is gone or another object, KubeError when the patch failed twice."""
        ops = gate_patch(pod, annotations)
        if ops is None:
            return pod  # lifted already
        try:
            written: Obj = self.kube.patch(PODS, pod.namespace, pod.name, ops)
            return written
        except KubeError as err:
            if err.status == 404:
                raise NotFound(404, str(err)) from None
            first = err
        if first.status in (409, 422):  # a test op failed: the pod changed under our decision
            self._conflict()
        current = self.read_pod(pod)
        _same_object(current, pod)
        ops = gate_patch(current, annotations)
        if ops is None:
            return current  # lifted already (maybe by our own patch whose answer was lost)
        log.info("pod %s: gate patch refused (%s); made again from a fresh read", pod.key, first)
        written = self.kube.patch(PODS, pod.namespace, pod.name, ops)
        return written

    # --- pending reports -----------------------------------------------------------------------
    def report_pending(self, pod: PodView, reason: str, message: str) -> PodView | None:
        """A Warning event and the pod's condition (False, ``reason``); the pod as written."""
        self.event(pod, "Warning", "FailedAllocation", message)
        written = self.set_condition(pod, "False", reason, message)
        return None if written is None else kept_view(written)

    def set_condition(self, pod: Mapping[str, object], status: str, reason: str, message: str) -> Obj | None:
        """Our condition on the pod: a strategic merge patch of its status (conditions merge by
        type, so no read first; the pod's uid in it, which another pod of the name refuses). The
        pod as written, None when it failed (gone, another object, an API error: the next report
        writes it again)."""
        view = PodView.parse(pod)
        patch = condition_patch(view, status, reason, message, rfc3339_now())
        try:
            written: Obj = self.kube.patch(
                PODS, view.namespace, view.name, patch, status=True, strategic=True
            )
            return written
        except KubeError as err:
            log.info("condition for %s not written: %s", view.key, err)
            return None

    def event(self, obj: ObjectView, kind: str, reason: str, message: str, action: str = "Allocate") -> None:
        """Record an ``events.k8s.io/v1`` Event about ``obj`` (a Pod or a ResourceClaim; ``kind``
        is the event type); a repeat of the same event counts on its series instead."""
        self.events.emit(obj.reference(), kind, reason, action, message)

    # --- fencing -------------------------------------------------------------------------------
    def fence(self, claims: Sequence[ClaimView]) -> list[ClaimView]:
        """Bump the resourceVersion of ``claims`` that carry our finalizer but no allocation;
        returns the claims as written or re-read, for the worker to fold into the cache.

        Such a claim may have an allocation write in flight that this process does not know of: a
        predecessor's (killed, or deposed, while its UpdateStatus hung) or our own whose outcome was
        unknown (a timeout). That write carries the resourceVersion we see now, so while we leave
        the claim unallocated it could still land, on a card we have since given to others. Any
        write to the claim makes it fail with 409; if it landed first, our fence gets the 409
        instead and the re-read shows the allocation, which the ledger then counts.
        """
        seen: list[ClaimView] = []
        for claim in claims:
            if claim.allocation or not claim.ours:
                continue
            key = claim.key
            if self.fenced.get(key) == claim.resource_version:
                continue
            fence = with_annotation(claim, FENCE_ANNOTATION, f"{self.identity} {rfc3339_now()}")
            try:
                written = self._view(self.kube.update(RESOURCE_CLAIMS, fence))
            except NotFound:
                continue
            except KubeError as err:
                try:
                    # 409: something was written first (maybe the allocation): learn what.
                    current = self._view(self.read_claim(claim))
                except KubeError as read_err:
                    log.warning(
                        "claim %s: not fenced (%s; re-read: %s); retried next pass", key, err, read_err
                    )
                    continue
                if not err.conflict:
                    log.warning("claim %s: not fenced: %s; retried next pass", key, err)
                if current.allocation:
                    log.warning("claim %s: an allocation landed while it was unallocated here; counted", key)
                seen.append(current)
                continue
            self.fenced[key] = written.resource_version
            log.info("claim %s fenced at resourceVersion %s", key, written.resource_version)
            seen.append(written)
        return seen

    def forget(self, claim_key: str) -> None:
        """The claim was deleted: drop what was fenced."""
        self.fenced.pop(claim_key, None)

    # --- reads ---------------------------------------------------------------------------------
    def read_claim(self, claim: ObjectView) -> Obj:
        return self.kube.get(RESOURCE_CLAIMS, claim.namespace, claim.name)

    def read_pod(self, pod: ObjectView) -> Obj:
        return self.kube.get(PODS, pod.namespace, pod.name)

    def _view(self, obj: Mapping[str, object]) -> ClaimView:
        return ClaimView.parse(obj, self.driver)

    def _conflict(self) -> None:
        self.metrics.conflicts.inc()
