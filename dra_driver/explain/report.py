"""An explanation of one pod, built from cluster objects (no API calls here, so tests need none).

For a placed pod the explanation is the decision the controller recorded on it when it lifted
the gate (``dra_driver/controller/decision_record.py``): the scores it saw then, not scores
recomputed from today's cluster. For a pod still waiting it is the controller's pending reason and
a fresh evaluation of the pod against the cluster now, with the same planner the controller
runs (``dra_driver/controller/planner.py``) over the same parsed inventory and allocations, and
for each reason what would make a card fit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.contract import ALLOCATED_CONDITION as CONDITION_TYPE
from dra_driver.contract import policy_taint_key
from dra_driver.controller.decision_record import (
    RequestRecord,
    decision_annotation,
    decode,
    request_record,
)
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.planner import PlanInput, Planner
from dra_driver.engine import Reason
from dra_driver.explain.events import PodEvent, pod_warnings
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.requests import RequestError, claim_requests

#: What would let a card take the request, per reason.
FIXES: Mapping[str, str] = {
    Reason.CARD_NOT_HEALTH.value: "the GPU recovers (its node's plugin clears the unhealthy taint)",
    Reason.CARD_SHARES_NOT_ENFORCED.value: (
        "HAMi-core on that node (README 'Isolation'), a whole-card request, or a class with "
        "allowUnenforcedShares"
    ),
    Reason.CARD_WHOLE_ONLY.value: (
        "a whole-card request, or the card's compute mode back to Default (nvidia-smi -c DEFAULT): "
        "in Exclusive_Process or Prohibited no two tenants can use it"
    ),
    Reason.DEVICE_SELECTOR_MISMATCH.value: "a device that the claim's and class's CEL selectors accept",
    Reason.CARD_TYPE_MISMATCH.value: "a card of the product the pod's nvidia.com/use-gputype allows",
    Reason.CARD_UUID_MISMATCH.value: "a card of the UUIDs the pod's nvidia.com/use-gpuuuid allows",
    Reason.CARD_TIME_SLICING_EXHAUSTED.value: "a tenant leaves the card (all its slots are taken)",
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT.value: "the card's tenants leave (mutex or a whole card)",
    Reason.CARD_INSUFFICIENT_MEMORY.value: "less memory requested, or tenants free memory on the card",
    Reason.CARD_INSUFFICIENT_CORE.value: "fewer cores requested, or tenants free cores on the card",
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED.value: "a tenant with cores leaves the card",
    Reason.NUMA_NOT_FIT.value: "enough free cards on one NUMA node, or numaBind off",
}


@dataclass(frozen=True)
class ClaimLine:
    pod_claim: str
    claim: str | None
    devices: tuple[str, ...] = ()


@dataclass
class Explanation:
    pod: str
    state: str  # "allocated", "pending", "waiting" (no claim yet), "not ours"
    claims: list[ClaimLine] = field(default_factory=list)
    decided_at: str | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    #: The controller's pending reason and message, as on the pod's condition.
    pending: tuple[str, str] | None = None
    #: For a pending pod evaluated now: reason -> count of cards, and the fix.
    reasons: dict[str, int] = field(default_factory=dict)
    note: str = ""
    #: The pod's Warning events from kubelet and others (a placed pod that does not start).
    events: list[PodEvent] = field(default_factory=list)

    def fixes(self) -> list[tuple[str, int, str]]:
        return [(r, n, FIXES.get(r, "")) for r, n in sorted(self.reasons.items(), key=lambda x: -x[1])]

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "state": self.state,
            "claims": [
                {"podClaim": c.pod_claim, "claim": c.claim, "devices": list(c.devices)} for c in self.claims
            ],
            "decidedAt": self.decided_at,
            "requests": [r.to_json() for r in self.requests],
            "pending": {"reason": self.pending[0], "message": self.pending[1]} if self.pending else None,
            "reasonsNow": [{"reason": r, "cards": n, "fix": fix} for r, n, fix in self.fixes()],
            "note": self.note,
            "events": [event.to_json() for event in self.events],
        }


def _pending(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The reason and message of our condition while it is ``False`` (the controller's pending
    reason). The typed pod keeps only the condition's status, so this is the one walk of the
    pod's conditions."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == CONDITION_TYPE:
            if condition.get("status") != "False":
                return None
            return str(condition.get("reason", "")), str(condition.get("message", ""))
    return None


def _devices(claim: ClaimView, driver: str) -> tuple[str, ...]:
    """``pool/device`` of each of the claim's allocation results of our driver."""
    return tuple(
        f"{result.device.pool}/{result.device.device}"
        for result in claim.results
        if result.device.driver == driver
    )


