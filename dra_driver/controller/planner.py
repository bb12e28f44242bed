"""Plan a pod's allocations: every request of every claim, one node, through the engine.

The first request picks the node (the engine ranks nodes by the node policy and cards by the
chain); the pod's other requests must fit on that node, placed one after the other with the
earlier ones recorded, so two requests of one pod never take the same share twice. If a later
request does not fit there, the node is excluded and the whole pod is planned again. Claims of
the pod that are already allocated pin the node. Nothing is written here, and the ledger is only
tried on (a ``Ledger.trial`` undone after each attempt): the allocator turns the plan into
allocations (dra_driver/controller/allocator.py), the worker assumes them in the cache while the
binder writes them (dra_driver/controller/assumed.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from dra_driver.cel import CostBudget
from dra_driver.config import ConfigError, ControllerDefaults, resolve_config
from dra_driver.config.resolve import ResolvedConfig, driver_configs
from dra_driver.contract import DeviceId
from dra_driver.controller.eligibility import Eligible, Matcher
from dra_driver.controller.ledger import Ledger, Trial
from dra_driver.controller.mig_plan import check_mig_request, mig_request
from dra_driver.engine import Decision, DeviceShare, PlacementRequest, place
from dra_driver.engine.mig import place_mig
from dra_driver.kube.api import ObjView
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.requests import ClaimRequest, RequestError, RequestSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResultPlan:
    """One allocated device of one request."""

    request: str
    device: DeviceId
    node: str
    share: DeviceShare
    admin_access: bool
    tolerations: tuple[ObjView, ...]
    #: The device is the result's alone (a MIG instance): no shareID, no consumedCapacity.
    whole_device: bool = False


@dataclass(slots=True)
class ClaimPlan:
    claim: ClaimView
    results: list[ResultPlan] = field(default_factory=list)


class PlanDecision(NamedTuple):
    """The engine's decision for one request, with what it was about and the config it used."""

    subject: str  # "claim NS/NAME request REQ"
    decision: Decision
    config: str  # ``ResolvedConfig.describe()``: the policies and where each came from


