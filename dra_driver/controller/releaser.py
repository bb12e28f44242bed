"""The releaser: deallocation and overcommit repair, with its own queue of claims to look at.

Like kube-controller-manager's resourceclaim controller beside kube-scheduler: a claim carrying our
finalizer is released (allocation cleared, then finalizer removed) when it is being deleted, or
when nobody reserved it and no live pod refers to it. A claim whose allocation kube-scheduler's
PostFilter cleared (finalizer still ours) is left to the allocator, which places its pod again.

An unallocated claim that is not being deleted keeps our finalizer: the chart's admission puts it
on every new claim of our classes (charts/hami-dra/templates/claim-finalizer.yaml), so that the
binder's one write per claim is the allocation itself; removing it from a claim that waits for
its pod (a claim is often created before the pod that names it) would only cost a write here and
another one in the binder. It goes when the claim is deleted.

It runs on the worker thread (the ledger it repairs against is the worker's), over the claims the
cache's events woke (``run``); what it writes is folded into the cache at once.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from dra_driver.contract import FINALIZER
from dra_driver.controller.binder import Binder
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.kube.api import RESOURCE_CLAIMS, KubeApi, Obj
from dra_driver.kube.errors import Conflict, KubeError, NotFound
from dra_driver.kube.writes import retry_on_conflict
from dra_driver.resource.edits import without_allocation, without_finalizer
from dra_driver.resource.objects import ClaimView

log = logging.getLogger("dra_driver.controller")


class ReleaseOutcome(StrEnum):
    SKIP = "skip"  # not ours
    IN_USE = "in-use"  # still reserved or referenced: kept
    WAITING = "waiting"  # unallocated, not being deleted: our finalizer stays for its allocation
    RELEASED = "released"  # allocation and finalizer removed
    GONE = "gone"  # the claim no longer exists
    RETRY = "retry"  # conflicts every attempt: next pass


class RepairOutcome(StrEnum):
    REPORTED = "reported"  # an overcommit that cannot be repaired: reported only
    DEALLOCATED = "deallocated"  # repaired by deallocating a claim
    RETRY = "retry"  # the repair write failed: next pass


def deleted_with_our_finalizer(claim: ClaimView) -> bool:
    """A claim being deleted that only our finalizer holds: removing it deletes the claim, which
    frees its devices as a deallocation would, so the status write before it can be left out.

    kube-controller-manager clears a deleted claim's allocation first whatever its finalizers
    (pkg/controller/resourceclaim/controller.go): where another component's finalizer keeps the
    claim, that frees the devices now, and so do we. With ours alone the clearing costs a write on
    the worker thread for nothing: at 10 pods a second ending, the two writes per release held the
    worker for most of each second and new pods were planned in clumps (docs/performance.md,
    "Steady state: releases on the worker thread").
    """
    return claim.deleting and set(claim.finalizers) == {FINALIZER}


class Releaser:
    """Releases unused claims of ours and repairs overcommitted GPUs; owns the dirty-claim queue."""

    def __init__(
        self, kube: KubeApi, cache: ClusterCache, binder: Binder, metrics: ControllerMetrics
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.binder = binder  # for its events and reads
        self.metrics = metrics
        self.queue: set[str] = set()  # claim keys to look at

    def run(self) -> None:
        """Look at every queued claim once; those that must be retried stay queued."""
        keys, self.queue = self.queue, set()
        for key in sorted(keys):
            if self.cache.assumed.writing(key):
                self.queue.add(key)  # our allocation is being written: after it completes
                continue
            namespace, _, name = key.partition("/")
            claim = self.cache.claim(namespace, name)
            if claim is None:
                continue
            try:
                if self.repair_overcommit(claim) is RepairOutcome.RETRY:
                    self.queue.add(key)
                if self.release(claim) is ReleaseOutcome.RETRY:
                    self.queue.add(key)
            except KubeError as err:
                log.warning("claim %s: %s", key, err)
                self.queue.add(key)
            except Exception:  # one claim must never stop the others: looked at again at resync
                log.exception("claim %s: unexpected error; the other claims go on", key)
                self.metrics.unexpected_errors.labels("ResourceClaim").inc()

    def release(self, claim: ClaimView) -> ReleaseOutcome:
        """Release a claim of ours that nobody uses; returns what it did."""
        if not claim.ours:
            return ReleaseOutcome.SKIP
        if claim.reserved:
            return ReleaseOutcome.IN_USE
        if not claim.deleting and self.cache.live_consumers(claim):
            return ReleaseOutcome.IN_USE
        if not claim.deleting and not claim.allocation:
            return ReleaseOutcome.WAITING

        def release(raw: Obj) -> ReleaseOutcome:
            current = self.cache.claim_view(raw)
            if current.reserved:
                return ReleaseOutcome.IN_USE
            freed_by_deletion = bool(current.allocation) and deleted_with_our_finalizer(current)
            if current.allocation and not freed_by_deletion:
                current = self.deallocate(current)
            self.cache.wrote(self.kube.update(RESOURCE_CLAIMS, without_finalizer(current)))
            if freed_by_deletion:
                self.metrics.deallocations.inc()  # its devices are free as after a deallocation
            log.info("claim %s released", claim.key)
            return ReleaseOutcome.RELEASED

        try:
            return retry_on_conflict(
                release,
                dict(claim),
                lambda: self.binder.read_claim(claim),
                on_conflict=self.metrics.conflicts.inc,
            )
        except NotFound:
            return ReleaseOutcome.GONE
        except Conflict:
            return ReleaseOutcome.RETRY

    def repair_overcommit(self, claim: ClaimView) -> RepairOutcome | None:
        """Act on an observed allocation that overcommits a GPU (None when nothing is wrong).

        It should never happen (allocations are written with resourceVersion guards and fenced),
        but another allocator, a bug or a hand-written status can cause it. Reported as an error
        log, a metric and a Warning event; repaired by deallocating the newest claim on the card
        that carries our finalizer and whose pods have not started (each still gated, or none
        reserved), so that pod is placed again; a card whose users have all started is reported only.
        """
        cache = self.cache
        for use in claim.uses:
            problems, uids = cache.ledger.overcommit(use.device)
            if not problems:
                continue
            where = str(use.device)
            by_uid = {c.uid: c for c in cache.claims.values()}
            candidates = [
                by_uid[uid]
                for uid in uids
                if uid in by_uid
                and by_uid[uid].ours
                and cache.unstarted(by_uid[uid])
                and not cache.assumed.writing(by_uid[uid].key)
            ]
            if not candidates:
                log.error(
                    "GPU %s overcommitted (%s) by started or foreign claims; not repaired", where, problems
                )
                self.metrics.overcommits.labels("reported").inc()
                return RepairOutcome.REPORTED
            victim = max(candidates, key=lambda c: (c.created, c.key))
            log.error("GPU %s overcommitted (%s); deallocating the newest unstarted claim %s", where,
                      "; ".join(problems), victim.key)  # fmt: skip
            try:
                self.deallocate(victim)
            except KubeError as err:
                log.warning("claim %s: overcommit repair failed: %s; retried", victim.key, err)
                return RepairOutcome.RETRY
            self.metrics.overcommits.labels("deallocated").inc()
            message = f"GPU {where} was overcommitted ({'; '.join(problems)}): claim {victim.key} deallocated"
            # On the claim always (its pods may not be known yet: watches of different resources
            # are not ordered), and on each pod that refers to it.
            self.binder.event(victim, "Warning", "GpuOvercommitted", message, action="Deallocate")
            for pod_key in sorted(cache.consumers.get(victim.key, ())):
                pod = cache.pods.get(pod_key)
                if pod is not None:
                    self.binder.event(pod, "Warning", "GpuOvercommitted", message, action="Deallocate")
            return RepairOutcome.DEALLOCATED
        return None

    def deallocate(self, claim: ClaimView) -> ClaimView:
        """Clear the claim's allocation (UpdateStatus with its resourceVersion); returns what was written."""
        written = self.kube.update(RESOURCE_CLAIMS, without_allocation(claim), status=True)
        self.metrics.deallocations.inc()
        return self.cache.wrote(written)
