"""The controller's state machine: gated pods -> allocated claims -> gate removed; releases.

Everything runs on one worker thread (``Controller.run_once``); informer threads only queue keys.
Writes are those of an allocator beside kube-scheduler: our finalizer is added to a claim
(Update) before its allocation is written (UpdateStatus), both with the resourceVersion just
read, so a concurrent allocator (another replica, kube-scheduler) makes one of the writes fail
with 409 instead of allocating a device twice; only then is the pod's gate removed. A crash
between any two writes leaves a state the next pass completes: a finalizer without allocation is
reused or dropped, an allocated claim of a still-gated pod pins the pod's node, an allocated pod's
gate is removed.

Deallocation: a claim carrying our finalizer is released (allocation cleared, then finalizer
removed) when it is being deleted, or when nobody reserved it and no live pod refers to it.
A claim whose allocation kube-scheduler's PostFilter cleared (finalizer still ours) is allocated
again for its pending pod.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.config.resolve import PLAN_ANNOTATIONS
from dra_driver.contract import FINALIZER, GATE_NAME, DeviceId, policy_taint_key
from dra_driver.controller.allocation import build_allocation, pinned_node, rfc3339_now
from dra_driver.controller.assumed import ClaimAssumptions
from dra_driver.controller.containers import GPU_LIMITS_CONFLICT, claim_facts, limits_conflict
from dra_driver.controller.decision_record import (
    decision_annotation,
    encode,
    placement_summary,
    request_record,
)
from dra_driver.controller.hami_annotation import ANNOTATION as HAMI_ALLOCATED_ANNOTATION
from dra_driver.controller.hami_annotation import encode_devices_allocated
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger, Use
from dra_driver.controller.metrics import ControllerMetrics, PendingGroup, Tenant, created_epoch
from dra_driver.controller.objects import (
    ClaimView,
    DeviceClassView,
    ObjectView,
    PodView,
    bound_requests_by_node,
)
from dra_driver.controller.planner import ClaimPlan, PlanInput, Planner, PodPlan
from dra_driver.controller.pods import NodeView, node_fit_problem
from dra_driver.controller.quotas import QuotaBook
from dra_driver.controller.requests import Matcher, RequestError, claim_requests
from dra_driver.engine import Decision, GpuCard
from dra_driver.kube.api import EVENTS, PODS, RESOURCE_CLAIMS, KubeApi, Obj
from dra_driver.kube.errors import KubeError
from dra_driver.kube.writes import retry_on_conflict

log = logging.getLogger("dra_driver.controller")
CONDITION_TYPE = "gpu.hami.io/Allocated"
#: The pending reason of a pod that fits no node's free capacity (the others: quota, config, ...).
UNSCHEDULABLE = "Unschedulable"
#: Pod fields that differ between pods of one workload without changing where they fit.
_SHAPE_IGNORED_POD_FIELDS = frozenset({"resourceClaims", "schedulingGates", "hostname", "subdomain"})
_HAMI_REASON = re.compile(r"\d+/\d+ ([A-Za-z]+)")
#: Written to a claim to fence it (see ``Reconciler.fence_unallocated``); its value says who and when.
FENCE_ANNOTATION = "gpu.hami.io/fenced-by"


class Outcome(StrEnum):
    """What a reconcile step did or why it did nothing (callers retry on ``RETRY``)."""

    DONE = "done"  # written (allocation and gate)
    SKIP = "skip"  # nothing for us to do
    WAITING = "waiting"  # a template claim does not exist yet: its creation wakes the pod up
    PENDING = "pending"  # cannot be placed now; the reason is on the pod
    RETRY = "retry"  # try again next pass (a conflict, an API error, a write in flight)
    IN_USE = "in-use"  # a claim still reserved or referenced: kept
    RELEASED = "released"  # a claim's allocation and finalizer removed
    GONE = "gone"  # the object no longer exists
    REPORTED = "reported"  # an overcommit that cannot be repaired: reported only
    DEALLOCATED = "deallocated"  # an overcommit repaired by deallocating a claim


@dataclass(slots=True)
class CommitJob:
    """The writes for one planned pod: each claim's allocation (in order), then the gate."""

    pod: PodView
    writes: list[tuple[ClaimView, dict[str, Any]]]
    clear_pending: bool = False
    #: Pod annotations written with the gate removal (``hami.io/vgpu-devices-allocated``).
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class CommitResult:
    job: CommitJob
    written: list[ClaimView] = field(default_factory=list)
    failed: list[tuple[ClaimView, ClaimView | None]] = field(default_factory=list)
    pod: PodView | None = None
    outcome: Outcome = Outcome.DONE


def has_gate(pod: Mapping[str, Any]) -> bool:
    """Our gate is on ``pod`` (a raw object, e.g. one just re-read; a ``PodView`` says ``gated``)."""
    return any(gate.get("name") == GATE_NAME for gate in (pod.get("spec") or {}).get("schedulingGates") or ())