def explain(
    pod: Mapping[str, Any],
    *,
    claims: Mapping[str, Mapping[str, Any]],
    all_claims: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    driver: str,
    defaults: ControllerDefaults | None = None,
    events: Sequence[Mapping[str, Any]] = (),
) -> Explanation:
    """Explain ``pod``; ``claims``: its ResourceClaims by name, ``all_claims``: every allocated claim
    of the cluster (what the cards hold now), ``slices`` and ``classes`` as listed, ``events``
    those involving the pod."""
    view = PodView.parse(pod)
    claim_views = {name: ClaimView.parse(claim, driver) for name, claim in claims.items()}
    result = Explanation(view.key, "allocated", events=pod_warnings(events, pod, driver))
    for pod_claim, name in view.claim_names:
        claim = claim_views.get(name) if name else None
        result.claims.append(ClaimLine(pod_claim, name, _devices(claim, driver) if claim else ()))
    key = decision_annotation(driver)
    annotation = view.annotations.get(key)
    if annotation:
        try:
            result.decided_at, result.requests = decode(annotation)
        except ValueError as err:
            result.note = f"the pod's {key} annotation is unreadable: {err}"
    result.pending = _pending(pod)
    if not view.gated and result.requests:
        return result
    if any(line.claim is None or line.claim not in claims for line in result.claims):
        result.state = "waiting"
        result.note = (
            result.note or "a claim of the pod does not exist yet (its template's claim is created first)"
        )
        return result
    class_views = {klass.name: klass for klass in (DeviceClassView(c, driver) for c in classes)}
    if not view.gated and not result.requests:
        result.state = "allocated" if any(line.devices for line in result.claims) else "not ours"
        result.note = result.note or "no decision record: placed by another scheduler or an older controller"
        return result
    result.state = "pending"
    _evaluate_now(
        result, view, claim_views, all_claims, slices, class_views, driver, defaults or ControllerDefaults()
    )
    return result


def _evaluate_now(
    result: Explanation,
    pod: PodView,
    claims: Mapping[str, ClaimView],
    all_claims: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    classes: Mapping[str, DeviceClassView],
    driver: str,
    defaults: ControllerDefaults,
) -> None:
    ledger = Ledger()
    inventory = build_inventory(slices, driver)
    ledger.set_inventory(inventory)
    for allocated in all_claims:
        held = ClaimView.parse(allocated, driver)
        if held.uses:
            ledger.set_claim(held.uid, held.uses)
    planner = Planner(ledger, Matcher(driver, policy_taint_key(driver)), driver, defaults, classes.get)

    def is_ours(name: Any) -> bool:
        klass = classes.get(str(name))
        return klass is not None and klass.ours

    inputs = []
    for line in result.claims:
        claim = claims[str(line.claim)]
        if claim.allocation:
            continue
        try:
            requests, _ = claim_requests(claim, is_ours)
        except RequestError as err:
            result.note = f"claim {claim.key}: {err}"
            return
        if requests:
            inputs.append(PlanInput(claim, requests))
    if not inputs:
        result.note = result.note or "no unallocated claim of ours: the pod waits for something else"
        return
    plan = planner.plan(pod, inputs, frozenset(inventory), None)
    result.requests = [request_record(s, d, c, ledger.device_name) for s, d, c in plan.decisions]
    counts: Counter[str] = Counter()
    for _, decision, _ in plan.decisions:
        counts.update(card.reason.value for card in decision.candidates if card.reason is not None)
    result.reasons = dict(counts)
    if plan.reason is None:
        result.note = "it fits now: the controller places it at its next pass"
