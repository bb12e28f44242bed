"""The allocator: one pod and the cluster cache -> the allocations to write, or why it waits.

Like kube-scheduler's structured allocator (``Allocate(node, claims) -> results``, persisted by its
caller), this module makes no API call and changes no state: ``Allocator.allocate`` reads the
cache (claims, classes, nodes, the ledger, quotas) and returns an outcome; the worker
(``dra_driver/controller/controller.py``) assumes a ``Placed`` outcome's uses in the cache and
hands its writes to the binder, or has the binder report an ``Unschedulable`` one. Its tests need
no fake API (tests/controller/test_allocator.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.config.resolve import PLAN_ANNOTATIONS
from dra_driver.contract import DeviceId, policy_taint_key
from dra_driver.controller.allocation import build_allocation, rfc3339_now
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.containers import GPU_LIMITS_CONFLICT, claim_facts, limits_conflict
from dra_driver.controller.decision_record import decision_annotation, encode, request_record
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.hami_annotation import ANNOTATION as HAMI_ALLOCATED_ANNOTATION
from dra_driver.controller.hami_annotation import encode_devices_allocated
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.nodefit import NodeFitIndex, node_fit_problem
from dra_driver.controller.planner import PlanDecision, PlanInput, Planner, PodPlan
from dra_driver.controller.reasons import Reason
from dra_driver.engine import Decision, GpuCard
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import AllocationResult, allocation_results
from dra_driver.resource.requests import RequestError, claim_requests
from dra_driver.resource.uses import Use, uses_of

log = logging.getLogger("dra_driver.controller")
#: The pending reason of a pod that fits no node's free capacity (the others: quota, config, ...).
UNSCHEDULABLE = Reason.UNSCHEDULABLE
#: ``fit_problem`` of a node that publishes devices but has no Node object (yet, or any more).
NODE_NOT_FOUND = "NodeNotFound"
#: ``fit_problem`` of a node without a complete pool of our devices.
NO_DEVICES = "NoDevices"


@dataclass(frozen=True, slots=True)
class NotCandidate:
    """Nothing for us to do: bound, ended, being deleted, or not held by our gate."""


@dataclass(frozen=True, slots=True)
class WaitingForClaim:
    """A template claim does not exist yet: its creation wakes the pod up."""


@dataclass(frozen=True, slots=True)
class ClaimBusy:
    """A claim of the pod (shared with another pod) is being written: plan again next pass."""


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """The pod cannot be placed now: ``reason`` (the condition's) and ``message`` (one line).

    ``quiet``: a retry on a few nodes only that did not fit; the pod keeps the explanation of its
    last full evaluation, so nothing is reported.
    """

    reason: Reason
    message: str
    quiet: bool = False
    #: Warnings about the pod's input (an unknown policy name), each reported once as an event.
    warnings: tuple[str, ...] = ()
    #: The planner's decisions, card by card, when it got that far (a quota refusal comes after
    #: a placement was found; a pod that fits no node has none).
    decisions: tuple[PlanDecision, ...] = ()


@dataclass(slots=True)
class ClaimWrite:
    """One claim's allocation to write, and the uses it takes (assumed while it is written)."""

    claim: ClaimView
    allocation: dict[str, Any]
    #: The allocation's results, read as every reader of a written claim reads them.
    results: tuple[AllocationResult, ...]
    uses: tuple[Use, ...]


@dataclass(slots=True)
class Placed:
    """Allocations to write for the pod (none when every claim is allocated already), then its
    gate to lift with ``annotations`` (HAMi's view of the placement and our decision record)."""

    pod: PodView
    writes: list[ClaimWrite]
    annotations: dict[str, str] = field(default_factory=dict)
    #: Warnings about the pod's input (an unknown policy name), each reported once as an event.
    warnings: tuple[str, ...] = ()
    #: The planner's decisions, card by card (recorded on the pod in ``annotations`` too).
    decisions: tuple[PlanDecision, ...] = ()
    #: Write the allocations only and keep the gate: a gang member's first phase, whose gate is
    #: lifted once every member's allocations are written (dra_driver/controller/gangs.py).
    hold_gate: bool = False


AllocateOutcome = NotCandidate | WaitingForClaim | ClaimBusy | Unschedulable | Placed


@dataclass(slots=True)
class _ClaimsRead:
    """A pod's claims as the planner takes them: the unallocated ones' requests of our classes,
    each claim's request -> class (for its allocation), and the node its allocated claims pin."""

    inputs: list[PlanInput] = field(default_factory=list)
    classes_of: dict[str, dict[str, str]] = field(default_factory=dict)
    pinned_node: str | None = None


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
        device = card.device or name(card.node, card.index)
        cards.append(f"{card.node}/{device}={card.score:.6f}{mark}{state}")
    placement = decision.placement
    outcome = (
        f"-> {placement.node} " + ",".join(name(placement.node, share.index) for share in placement.devices)
        if placement is not None
        else f"-> pending: {decision.reason}"
    )
    return f"{subject}: {config} {outcome}; scores: {' '.join(cards) or '-'}"


class Allocator:
    """Plans pods on the cache's state; pure apart from logs and metrics."""

    def __init__(
        self,
        cache: ClusterCache,
        defaults: ControllerDefaults,
        metrics: ControllerMetrics,
        *,
        policy_taint: str | None = None,
    ) -> None:
        self.cache = cache
        self.driver = cache.driver
        self.metrics = metrics
        self.matcher = Matcher(self.driver, policy_taint or policy_taint_key(self.driver))
        self.planner = Planner(cache.ledger, self.matcher, self.driver, defaults, cache.classes.get)
        self.node_fits = NodeFitIndex(lambda: cache.nodes, self._fits, self._fit_changes, self._fit_position)
        #: The ledger's holds a pod may take (``nomination.Nominations.hidden_for``: those of lower
        #: priority than the pod, and its own); none without preemption.
        self.hidden_holds: Callable[[PodView], frozenset[str]] = lambda _pod: frozenset()

    def is_candidate(self, pod: PodView) -> bool:
        """Ours to place: gated by us, or ungated with an unallocated claim of ours: its allocation
        was cleared by kube-scheduler's PostFilter (our finalizer stays on the claim), or the pod
        got past the webhook (admitted with another driver's claim that was then swapped for one
        of ours, or created during a webhook outage with failurePolicy Ignore). kube-scheduler
        never allocates such a claim (the scheduler fence on our classes), so nobody else would."""
        if pod.bound_to or not pod.active or pod.deleting:
            return False
        if pod.gated:
            return True
        return not pod.other_gates and any(
            claim is not None and not claim.allocation and (claim.ours or self._of_our_classes(claim))
            for _, claim in self.cache.pod_claims(pod)
        )

    def _of_our_classes(self, claim: ClaimView) -> bool:
        return any(self.cache.is_ours(name) for name in claim.request_classes.values())

    def allowed_nodes(self, pod: PodView, among: frozenset[str] | None = None) -> frozenset[str]:
        """Nodes (of ``among``, default all) where the pod itself may run: selectors, affinity,
        taints, CPU/memory/pods left, and a pool of ours. All nodes come from the node fit index
        (only what changed since is looked at again); a few nodes are looked at directly."""
        if among is None:
            return self.node_fits.allowed(pod)
        return frozenset(name for name in among if self._fits(pod, name))

    def _fits(self, pod: PodView, name: str) -> bool:
        return self.fit_problem(pod, name) is None

    def fit_problem(self, pod: PodView, name: str) -> str | None:
        """Why the pod itself cannot run on node ``name`` (``node_fit_problem``'s reason, or
        ``NoDevices``/``NodeNotFound`` for a node without devices of ours or without its Node
        object), or None where it can."""
        cache = self.cache
        node = cache.nodes.get(name)
        if node is None:
            return NODE_NOT_FOUND
        if name not in cache.ledger.inventory:
            return NO_DEVICES
        bound = cache.bound_requests().get(name, {}) if any(a > 0 for a in pod.requests.values()) else {}
        return node_fit_problem(pod, node, bound)

    def _fit_position(self) -> tuple[int, ...]:
        return (self.cache.node_log.position, self.cache.ledger.inventory_log.position)

    def _fit_changes(self, position: tuple[int, ...]) -> set[str] | None:
        nodes = self.cache.node_log.since(position[0])
        devices = self.cache.ledger.inventory_log.since(position[1])
        return None if nodes is None or devices is None else nodes | devices

    def pending_shape(self, pod: PodView) -> str | None:
        """A key equal for pods that get the same plan on the same state, or None when unsure.

        Pods of one Deployment or Job differ only in names: their claims (from one template) ask
        for the same devices and their specs place them alike. When one of them stays pending
        after a release, so does every later one of its shape in that pass (capacity only shrinks
        within a pass), which lets the worker skip them (``dra_driver/controller/requeue.py``).
        A pod with an allocated or missing claim is never grouped (its plan depends on it alone).
        """
        claims = []
        for _, claim in self.cache.pod_claims(pod):
            if claim is None or claim.allocation:
                return None
            claims.append(claim.spec)
        ours = {key: pod.annotations[key] for key in PLAN_ANNOTATIONS if key in pod.annotations}
        return json.dumps([pod.namespace, ours, pod.placement_spec, claims], sort_keys=True, default=str)

    def allocate(
        self, pod: PodView, only_nodes: frozenset[str] | None = None, *, quiet: bool = False
    ) -> AllocateOutcome:
        """What the pod needs: the allocations to write, or why not.

        ``quiet``: the plan is not logged (a what-if: a gang's preemption tries many).

        ``only_nodes``: plan on these nodes only, for a pod that did not fit anywhere and since
        then capacity was freed on just these nodes; if it still does not fit there, the outcome
        is a quiet ``Unschedulable`` (the pod keeps its last full explanation).

        In order: the pod must be ours (``is_candidate``) with every claim there and none being
        written; its claims are read into planner inputs (``_read_claims``); its containers must be
        able to enforce its limited claims; the planner places it; its namespace's quotas must
        take the placement. Every refusal says why, with the planner's decisions where there are
        some (``hami-dra explain`` shows them card by card).
        """
        if not self.is_candidate(pod):
            return NotCandidate()
        claims = self.cache.pod_claims(pod)
        waiting = self._not_ready(claims)
        if waiting is not None:
            return waiting
        read = self._read_claims(claims)
        if isinstance(read, Unschedulable):
            return read
        facts = [claim_facts(name, c, pod.uid, self.cache.is_ours) for name, c in claims if c is not None]
        conflict = limits_conflict(pod, facts)
        if conflict is not None:
            return Unschedulable(GPU_LIMITS_CONFLICT, conflict)
        if not read.inputs:
            return Placed(pod, [])
        plan = self._plan(pod, read, only_nodes)
        decisions = tuple(plan.decisions)
        if plan.reason is not None or plan.node is None:
            message = plan.reason or "does not fit"
            if only_nodes is not None:
                return Unschedulable(UNSCHEDULABLE, message, quiet=True, decisions=decisions)
            if not quiet:
                self._log_plan(pod, plan)
            return Unschedulable(UNSCHEDULABLE, message, warnings=tuple(plan.warnings), decisions=decisions)
        if not quiet:
            self._log_plan(pod, plan)
        writes = self._writes(plan, plan.node, read.classes_of)
        charges = [self.cache.ledger.charge(use) for write in writes for use in write.uses]
        breach = self.cache.quotas.check(pod.namespace, charges)
        if breach is not None:
            return Unschedulable(Reason.QUOTA_EXCEEDED, breach.message, decisions=decisions)
        annotations = self._hami_annotations(pod, claims, writes, plan.node)
        records = [request_record(s, d, c, self.cache.ledger.device_name) for s, d, c in decisions]
        annotations[decision_annotation(self.driver)] = encode(records, rfc3339_now())
        return Placed(pod, writes, annotations, tuple(plan.warnings), decisions)

    def _not_ready(
        self, claims: Sequence[tuple[str, ClaimView | None]]
    ) -> WaitingForClaim | ClaimBusy | None:
        """Why the pod's claims cannot be planned yet: one does not exist, or one (shared with
        another pod) is being written; planning it again would replace that assumed use in the
        ledger while the other write may still win."""
        if any(claim is None for _, claim in claims):
            return WaitingForClaim()
        if any(claim is not None and self.cache.assumed.writing(claim.key) for _, claim in claims):
            return ClaimBusy()
        return None

    def _read_claims(self, claims: Sequence[tuple[str, ClaimView | None]]) -> _ClaimsRead | Unschedulable:
        """The pod's unallocated claims as planner inputs, and the node its allocated ones pin;
        or why a claim cannot be planned (a class missing, a bad request, another driver's
        requests mixed in, allocated claims on different nodes)."""
        read = _ClaimsRead()
        pinned: set[str] = set()
        seen: set[str] = set()
        for _, claim in claims:
            assert claim is not None
            if claim.key in seen:
                continue  # two pod entries may name one ResourceClaim: it gets one allocation
            seen.add(claim.key)
            if claim.allocation:
                if claim.pinned_node is not None:
                    pinned.add(claim.pinned_node)
                continue
            refusal = self._read_claim(claim, read)
            if refusal is not None:
                return refusal
        if len(pinned) > 1:
            return Unschedulable(
                Reason.NODE_CONFLICT, f"claims are allocated on different nodes: {sorted(pinned)}"
            )
        read.pinned_node = next(iter(pinned), None)
        return read

    def _read_claim(self, claim: ClaimView, read: _ClaimsRead) -> Unschedulable | None:
        """Add one unallocated claim's requests of our classes to ``read``, or say why not."""
        missing = sorted(set(claim.request_classes.values()) - set(self.cache.classes))
        if missing:
            # Keep the gate: once the class exists it may be ours, and an ungated pod would be
            # allocated first-fit by kube-scheduler.
            return Unschedulable(
                Reason.DEVICE_CLASS_NOT_FOUND,
                f"claim {claim.key}: DeviceClass {', '.join(missing)} not found",
            )
        try:
            requests, foreign = claim_requests(claim, self.cache.is_ours)
        except RequestError as err:
            return Unschedulable(Reason.INVALID_REQUEST, f"claim {claim.key}: {err}")
        if not requests:
            return None
        if foreign:
            message = (
                f"claim {claim.key} mixes requests of other drivers ({', '.join(foreign)}) with ours; "
                "put them in separate claims"
            )
            return Unschedulable(Reason.MIXED_CLAIM, message)
        read.inputs.append(PlanInput(claim, requests))
        read.classes_of[claim.key] = dict(claim.request_classes)
        return None

    def plan_on(self, pod: PodView, node: str) -> list[ClaimWrite] | Unschedulable:
        """The allocations the pod would get on ``node`` alone as the ledger stands (a preemption's
        what-if, under ``Ledger.hiding``), its namespace's quotas checked; or why not. No log, no
        metric, nothing assumed; the caller hides whatever holds apply."""
        claims = self.cache.pod_claims(pod)
        if self._not_ready(claims) is not None:
            return Unschedulable(UNSCHEDULABLE, "its claims are not ready", quiet=True)
        read = self._read_claims(claims)
        if isinstance(read, Unschedulable):
            return read
        allowed = self.allowed_nodes(pod, frozenset({node}))
        plan = self.planner.plan(pod, read.inputs, allowed, read.pinned_node)
        if plan.reason is not None or plan.node is None:
            return Unschedulable(UNSCHEDULABLE, plan.reason or "does not fit", quiet=True)
        writes = self._writes(plan, plan.node, read.classes_of)
        charges = [self.cache.ledger.charge(use) for write in writes for use in write.uses]
        breach = self.cache.quotas.check(pod.namespace, charges)
        if breach is not None:
            return Unschedulable(Reason.QUOTA_EXCEEDED, breach.message, quiet=True)
        return writes

    def _plan(self, pod: PodView, read: _ClaimsRead, only_nodes: frozenset[str] | None) -> PodPlan:
        started = time.perf_counter()
        with self.cache.ledger.hiding(self.hidden_holds(pod)):
            plan = self.planner.plan(pod, read.inputs, self.allowed_nodes(pod, only_nodes), read.pinned_node)
        self.metrics.latency.observe(time.perf_counter() - started)
        return plan

    def _writes(
        self, plan: PodPlan, node: str, classes_of: Mapping[str, Mapping[str, str]]
    ) -> list[ClaimWrite]:
        """Each planned claim's allocation and the uses it takes. The uses the ledger will count
        once the informer shows the written claim are derived by the same function from the same
        allocation: what is assumed is what gets written."""
        writes = []
        for claim_plan in plan.claims:
            claim = claim_plan.claim
            allocation = build_allocation(claim_plan, node, self.cache.classes.get, classes_of[claim.key])
            results = allocation_results(allocation)
            uses = uses_of(results, self.driver, claim.namespace, claim.request_classes)
            writes.append(ClaimWrite(claim, allocation, results, uses))
        return writes

    def _log_plan(self, pod: PodView, plan: PodPlan) -> None:
        for subject, decision, config in plan.decisions:
            log.info(
                "pod %s %s",
                pod.key,
                format_decision(subject, decision, config, self.cache.ledger.device_name),
            )

    def _hami_annotations(
        self,
        pod: PodView,
        claims: Sequence[tuple[str, ClaimView | None]],
        writes: Sequence[ClaimWrite],
        node: str,
    ) -> dict[str, str]:
        """HAMi's view of the placement (controller/hami_annotation.py), from the new allocations.

        Every claim of the pod is allocated on ``node`` (the plan's, which pinned claims share), so
        its cards are looked up in that node's inventory only.
        """
        new = {write.claim.key: write.results for write in writes}
        allocated = {name: new.get(claim.key, claim.results) for name, claim in claims if claim is not None}
        inventory = self.cache.ledger.inventory.get(node)

        def card_of(device_id: DeviceId) -> GpuCard | None:
            if inventory is None:
                return None
            device = inventory.devices.get(device_id) or inventory.mig.get(device_id)  # a MIG instance
            return device.card if device is not None else None

        value = encode_devices_allocated(pod, allocated, self.driver, card_of)
        return {} if value is None else {HAMI_ALLOCATED_ANNOTATION: value}