def format_decision(
    subject: str, decision: Decision, config: str, device_name: Callable[[str, int], str] | None = None
) -> str:
    """HAMi's "computer score" log line: every card with its score, eligibility and the choice.

    ``device_name(node, index)``: the card's name in its ResourceSlice (NVML nodes name GPUs by
    minor number, which may differ from the engine's index); ``gpu-<index>`` without it.
    """
    name = device_name or (lambda _node, index: f"gpu-{index}")
    cards = []
    for card in decision.candidates:
        mark = "*" if card.chosen else ""
        state = "" if card.eligible else f"({card.reason.value if card.reason else 'ineligible'})"
        cards.append(f"{card.node}/{name(card.node, card.index)}={card.score:.6f}{mark}{state}")
    placement = decision.placement
    outcome = (
        f"-> {placement.node} " + ",".join(name(placement.node, share.index) for share in placement.devices)
        if placement is not None
        else f"-> pending: {decision.reason}"
    )
    return f"{subject}: {config} {outcome}; scores: {' '.join(cards) or '-'}"


def plan_uses(claim_plan: ClaimPlan, classes: Mapping[str, str]) -> tuple[Use, ...]:
    """The ledger's uses of a planned claim, straight from the plan (``classes``: request -> class)."""
    namespace = claim_plan.claim.namespace
    return tuple(
        Use(
            r.device,
            r.share.memory,
            r.share.cores,
            r.share.tenants,
            namespace,
            classes.get(r.request, ""),
        )
        for r in claim_plan.results
        if not r.admin_access
    )


