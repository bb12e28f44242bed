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
from typing import Any

from dra_driver.cel import CostBudget
from dra_driver.config import ConfigError, ControllerDefaults, resolve_config
from dra_driver.config.resolve import driver_configs
from dra_driver.contract import DeviceId
from dra_driver.controller.eligibility import Eligible, Matcher
from dra_driver.controller.ledger import Ledger, Trial
from dra_driver.engine import Decision, DeviceShare, Placement, PlacementRequest, place
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


@dataclass(slots=True)
class ClaimPlan:
    claim: ClaimView
    results: list[ResultPlan] = field(default_factory=list)


@dataclass(slots=True)
class PodPlan:
    node: str | None
    claims: list[ClaimPlan]
    reason: str | None = None  # why the pod cannot be placed (None: planned)
    decisions: list[tuple[str, Decision, str]] = field(default_factory=list)  # (subject, decision, config)
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PlanInput:
    """A claim to allocate with its requests resolved to our classes."""

    claim: ClaimView
    requests: list[ClaimRequest]


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
        annotations = pod.annotations
        candidates = allowed_nodes if pinned_node is None else allowed_nodes & {pinned_node}
        if pinned_node is not None and not candidates:
            return PodPlan(
                None, [], reason=f"claims already allocated on node {pinned_node}, where the pod cannot run"
            )
        excluded: set[str] = set()
        last_reason = "no node can run the pod" if not candidates else None
        plan = PodPlan(None, [])
        while candidates - excluded:
            plan = PodPlan(None, [ClaimPlan(item.claim) for item in inputs])
            try:
                with self.ledger.trial() as trial:
                    node, reason = self._try(
                        plan, inputs, frozenset(candidates - excluded), annotations, trial
                    )
            except (RequestError, ConfigError) as err:
                # The claim itself is wrong (CEL error, invalid config): no other node would help.
                plan.claims, plan.reason = [], str(err)
                return plan
            if reason is None:
                plan.node = node
                return plan
            last_reason = reason
            if node is None:
                break  # the first request fits on no allowed node: nothing else to try
            excluded.add(node)
        plan.claims, plan.node, plan.reason = [], None, last_reason
        return plan

    def _try(
        self,
        plan: PodPlan,
        inputs: list[PlanInput],
        candidates: frozenset[str],
        annotations: Mapping[str, str],
        trial: Trial,
    ) -> tuple[str | None, str | None]:
        node: str | None = None
        for claim_plan, item in zip(plan.claims, inputs, strict=True):
            subject = f"claim {item.claim.key}"
            claim_config = item.claim.config
            budget = CostBudget()  # what this claim's selectors may cost in this plan, all requests
            for request in item.requests:
                allowed = candidates if node is None else frozenset({node})
                placed, reason = self._place_request(
                    plan, claim_plan, request, subject, claim_config, annotations, allowed, trial, budget
                )
                if placed is None:
                    return node, f"{subject} request {request.name}: {reason}"
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
        constraints = claim.constraints
        for position, constraint in enumerate(constraints):
            names = set(constraint.get("requests") or ())
            values = []
            for result in claim_plan.results:
                if names and result.request.split("/", 1)[0] not in names and result.request not in names:
                    continue
                device = self.ledger.device(result.device)
                attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
                values.append(None if device is None else device.attributes.get(str(attribute)))
            if constraint.get("matchAttribute") and (None in values or len(set(values)) > 1):
                return (
                    f"constraint #{position}: the devices chosen by the policy do not share "
                    f"{constraint['matchAttribute']} ({values}); use numaBind or a selector instead"
                )
            if constraint.get("distinctAttribute") and len(set(values)) != len(values):
                repeated = constraint["distinctAttribute"]
                return f"constraint #{position}: the devices chosen by the policy repeat {repeated}"
        return None

    def _place_request(
        self,
        plan: PodPlan,
        claim_plan: ClaimPlan,
        request: ClaimRequest,
        subject: str,
        claim_config: Sequence[ObjView],
        annotations: Mapping[str, str],
        allowed: frozenset[str],
        trial: Trial,
        budget: CostBudget,
    ) -> tuple[str | None, str]:
        reasons = []
        for spec in request.alternatives:
            device_class = self.device_class(spec.class_name)
            if device_class is None:
                reasons.append(f"DeviceClass {spec.class_name} not found")
                continue
            ledger = self.ledger
            eligible = self.matcher.eligible(
                spec,
                device_class,
                subject,
                ledger.inventory,
                ledger.inventory_generation,
                budget,
                changed_since=ledger.inventory_log.since,
            )
            nodes = allowed & eligible.nodes
            if not nodes:
                tainted = [
                    f"{device} ({', '.join(keys)})"
                    for device, keys in sorted(eligible.tainted.items())
                    if device.partition("/")[0] in allowed
                ]
                reasons.append(
                    f"no device of class {spec.class_name} matches the selectors (and tolerates the taints) "
                    "on a node the pod can run on"
                    + (f"; tainted: {', '.join(tainted[:8])}" if tainted else "")
                )
                continue
            class_configs = driver_configs(
                device_class.config,
                driver=self.driver,
                request=None,
                where=f"DeviceClass {spec.class_name}",
            )
            claim_configs = driver_configs(claim_config, driver=self.driver, request=spec.name, where=subject)
            resolved = resolve_config(
                class_configs=class_configs,
                claim_configs=claim_configs,
                annotations=annotations,
                defaults=self.defaults,
            )
            if resolved.unknown_policies:
                plan.warnings.append(
                    f"{subject}: unknown policy name(s) ignored: {', '.join(resolved.unknown_policies)}"
                )
            plan.warnings.extend(f"{subject}: {ignored}" for ignored in resolved.ignored_annotations)
            if spec.admin_access:
                result = self._admin(spec, eligible, nodes)
                if result is None:
                    reasons.append(f"not enough devices for admin access request {spec.name}")
                    continue
                node, devices = result
                for device in devices:
                    claim_plan.results.append(
                        ResultPlan(
                            spec.name,
                            device.id,
                            node,
                            DeviceShare(device.card.index, 0, 0, 0),
                            True,
                            spec.tolerations,
                        )
                    )
                return node, ""
            decision = self._decide(spec, eligible, nodes, resolved)
            plan.decisions.append((f"{subject} request {spec.name}", decision, resolved.describe()))
            if decision.placement is None:
                reasons.append(decision.reason or "does not fit")
                continue
            placement = decision.placement
            trial.allocate(placement)
            inventory = self.ledger.inventory[placement.node]
            for share in placement.devices:
                device = inventory.device_at(share.index)
                claim_plan.results.append(
                    ResultPlan(spec.name, device.id, placement.node, share, False, spec.tolerations)
                )
            return placement.node, ""
        return None, "; ".join(reasons) if len(reasons) > 1 else (reasons[0] if reasons else "does not fit")

    def _decide(
        self, spec: RequestSpec, eligible: Eligible, nodes: frozenset[str], resolved: Any
    ) -> Decision:
        def request(count: int, allowed: frozenset[str]) -> PlacementRequest:
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

        if not spec.all_devices:
            return place(self.ledger.state, request(spec.count, nodes))
        decision: Decision | None = None
        for node in sorted(nodes):  # allocationMode All: every matching device of one node
            count = len(eligible.per_node.get(node, ()))
            decision = place(self.ledger.state, request(count, frozenset({node})))
            if decision.placement is not None:
                return decision
        assert decision is not None
        return decision

    @staticmethod
    def _admin(spec: RequestSpec, eligible: Eligible, nodes: frozenset[str]) -> tuple[str, list[Any]] | None:
        for node in sorted(nodes):
            devices = list(eligible.per_node.get(node, ()))
            if spec.all_devices and devices:
                return node, devices
            if len(devices) >= spec.count:
                return node, devices[: spec.count]
        return None


def placement_of(results: list[ResultPlan]) -> Placement | None:
    if not results:
        return None
    return Placement(results[0].node, tuple(result.share for result in results if not result.admin_access))