@dataclass(slots=True)
class PodPlan:
    node: str | None
    claims: list[ClaimPlan]
    reason: str | None = None  # why the pod cannot be placed (None: planned)
    decisions: list[PlanDecision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PlanInput:
    """A claim to allocate with its requests resolved to our classes."""

    claim: ClaimView
    requests: list[ClaimRequest]


@dataclass(frozen=True, slots=True)
class _NoFit:
    """Why a request (or one of its alternatives) fits nowhere it may go."""

    reason: str


@dataclass(frozen=True, slots=True)
class _Asked:
    """One request of one claim being placed: the claim's plan it adds to, and what the request's
    alternatives are read against (the nodes left to it, its claim's config and budget, the pod's
    annotations)."""

    claim_plan: ClaimPlan
    subject: str  # "claim NS/NAME"
    allowed: frozenset[str]
    annotations: Mapping[str, str]
    budget: CostBudget  # what the claim's selectors may cost in this plan, all requests together

    @property
    def claim_config(self) -> Sequence[ObjView]:
        return self.claim_plan.claim.config


class Planner:
    def __init__(
        self,
        ledger: Ledger,
        matcher: Matcher,
        driver: str,
        defaults: ControllerDefaults,
        device_class: Callable[[str], DeviceClassView | None],
    ) -> None:
        self.ledger = ledger
        self.matcher = matcher
        self.driver = driver
        self.defaults = defaults
        self.device_class = device_class

    def plan(
        self,
        pod: PodView,
        inputs: list[PlanInput],
        allowed_nodes: frozenset[str],
        pinned_node: str | None,
    ) -> PodPlan:
        """Place every request of ``inputs`` on one node of ``allowed_nodes`` (``pinned_node``
        only, when set): a node where a later request does not fit is excluded and the pod is
        planned again on the others; a wrong claim (CEL error, invalid config) ends the plan."""
        candidates = allowed_nodes if pinned_node is None else allowed_nodes & {pinned_node}
        if not candidates:
            if pinned_node is None:
                return PodPlan(None, [], reason="no node can run the pod")
            return PodPlan(
                None, [], reason=f"claims already allocated on node {pinned_node}, where the pod cannot run"
            )
        excluded: set[str] = set()
        while True:
            plan = PodPlan(None, [ClaimPlan(item.claim) for item in inputs])
            left = frozenset(candidates - excluded)
            try:
                with self.ledger.trial() as trial:
                    node, reason = self._try(plan, inputs, left, pod.annotations, trial)
            except (RequestError, ConfigError) as err:
                # The claim itself is wrong (CEL error, invalid config): no other node would help.
                plan.claims, plan.reason = [], str(err)
                return plan
            if reason is None:
                plan.node = node
                return plan
            if node is None or left == {node}:
                # The first request fits on no node left, or a later one not on the last node.
                plan.claims, plan.reason = [], reason
                return plan
            excluded.add(node)

    def _try(
        self,
        plan: PodPlan,
        inputs: list[PlanInput],
        candidates: frozenset[str],
        annotations: Mapping[str, str],
        trial: Trial,
    ) -> tuple[str | None, str | None]:
        """One attempt on ``candidates``: (the node the first request chose, why the pod does not
        fit there, or None when every request and constraint does)."""
        node: str | None = None
        for claim_plan, item in zip(plan.claims, inputs, strict=True):
            subject = f"claim {item.claim.key}"
            budget = CostBudget()
            for request in item.requests:
                allowed = candidates if node is None else frozenset({node})
                asked = _Asked(claim_plan, subject, allowed, annotations, budget)
                placed = self._place_request(plan, request, asked, trial)
                if isinstance(placed, _NoFit):
                    return node, f"{subject} request {request.name}: {placed.reason}"
                node = placed
            problem = self._constraint_problem(item.claim, claim_plan)
            if problem is not None:
                return node, f"{subject}: {problem}"
        return node, None

    def _constraint_problem(self, claim: ClaimView, claim_plan: ClaimPlan) -> str | None:
        """Check ``spec.devices.constraints`` on the policy's choice (they do not steer the choice).

        The engine ranks by policy; a claim constraint (``matchAttribute``/``distinctAttribute``)
        is verified afterwards and a violation keeps the pod pending with a clear reason.
        """
        for position, constraint in enumerate(claim.constraints):
            if constraint is None:
                continue
            values = [
                self._attribute(result.device, constraint.attribute)
                for result in claim_plan.results
                if constraint.covers(result.request)
            ]
            if constraint.distinct:
                if len(set(values)) != len(values):
                    repeated = constraint.attribute
                    return f"constraint #{position}: the devices chosen by the policy repeat {repeated}"
            elif None in values or len(set(values)) > 1:
                return (
                    f"constraint #{position}: the devices chosen by the policy do not share "
                    f"{constraint.attribute} ({values}); use numaBind or a selector instead"
                )
        return None

    def _attribute(self, device_id: DeviceId, attribute: str) -> object:
        device = self.ledger.device(device_id)
        return None if device is None else device.attributes.get(attribute)

    def _place_request(
        self, plan: PodPlan, request: ClaimRequest, asked: _Asked, trial: Trial
    ) -> str | _NoFit:
        """Place the first of the request's alternatives that fits: its node, or why none did
        (each alternative's reason)."""
        reasons = []
        for spec in request.alternatives:
            placed = self._place_alternative(plan, spec, asked, trial)
            if not isinstance(placed, _NoFit):
                return placed
            reasons.append(placed.reason)
        return _NoFit("; ".join(reasons) or "does not fit")

    def _place_alternative(
        self, plan: PodPlan, spec: RequestSpec, asked: _Asked, trial: Trial
    ) -> str | _NoFit:
        """One alternative: its class, the devices its selectors accept on the allowed nodes, its
        config, then the engine's choice (or the first devices, for admin access)."""
        device_class = self.device_class(spec.class_name)
        if device_class is None:
            return _NoFit(f"DeviceClass {spec.class_name} not found")
        ledger = self.ledger
        eligible = self.matcher.eligible(
            spec,
            device_class,
            asked.subject,
            ledger.inventory,
            ledger.inventory_generation,
            asked.budget,
            changed_since=ledger.inventory_log.since,
            mig=device_class.mig,
        )
        nodes = asked.allowed & eligible.nodes
        if not nodes:
            return _NoFit(_no_device_reason(spec, eligible, asked.allowed))
        resolved = self._resolve(plan, spec, device_class, asked)
        if spec.admin_access:
            return _place_admin(spec, eligible, nodes, asked.claim_plan)
        if device_class.mig:
            check_mig_request(spec, asked.subject)
        decision = self._decide(spec, eligible, nodes, resolved, mig=device_class.mig)
        subject = f"{asked.subject} request {spec.name}"
        plan.decisions.append(PlanDecision(subject, decision, resolved.describe()))
        if decision.placement is None:
            return _NoFit(decision.reason or "does not fit")
        placement = decision.placement
        if device_class.mig:
            trial.allocate_mig(placement)
        else:
            trial.allocate(placement)
        inventory = self.ledger.inventory[placement.node]
        for share in placement.devices:
            device = inventory.device_at(share.index)
            asked.claim_plan.results.append(
                ResultPlan(
                    spec.name, device.id, placement.node, share, False, spec.tolerations, device_class.mig
                )
            )
        return placement.node

    def _resolve(
        self, plan: PodPlan, spec: RequestSpec, device_class: DeviceClassView, asked: _Asked
    ) -> ResolvedConfig:
        """The request's config from its class, its claim and the pod's annotations; what was
        ignored in them becomes a warning on the plan."""
        class_configs = driver_configs(
            device_class.config, driver=self.driver, request=None, where=f"DeviceClass {spec.class_name}"
        )
        claim_configs = driver_configs(
            asked.claim_config, driver=self.driver, request=spec.name, where=asked.subject
        )
        resolved = resolve_config(
            class_configs=class_configs,
            claim_configs=claim_configs,
            annotations=asked.annotations,
            defaults=self.defaults,
        )
        if resolved.unknown_policies:
            plan.warnings.append(
                f"{asked.subject}: unknown policy name(s) ignored: {', '.join(resolved.unknown_policies)}"
            )
        plan.warnings.extend(f"{asked.subject}: {ignored}" for ignored in resolved.ignored_annotations)
        return resolved

    def _decide(
        self,
        spec: RequestSpec,
        eligible: Eligible,
        nodes: frozenset[str],
        resolved: ResolvedConfig,
        *,
        mig: bool = False,
    ) -> Decision:
        """The engine's decision on ``nodes`` (among MIG instances for a MIG class); for
        allocationMode All, on the first node (by name) where every matching device fits."""

        def decide(count: int, allowed: frozenset[str]) -> Decision:
            if mig:
                return place_mig(self.ledger.mig_state, mig_request(spec, eligible, resolved, count, allowed))
            return place(self.ledger.state, placement_request(spec, eligible, resolved, count, allowed))

        if not spec.all_devices:
            return decide(spec.count, nodes)
        decision: Decision | None = None
        for node in sorted(nodes):  # allocationMode All: every matching device of one node
            decision = decide(len(eligible.per_node.get(node, ())), frozenset({node}))
            if decision.placement is not None:
                return decision
        assert decision is not None
        return decision


def _place_admin(
    spec: RequestSpec, eligible: Eligible, nodes: frozenset[str], claim_plan: ClaimPlan
) -> str | _NoFit:
    """Admin access takes no capacity: the first node (by name) with enough matching devices,
    those devices (every one of them for allocationMode All)."""
    for node in sorted(nodes):
        devices = eligible.per_node.get(node, ())
        chosen = devices if spec.all_devices else devices[: spec.count]
        if not chosen or (len(chosen) < spec.count and not spec.all_devices):
            continue
        for device in chosen:
            share = DeviceShare(device.card.index, 0, 0, 0)
            claim_plan.results.append(ResultPlan(spec.name, device.id, node, share, True, spec.tolerations))
        return node
    return _NoFit(f"not enough devices for admin access request {spec.name}")


def placement_request(
    spec: RequestSpec, eligible: Eligible, resolved: ResolvedConfig, count: int, allowed: frozenset[str]
) -> PlacementRequest:
    """The engine's request for ``count`` devices of ``spec`` on ``allowed`` with ``resolved``."""
    return PlacementRequest(
        name=spec.name,
        count=count,
        memory=spec.memory,
        # HAMi's gpumem-percentage: per card, only where the request names no memory.
        memory_percent=resolved.memory_percent if spec.memory is None else None,
        cores=spec.cores,
        policy=resolved.policy,
        node_policy=resolved.node_policy,
        weights=resolved.weights,
        numa_bind=resolved.numa_bind,
        include_products=resolved.card_filter.include_products,
        exclude_products=resolved.card_filter.exclude_products,
        include_uuids=resolved.card_filter.include_uuids,
        exclude_uuids=resolved.card_filter.exclude_uuids,
        allowed_devices=eligible.devices,
        allowed_nodes=allowed,
        unenforced_shares=resolved.unenforced_shares,
    )


def _no_device_reason(spec: RequestSpec, eligible: Eligible, allowed: frozenset[str]) -> str:
    """Why no device of an allowed node takes the request, naming the tainted devices the
    selectors chose (an unhealthy GPU, say)."""
    tainted = [
        f"{device} ({', '.join(keys)})"
        for device, keys in sorted(eligible.tainted.items())
        if device.partition("/")[0] in allowed
    ]
    return (
        f"no device of class {spec.class_name} matches the selectors (and tolerates the taints) "
        "on a node the pod can run on" + (f"; tainted: {', '.join(tainted[:8])}" if tainted else "")
    )