class Reconciler:
    """Reads caches through ``view`` callables, writes through ``kube``; single-threaded."""

    def __init__(
        self,
        kube: KubeApi,
        driver: str,
        defaults: ControllerDefaults,
        metrics: ControllerMetrics,
        *,
        policy_taint: str | None = None,
        identity: str = "hami-dra-controller",
        still_leading: Callable[[], bool] | None = None,
    ) -> None:
        self.kube = kube
        #: Checked before each allocation write: a replica deposed while its commit is in flight
        #: must not write an allocation the new leader's ledger does not know about.
        self.still_leading = still_leading or (lambda: True)
        self.driver = driver
        self.metrics = metrics
        self.identity = identity
        self.ledger = Ledger()
        self.classes: dict[str, DeviceClassView] = {}
        self.pods: dict[str, PodView] = {}  # parsed once per informer event or write
        self.claims: dict[str, ClaimView] = {}
        self.nodes: dict[str, NodeView] = {}  # parsed once per informer event
        self.matcher = Matcher(driver, policy_taint or policy_taint_key(driver))
        self.planner = Planner(self.ledger, self.matcher, driver, defaults, self.classes.get)
        self.quotas = QuotaBook(self.ledger, metrics)
        self.pending: dict[str, tuple[str, str]] = {}  # pod uid -> (last pending message, its reason)
        self.fenced: dict[str, str] = {}  # claim key -> resourceVersion our fence write produced
        self.owned: dict[tuple[str, str], str] = {}  # (owner pod uid, pod claim name) -> claim name
        self.consumers: dict[str, set[str]] = {}  # claim key -> pod keys referring to it
        self.pods_by_uid: dict[str, str] = {}
        self.warned: dict[str, set[str]] = {}  # pod uid -> warnings already reported as events
        #: Claims (by uid) deleted while a bound, active pod still names them: counted until those
        #: pods end.
        self.orphans: dict[str, ClaimView] = {}
        #: Claims being written or just written: what the controller knows before its cache does.
        self.assumed = ClaimAssumptions(self.ledger, driver)
        self.bound_generation = 0  # bumped when a pod bound to a node changes (CPU/memory in use)
        self._bound_cache: tuple[int, dict[str, dict[str, float]]] | None = None

    # --- views ---------------------------------------------------------------------------------
    def is_ours(self, class_name: Any) -> bool:
        klass = self.classes.get(str(class_name))
        return klass is not None and klass.ours

    def claim(self, namespace: str, name: str) -> ClaimView | None:
        key = f"{namespace}/{name}"
        return self.assumed.effective(key, self.claims.get(key))

    # --- informer events (the controller's only way into the caches) ----------------------------
    def pod_event(self, key: str, old: PodView | None, new: PodView | None) -> PodView | None:
        """Cache a pod's new version and index it; returns what is cached now.

        A version older than one our own write returned is ignored (the watch lags our writes).
        """
        current = self.pods.get(key)
        if new is not None and current is not None and current.newer_than(new):
            new = current
        if new is None:
            self.pods.pop(key, None)
        else:
            self.pods[key] = new
        self.observe_pod(old if current is None else current, new)
        if self.orphans and (new is None or not new.active):
            self.release_orphans()
        if new is None and old is not None:
            self.pending.pop(old.uid, None)
            self.warned.pop(old.uid, None)
        return new

    def claim_event(self, key: str, old: ClaimView | None, new: ClaimView | None) -> None:
        """Cache a claim's new version; the ledger counts what ``assumed`` says is effective."""
        if new is None:
            self.claims.pop(key, None)
            self.forget_claim(key)
        else:
            self.claims[key] = new
        self.observe_claim(old, new)

    def class_event(self, name: str, new: Mapping[str, Any] | None) -> None:
        if new is None:
            self.classes.pop(name, None)
        else:
            self.classes[name] = DeviceClassView(new, self.driver)

    def node_event(self, name: str, new: NodeView | None) -> None:
        if new is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = new

    def release_orphans(self) -> list[str]:
        """Stop counting deleted claims whose last active pod has ended; returns their keys."""
        released = [
            self.orphans.pop(uid)
            for uid, claim in list(self.orphans.items())
            if not self.live_consumers(claim, bound_only=True)
        ]
        for claim in released:
            self.assumed.gone(claim)
            log.info("claim %s: its last pod ended; the deleted claim's GPU share is free", claim.key)
        return [claim.key for claim in released]

    def forget_claim(self, key: str) -> None:
        """The claim was deleted: drop what we assumed about it."""
        self.assumed.forget(key)
        self.fenced.pop(key, None)

    def claim_view(self, obj: Mapping[str, Any]) -> ClaimView:
        """A claim as the controller reads it (the informer boundary and every write's result)."""
        return ClaimView.parse(obj, self.driver)

    def observe_claim(self, old: ClaimView | None, new: ClaimView | None) -> None:
        """Keep the ledger and the template-claim index in step with a claim change.

        While our allocation of the claim is being written, the ledger keeps our assumption: the
        intermediate events of our own writes (the finalizer update) must not erase it. After the
        writes, an event older than what we wrote is ignored the same way (``claim()``).
        """
        if old is not None and new is None:
            for owner in old.owners:
                self.owned.pop(owner, None)
            if old.uses and self.live_consumers(old, bound_only=True):
                # Deleted while a pod that names it still runs (our finalizer was stripped by
                # hand): the container keeps the device until the pod ends, so its share stays
                # booked in the ledger (and the quota) until then (``release_orphans``).
                self.orphans[old.uid] = old
                log.warning(
                    "claim %s deleted while pods still use it; its GPU share stays booked until they end",
                    old.key,
                )
                return
            self.assumed.gone(old)
            return
        if new is None:
            return
        self.assumed.observed(new, self.claims.get(new.key))
        for owner in new.owners:
            self.owned[owner] = new.name

    def observe_pod(self, old: PodView | None, new: PodView | None) -> None:
        """Index which claims each pod refers to (for releases) and pods by UID."""
        if any(pod is not None and pod.bound_to for pod in (old, new)):
            self.bound_generation += 1
        if old is not None:
            for claim_key in old.claim_keys:
                self.consumers.get(claim_key, set()).discard(old.key)
            self.pods_by_uid.pop(old.uid, None)
        if new is not None:
            for claim_key in new.claim_keys:
                self.consumers.setdefault(claim_key, set()).add(new.key)
            self.pods_by_uid[new.uid] = new.key

    def refresh_inventory(self, slices: list[Obj]) -> None:
        self.ledger.set_inventory(build_inventory(slices, self.driver))

    # --- pods ----------------------------------------------------------------------------------
    def pod_claims(self, pod: PodView) -> list[tuple[str, ClaimView | None]]:
        result = []
        for pod_claim, claim_name in pod.claim_names:
            if claim_name is None:
                # Before kcm records resourceClaimStatuses: a claim owned by the pod for that entry.
                claim_name = self.owned.get((pod.uid, pod_claim))
            result.append((pod_claim, None if claim_name is None else self.claim(pod.namespace, claim_name)))
        return result

    def is_candidate(self, pod: PodView) -> bool:
        if pod.bound_to or not pod.active or pod.deleting:
            return False
        if pod.gated:
            return True
        # PostFilter cleared an allocation we made: our finalizer stays, allocation is gone.
        return not pod.other_gates and any(
            claim is not None and claim.ours and not claim.allocation for _, claim in self.pod_claims(pod)
        )

    def allowed_nodes(self, pod: PodView, among: Iterable[str] | None = None) -> frozenset[str]:
        """Nodes (of ``among``, default all) where the pod itself may run: selectors, affinity,
        taints, CPU/memory/pods left, and a pool of ours."""
        wanted = pod.requests
        bound: Mapping[str, Mapping[str, float]] = {}
        if any(amount > 0 for amount in wanted.values()):
            if self._bound_cache is None or self._bound_cache[0] != self.bound_generation:
                self._bound_cache = (self.bound_generation, bound_requests_by_node(self.pods.values()))
            bound = self._bound_cache[1]
        allowed = set()
        for name in self.nodes if among is None else among:
            node = self.nodes.get(name)
            if (
                node is not None
                and name in self.ledger.inventory
                and node_fit_problem(pod, node, bound.get(name, {}), wanted) is None
            ):
                allowed.add(name)
        return frozenset(allowed)

    def pending_shape(self, pod: PodView) -> str | None:
        """A key equal for pods that get the same plan on the same state, or None when unsure.

        Pods of one Deployment or Job differ only in names: their claims (from one template) ask
        for the same devices and their specs place them alike. When one of them stays pending
        after a release, so does every later one of its shape in that pass (capacity only shrinks
        within a pass), which lets the controller skip them (``Controller`` pending retries).
        A pod with an allocated or missing claim is never grouped (its plan depends on it alone).
        """
        claims = []
        for _, claim in self.pod_claims(pod):
            if claim is None or claim.allocation:
                return None
            claims.append(claim.get("spec"))
        spec = {
            key: value
            for key, value in (pod.get("spec") or {}).items()
            if key not in _SHAPE_IGNORED_POD_FIELDS
        }
        ours = {key: pod.annotations[key] for key in PLAN_ANNOTATIONS if key in pod.annotations}
        return json.dumps([pod.namespace, ours, spec, claims], sort_keys=True, default=str)

    def reconcile_pod(self, pod: PodView, only_nodes: frozenset[str] | None = None) -> Outcome | CommitJob:
        """Plan what the pod needs: a ``CommitJob`` to write, or why not (waiting, pending, retry, skip).

        ``only_nodes``: plan on these nodes only, for a pod that did not fit anywhere and since
        then capacity was freed on just these nodes; if it still does not fit, it stays pending
        with the explanation of its last full evaluation (nothing is written).
        """
        if not self.is_candidate(pod):
            return Outcome.SKIP
        claims = self.pod_claims(pod)
        if any(claim is None for _, claim in claims):
            return Outcome.WAITING  # a template claim is not created yet: its creation wakes us up
        if any(claim is not None and self.assumed.writing(claim.key) for _, claim in claims):
            # A claim shared with another pod whose allocation is being written: planning it again
            # would replace that assumed use in the ledger while the other write may still win.
            return Outcome.RETRY
        inputs: list[PlanInput] = []
        pinned: set[str] = set()
        request_classes_of: dict[str, dict[str, str]] = {}
        seen: set[str] = set()
        for _, claim in claims:
            assert claim is not None
            if claim.key in seen:
                continue  # two pod entries may name one ResourceClaim: it gets one allocation
            seen.add(claim.key)
            if claim.allocation:
                node = pinned_node(claim.allocation)
                if node is not None:
                    pinned.add(node)
                continue
            missing = sorted(set(claim.request_classes.values()) - set(self.classes))
            if missing:
                # Keep the gate: once the class exists it may be ours, and an ungated pod would be
                # allocated first-fit by kube-scheduler.
                message = f"claim {claim.key}: DeviceClass {', '.join(missing)} not found"
                return self._pending(pod, message, "DeviceClassNotFound")
            try:
                requests, foreign = claim_requests(claim, self.is_ours)
            except RequestError as err:
                return self._pending(pod, f"claim {claim.key}: {err}", "InvalidRequest")
            if not requests:
                continue
            if foreign:
                message = (
                    f"claim {claim.key} mixes requests of other drivers ({', '.join(foreign)}) with ours; "
                    "put them in separate claims"
                )
                return self._pending(pod, message, "MixedClaim")
            inputs.append(PlanInput(claim, requests))
            request_classes_of[claim.key] = {
                spec.name: spec.class_name for request in requests for spec in request.alternatives
            }
        if len(pinned) > 1:
            return self._pending(
                pod, f"claims are allocated on different nodes: {sorted(pinned)}", "NodeConflict"
            )
        facts = [claim_facts(name, c.raw, pod.uid, self.is_ours) for name, c in claims if c is not None]
        conflict = limits_conflict(pod.raw, facts)
        if conflict is not None:
            return self._pending(pod, conflict, GPU_LIMITS_CONFLICT)
        if not inputs:
            return CommitJob(pod, [], self._clear_pending(pod))
        started = time.perf_counter()
        allowed = self.allowed_nodes(pod, only_nodes)
        plan = self.planner.plan(pod, inputs, allowed, next(iter(pinned), None))
        elapsed = time.perf_counter() - started
        self.metrics.latency.observe(elapsed)
        if only_nodes is not None and (plan.reason is not None or plan.node is None):
            return Outcome.PENDING
        self._log_plan(pod, plan)
        if plan.reason is not None or plan.node is None:
            return self._pending(pod, plan.reason or "does not fit", UNSCHEDULABLE)
        planned = [
            (claim_plan, plan_uses(claim_plan, request_classes_of[claim_plan.claim.key]))
            for claim_plan in plan.claims
        ]
        charges = [self.ledger.charge(use) for _, uses in planned for use in uses]
        breach = self.quotas.check(pod.namespace, charges)
        if breach is not None:
            return self._pending(pod, breach.message, "GpuQuotaExceeded")
        writes = [
            (
                claim_plan.claim,
                build_allocation(
                    claim_plan, plan.node, self.classes.get, request_classes_of[claim_plan.claim.key]
                ),
            )
            for claim_plan, _ in planned
        ]
        annotations = self._hami_annotations(pod, claims, writes, plan.node)
        records = [request_record(s, d, c, self.ledger.device_name) for s, d, c in plan.decisions]
        annotations[decision_annotation(self.driver)] = encode(records, rfc3339_now())
        for claim_plan, uses in planned:
            # Assume the allocation now, so the next pod is planned with it even while it is written
            # (the same uses the written allocation will give when its informer event arrives).
            # Last, after everything that could fail: an assumption is never left behind by an error.
            self.assumed.begin_write(claim_plan.claim, uses)
        clear_pending = self._clear_pending(pod)
        return CommitJob(pod, writes, clear_pending, annotations)

    def fail_pod(self, pod: PodView, err: BaseException) -> Outcome:
        """Report an unexpected error while planning ``pod`` as its pending reason (InvalidRequest).

        The error is most likely the pod's own input (an annotation, a claim's selector or config)
        that some check let through: the pod stays gated and pending with the error in one line,
        and is planned again when something changes, like any other pending pod.
        """
        text = " ".join(f"{type(err).__name__}: {err}".split())
        message = f"unexpected error while planning this pod: {text[:300]}"
        try:
            return self._pending(pod, message, "InvalidRequest")
        except Exception:  # reporting must not become the next poison
            log.exception("pod %s: pending reason not reported", pod.key)
            return Outcome.PENDING

    def _hami_annotations(
        self,
        pod: PodView,
        claims: Sequence[tuple[str, ClaimView | None]],
        writes: Sequence[tuple[ClaimView, dict[str, Any]]],
        node: str,
    ) -> dict[str, str]:
        """HAMi's view of the placement (controller/hami_annotation.py), from the new allocations.

        Every claim of the pod is allocated on ``node`` (the plan's, which pinned claims share), so
        its cards are looked up in that node's inventory only.
        """
        new = {claim.key: allocation for claim, allocation in writes}
        allocated: dict[str, Mapping[str, Any]] = {}
        for pod_claim, claim in claims:
            if claim is None:
                continue
            allocation = new.get(claim.key)
            allocated[pod_claim] = {**claim, "status": {"allocation": allocation}} if allocation else claim
        inventory = self.ledger.inventory.get(node)

        def card_of(device_id: DeviceId) -> GpuCard | None:
            device = inventory.devices.get(device_id) if inventory is not None else None
            return device.card if device is not None else None

        value = encode_devices_allocated(pod, allocated, self.driver, card_of)
        return {} if value is None else {HAMI_ALLOCATED_ANNOTATION: value}

    # --- commit (may run on a writer thread: API calls only, no shared state) -------------------
    def commit(self, job: CommitJob) -> CommitResult:
        """Write the claims' allocations, then remove the gate; never touches caches or the ledger."""
        result = CommitResult(job)
        try:
            for claim, allocation in job.writes:
                written, current = self._write_allocation(claim, allocation, job.pod)
                if written is None:
                    result.failed.append((claim, current))
                    result.outcome = Outcome.RETRY
                    return result
                result.written.append(written)
                self.metrics.allocations.inc()
            result.pod, result.outcome = self._finish(job.pod, job.clear_pending, job.annotations)
        except KubeError as err:
            # A re-read after a conflict failed: the claim being written counts as not attempted
            # (``apply`` falls back to the cache), so it is neither wedged in flight nor lost.
            log.warning("pod %s: writes interrupted: %s", job.pod.key, err)
            result.outcome = Outcome.RETRY
        return result

    def apply(self, result: CommitResult) -> None:
        """Fold a commit's outcome back into the caches and the ledger (worker thread only)."""
        for claim, _ in result.job.writes:
            self.assumed.end_write(claim)
        for written in result.written:
            self.assumed.wrote(written)
        for claim, current in result.failed:
            if current is None:
                self.assumed.gone(claim)
                continue
            self.assumed.wrote(current)  # what the API really holds (someone else's allocation, or none)
            cached = self.claims.get(claim.key)
            if cached is not None:
                # ``current`` may be our stale copy (its re-read failed) while the cache already
                # holds a newer version that arrived during the write: count the newer one.
                self.observe_claim(None, cached)
        for claim, _ in result.job.writes[len(result.written) + len(result.failed) :]:
            # Not attempted after an earlier failure: drop the assumption, keep what the cache says.
            cached = self.claim(claim.namespace, claim.name)
            if cached is None:
                self.assumed.gone(claim)
            else:
                self.observe_claim(None, cached)
        if result.pod is not None:
            self.pods[result.pod.key] = result.pod

    def _log_plan(self, pod: PodView, plan: PodPlan) -> None:
        for subject, decision, config in plan.decisions:
            log.info(
                "pod %s %s", pod.key, format_decision(subject, decision, config, self.ledger.device_name)
            )
        for warning in plan.warnings:
            if warning not in self.warned.setdefault(pod.uid, set()):
                self.warned[pod.uid].add(warning)
                self._event(pod, "Warning", "UnknownPolicy", warning)

    # --- writes --------------------------------------------------------------------------------
    def _write_allocation(
        self, claim: ClaimView, allocation: dict[str, Any], pod: PodView
    ) -> tuple[ClaimView | None, ClaimView | None]:
        """Finalizer (Update) then allocation (UpdateStatus), both guarded by resourceVersion.

        The same UpdateStatus reserves the claim for ``pod`` (``reservedFor``), which kube-scheduler's
        PreBind would otherwise write once more after the gate is lifted: it only appends a pod that
        is not reserved yet (docs/performance.md, "API writes per pod"). A pod
        that goes away before it is bound is dropped from ``reservedFor`` by kube-controller-manager,
        after which the claim is released as before.

        Returns ``(written, None)`` on success, else ``(None, current)`` with the claim as the API
        holds it (``None`` when it is gone).
        """

        def attempt(current: Obj) -> tuple[Obj | None, Obj | None]:
            if (current.get("status") or {}).get("allocation"):
                return None, current  # allocated elsewhere in the meantime: plan again with it counted
            if not self.still_leading():
                log.warning("claim %s: allocation not written: no longer leading", claim.key)
                return None, current
            finalizers = current["metadata"].get("finalizers") or []
            if FINALIZER not in finalizers:
                current["metadata"]["finalizers"] = [*finalizers, FINALIZER]
                current = self.kube.update(RESOURCE_CLAIMS, current)
                if not self.still_leading():
                    log.warning("claim %s: allocation not written: no longer leading", claim.key)
                    return None, current
            current.setdefault("status", {})["allocation"] = allocation
            current["status"]["reservedFor"] = [{"resource": "pods", "name": pod.name, "uid": pod.uid}]
            return self.kube.update(RESOURCE_CLAIMS, current, status=True), None

        try:
            written, current = retry_on_conflict(
                attempt,
                copy.deepcopy(dict(claim)),
                lambda: self._read_claim(claim),
                on_conflict=self._conflict,
            )
        except KubeError as err:
            if err.not_found:
                return None, None
            log.warning("claim %s: allocation not written: %s", claim.key, err)
            try:
                return None, self.claim_view(self._read_claim(claim))
            except KubeError:
                return None, claim
        if written is not None:
            return self.claim_view(written), None
        return None, None if current is None else self.claim_view(current)

    def _read_claim(self, claim: ObjectView) -> Obj:
        return self.kube.get(RESOURCE_CLAIMS, claim.namespace, claim.name)

    def _read_pod(self, pod: ObjectView) -> Obj:
        return self.kube.get(PODS, pod.namespace, pod.name)

    def _conflict(self) -> None:
        self.metrics.conflicts.inc()

    def _finish(
        self, pod: PodView, clear_pending: bool, annotations: Mapping[str, str] | None = None
    ) -> tuple[PodView | None, Outcome]:
        """Remove our gate, in the same update setting ``annotations`` (and mark the condition
        allocated if we had reported it pending)."""

        def lift_gate(current: Obj) -> Obj:
            if not has_gate(current):
                return current
            updated = copy.deepcopy(dict(current))
            gates = [
                gate for gate in updated["spec"].get("schedulingGates") or () if gate.get("name") != GATE_NAME
            ]
            updated["spec"]["schedulingGates"] = gates
            if annotations:
                updated["metadata"]["annotations"] = {
                    **(updated["metadata"].get("annotations") or {}),
                    **annotations,
                }
            written: Obj = self.kube.update(PODS, updated)
            return written

        try:
            current = retry_on_conflict(
                lift_gate, dict(pod), lambda: self._read_pod(pod), on_conflict=self._conflict
            )
        except KubeError as err:
            if err.not_found:
                return None, Outcome.SKIP
            log.warning("pod %s: gate not removed: %s", pod.key, err)
            return None, Outcome.RETRY
        if clear_pending:
            current = (
                self._set_condition(current, "True", "Allocated", "all GPU claims are allocated") or current
            )
        record = (annotations or {}).get(decision_annotation(self.driver))
        if record is not None:
            self._event(pod, "Normal", "Allocated", placement_summary(record))
        return PodView.parse(current), Outcome.DONE

    def fence_unallocated(self, pod: PodView) -> None:
        """Bump the resourceVersion of the pod's claims that carry our finalizer but no allocation.

        Such a claim may have an allocation write in flight that this process does not know of: a
        predecessor's (killed, or deposed, while its UpdateStatus hung) or our own whose outcome was
        unknown (a timeout). That write carries the resourceVersion we see now, so while we leave
        the claim unallocated it could still land, on a card we have since given to others. Any
        write to the claim makes it fail with 409; if it landed first, our fence gets the 409
        instead and the re-read shows the allocation, which the ledger then counts.
        """
        for _, claim in self.pod_claims(pod):
            if claim is None or claim.allocation or not claim.ours:
                continue
            key = claim.key
            if self.fenced.get(key) == claim.resource_version:
                continue
            fence = copy.deepcopy(dict(claim))
            fence.pop("status", None)
            fence["metadata"].setdefault("annotations", {})[FENCE_ANNOTATION] = (
                f"{self.identity} {rfc3339_now()}"
            )
            try:
                written = self.kube.update(RESOURCE_CLAIMS, fence)
            except KubeError as err:
                if err.not_found:
                    continue
                try:
                    # 409: something was written first (maybe the allocation): learn what.
                    current = self._read_claim(claim)
                except KubeError as read_err:
                    log.warning(
                        "claim %s: not fenced (%s; re-read: %s); retried next pass", key, err, read_err
                    )
                    continue
                if not err.conflict:
                    log.warning("claim %s: not fenced: %s; retried next pass", key, err)
                if self.assumed.wrote(current).allocation:
                    log.warning("claim %s: an allocation landed while it was unallocated here; counted", key)
                continue
            self.fenced[key] = self.assumed.wrote(written).resource_version
            log.info("claim %s fenced at resourceVersion %s", key, self.fenced[key])

    def tenants(self) -> dict[str, Tenant]:
        """Claim uid -> who holds it, for the per-claim metrics: the pods it is reserved for, or
        the pod it was generated for while not reserved yet (deleted claims still booked too)."""
        tenants = {}
        effective = (self.claim(claim.namespace, claim.name) or claim for claim in self.claims.values())
        for claim in (*effective, *self.orphans.values()):
            pods = [self.pods_by_uid.get(uid) for uid in claim.reserved_uids] or [
                self.pods_by_uid.get(uid) for uid, _ in claim.owners
            ]
            names = sorted({key.partition("/")[2] for key in pods if key})
            tenants[claim.uid] = Tenant(claim.namespace, claim.name, ",".join(names))
        return tenants

    def pending_groups(self) -> dict[str, PendingGroup]:
        """The pods held pending, by their condition's reason: how many, and the oldest's creation."""
        counts: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for uid, (_, reason) in self.pending.items():
            counts[reason] = counts.get(reason, 0) + 1
            key = self.pods_by_uid.get(uid)
            pod = self.pods.get(key) if key else None
            created = created_epoch(pod.created) if pod is not None else None
            if created is not None:
                oldest[reason] = min(created, oldest.get(reason, created))
        return {reason: PendingGroup(count, oldest.get(reason)) for reason, count in counts.items()}

    def pending_reason(self, uid: str) -> str | None:
        """Why the pod is pending (``UNSCHEDULABLE``, ``GpuQuotaExceeded``, ...), or None."""
        entry = self.pending.get(uid)
        return None if entry is None else entry[1]

    def _clear_pending(self, pod: PodView) -> bool:
        """Forget why the pod was pending; whether it was (its condition then says allocated)."""
        return self.pending.pop(pod.uid, None) is not None

    def _pending(self, pod: PodView, message: str, reason: str) -> Outcome:
        self.fence_unallocated(pod)
        uid = pod.uid
        hami_reason = _HAMI_REASON.search(message)
        first_reason = hami_reason.group(1) if hami_reason else reason
        previous = self.pending.get(uid)
        self.pending[uid] = (message, reason)
        if previous is None or previous[0] != message:
            self.metrics.failures.labels(first_reason).inc()
            log.warning("pod %s pending: %s", pod.key, message)
            self._event(pod, "Warning", "FailedAllocation", message)
            written = self._set_condition(pod, "False", reason, message)
            if written is not None:
                self.pods[pod.key] = PodView.parse(written)
        return Outcome.PENDING

    def _event(self, obj: ObjectView, kind: str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` (a Pod, or a ResourceClaim: ``kind`` is the event type)."""
        now = rfc3339_now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{obj.name}.", "namespace": obj.namespace},
            "involvedObject": {
                "apiVersion": str(obj.get("apiVersion") or "v1"),
                "kind": str(obj.get("kind") or "Pod"),
                "name": obj.name,
                "namespace": obj.namespace,
                "uid": obj.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "hami-dra-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "gpu.hami.io/controller",
            "reportingInstance": self.identity,
        }
        try:
            self.kube.create(EVENTS, obj.namespace, event)
        except KubeError as err:
            log.info("event for %s not recorded: %s", obj.key, err)

    def _set_condition(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> Obj | None:
        def write(current: Obj) -> Obj:
            updated = copy.deepcopy(dict(current))
            conditions = [
                condition
                for condition in (updated.setdefault("status", {}).get("conditions") or ())
                if condition.get("type") != CONDITION_TYPE
            ]
            conditions.append(
                {
                    "type": CONDITION_TYPE,
                    "status": status,
                    "reason": reason,
                    "message": message[:32768],
                    "lastTransitionTime": rfc3339_now(),
                }
            )
            updated["status"]["conditions"] = conditions
            written: Obj = self.kube.update(PODS, updated, status=True)
            return written

        try:
            return retry_on_conflict(
                write, dict(pod), lambda: self._read_pod(PodView.parse(pod)), on_conflict=self._conflict
            )
        except KubeError as err:
            log.info("condition for %s not written: %s", PodView.parse(pod).key, err)
            return None

    # --- release -------------------------------------------------------------------------------
    def live_consumers(self, claim: ClaimView, *, bound_only: bool = False) -> bool:
        """Whether an active pod refers to the claim (its pod-claim entry resolves to it);
        ``bound_only``: a pod bound to a node, whose containers may hold the devices."""

        def live(pod: PodView | None) -> bool:
            return pod is not None and pod.active and (not bound_only or bool(pod.bound_to))

        if any(live(self.pods.get(pod_key)) for pod_key in self.consumers.get(claim.key, ())):
            return True
        for owner_uid, _ in claim.owners:
            owner_key = self.pods_by_uid.get(owner_uid)
            if owner_key and live(self.pods.get(owner_key)):
                return True
        return False

    def repair_overcommit(self, claim: ClaimView) -> Outcome | None:
        """Act on an observed allocation that overcommits a GPU (None when nothing is wrong).

        It should never happen (allocations are written with resourceVersion guards and fenced),
        but another allocator, a bug or a hand-written status can cause it. Reported as an error
        log, a metric and a Warning event; repaired by deallocating the newest claim on the card
        that carries our finalizer and whose pods have not started (each still gated, or none
        reserved), so that pod is placed again; a card whose users have all started is reported only.
        """
        for use in claim.uses:
            problems, uids = self.ledger.overcommit(use.device)
            if not problems:
                continue
            where = str(use.device)
            by_uid = {c.uid: c for c in self.claims.values()}
            candidates = [
                by_uid[uid]
                for uid in uids
                if uid in by_uid
                and by_uid[uid].ours
                and self._unstarted(by_uid[uid])
                and not self.assumed.writing(by_uid[uid].key)
            ]
            if not candidates:
                log.error(
                    "GPU %s overcommitted (%s) by started or foreign claims; not repaired", where, problems
                )
                self.metrics.overcommits.labels("reported").inc()
                return Outcome.REPORTED
            victim = max(candidates, key=lambda c: (c.created, c.key))
            log.error("GPU %s overcommitted (%s); deallocating the newest unstarted claim %s", where,
                      "; ".join(problems), victim.key)  # fmt: skip
            try:
                self._deallocate(victim)
            except KubeError as err:
                log.warning("claim %s: overcommit repair failed: %s; retried", victim.key, err)
                return Outcome.RETRY
            self.metrics.overcommits.labels("deallocated").inc()
            message = f"GPU {where} was overcommitted ({'; '.join(problems)}): claim {victim.key} deallocated"
            # On the claim always (its pods may not be known yet: watches of different resources
            # are not ordered), and on each pod that refers to it.
            self._event(victim, "Warning", "GpuOvercommitted", message)
            for pod_key in sorted(self.consumers.get(victim.key, ())):
                pod = self.pods.get(pod_key)
                if pod is not None:
                    self._event(pod, "Warning", "GpuOvercommitted", message)
            return Outcome.DEALLOCATED
        return None

    def _unstarted(self, claim: ClaimView) -> bool:
        """No pod the claim is reserved for can run or be bound: each is one we know that still
        carries our gate (we reserve with the allocation, before the gate is lifted)."""
        for uid in claim.reserved_uids:
            pod_key = self.pods_by_uid.get(uid)
            pod = self.pods.get(pod_key) if pod_key else None
            if pod is None or not pod.gated:
                return False
        return True

    def _deallocate(self, claim: ClaimView) -> ClaimView:
        """Clear the claim's allocation (UpdateStatus with its resourceVersion); returns what was written."""
        cleared = copy.deepcopy(dict(claim))
        cleared.setdefault("status", {}).pop("allocation", None)
        cleared["status"].pop("devices", None)
        written = self.kube.update(RESOURCE_CLAIMS, cleared, status=True)
        self.metrics.deallocations.inc()
        return self.assumed.wrote(written)

    def reconcile_claim(self, claim: ClaimView) -> Outcome:
        """Release a claim of ours that nobody uses; returns what it did."""
        if not claim.ours:
            return Outcome.SKIP
        if claim.reserved:
            return Outcome.IN_USE
        if not claim.deleting and self.live_consumers(claim):
            return Outcome.IN_USE

        def release(raw: Obj) -> Outcome:
            current = self.claim_view(raw)
            if current.reserved:
                return Outcome.IN_USE
            if current.allocation:
                current = self._deallocate(current)
            released = copy.deepcopy(dict(current))
            released["metadata"]["finalizers"] = [item for item in current.finalizers if item != FINALIZER]
            self.assumed.wrote(self.kube.update(RESOURCE_CLAIMS, released))
            log.info("claim %s released", claim.key)
            return Outcome.RELEASED

        try:
            return retry_on_conflict(
                release, dict(claim), lambda: self._read_claim(claim), on_conflict=self._conflict
            )
        except KubeError as err:
            if err.not_found:
                return Outcome.GONE
            if not err.conflict:
                raise
            return Outcome.RETRY
