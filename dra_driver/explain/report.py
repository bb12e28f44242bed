"""An explanation of one pod, built from cluster objects (no API calls here, so tests need none).

For a placed pod the explanation is the decision the controller recorded on it when it lifted
the gate (``dra_driver/controller/decision_record.py``): the scores it saw then, not scores
recomputed from today's cluster. For a pod still waiting it is the controller's pending reason and
a fresh decision on the cluster now by the controller's own allocator over the controller's own
cache, fed the listed objects (``dra_driver/controller/offline.py``): node fit, quotas and
per-container limits included, so "it fits now" and every refusal are what the controller would
say. The planner's decisions give each card's score and reason, and for each reason what would
make a card fit.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.contract import ALLOCATED_CONDITION as CONDITION_TYPE
from dra_driver.controller.allocator import Allocator, NotCandidate, Placed, Unschedulable, WaitingForClaim
from dra_driver.controller.decision_record import (
    RequestRecord,
    decision_annotation,
    decode,
    request_record,
)
from dra_driver.controller.gang_plan import GangPlan
from dra_driver.controller.gang_preemption import gang_candidate, gang_hidden, gang_refusal
from dra_driver.controller.nomination import Nomination, nomination_annotation
from dra_driver.controller.offline import ClusterObjects, allocator_for, gang_plan_for
from dra_driver.controller.planner import PlanDecision
from dra_driver.controller.preemption import Candidate, candidates_for, refusal
from dra_driver.engine import Reason
from dra_driver.explain.events import PodEvent, pod_warnings
from dra_driver.kube.watch import object_key
from dra_driver.resource.objects import PodView
from dra_driver.resource.refs import allocation_results

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
    Reason.MIG_PROFILE_MISMATCH.value: "an instance of the profile asked for (docs/isolation.md, 'MIG')",
    Reason.MIG_INSTANCE_IN_USE.value: (
        "its claim ends, or the admin creates more instances of the profile (static MIG)"
    ),
    Reason.MIG_PLACEMENT_TAKEN.value: "the instances on the slices it needs end (MIG on demand)",
}


@dataclass(frozen=True)
class ClaimLine:
    pod_claim: str
    claim: str | None
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class GangState:
    """The pod's gang as the controller would plan it now (``gangs.py``)."""

    group: str  # how the gang is named ("pod group team/train (label ...)")
    placeable: int  # members past the gate or placeable now, together
    members: int  # members that exist
    needed: int  # the group's minimum
    summary: str  # the controller's one line about it

    @property
    def ready(self) -> bool:
        return self.needed > 0 and self.placeable >= self.needed

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "placeableNow": self.placeable,
            "members": self.members,
            "needed": self.needed,
            "ready": self.ready,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class Victim:
    pod: str
    priority: int
    node: str = ""


@dataclass
class Preemption:
    """What preemption did or would do for a pending pod: its nomination (the victims evicted for
    it and the node whose capacity is held), the victims the controller would choose now, or why
    it would preempt nothing."""

    nominated_node: str | None = None
    evicted: tuple[str, ...] = ()
    nominated_at: str = ""
    node: str | None = None
    victims: tuple[Victim, ...] = ()
    #: The victims chosen now are terminating already: the pod waits for them.
    waiting: tuple[str, ...] = ()
    why_not: str = ""
    #: For a gang member: the gang preemption makes room for, all together (``gang_preemption.py``).
    gang: str = ""

    def to_json(self) -> dict[str, Any]:
        nominated = (
            {"node": self.nominated_node, "victims": list(self.evicted), "at": self.nominated_at}
            if self.nominated_node
            else None
        )
        chosen = (
            {
                "node": self.node,
                "victims": [self._victim(v) for v in self.victims],
                "waitingFor": list(self.waiting),
            }
            if self.node
            else None
        )
        document = {"nominated": nominated, "wouldEvict": chosen, "whyNot": self.why_not or None}
        if self.gang:  # a gang member only: its gang's victims, on the nodes they span
            document["forGang"] = self.gang
        return document

    def _victim(self, victim: Victim) -> dict[str, Any]:
        found: dict[str, Any] = {"pod": victim.pod, "priority": victim.priority}
        if self.gang:
            found["node"] = victim.node
        return found


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
    #: For a pending pod evaluated now: the reason and message the controller would report now
    #: (None when it would place it).
    now: tuple[str, str] | None = None
    #: For a pending pod evaluated now: node -> why the pod itself cannot run there (selectors,
    #: taints, CPU/memory left: the controller's node fit), for every node with our devices.
    nodes_refused: dict[str, str] = field(default_factory=dict)
    #: ``spec.priority`` (its PriorityClass's value): the controller plans higher ones first.
    priority: int = 0
    #: For a pending member of a gang: the gang's state now (placed all together, or none).
    gang: GangState | None = None
    #: For a pending pod: its nomination, and the victims preemption would choose now.
    preemption: Preemption | None = None

    def fixes(self) -> list[tuple[str, int, str]]:
        return [(r, n, FIXES.get(r, "")) for r, n in sorted(self.reasons.items(), key=lambda x: -x[1])]

    def to_json(self) -> dict[str, Any]:
        document = {
            "pod": self.pod,
            "state": self.state,
            "priority": self.priority,
            "claims": [
                {"podClaim": c.pod_claim, "claim": c.claim, "devices": list(c.devices)} for c in self.claims
            ],
            "decidedAt": self.decided_at,
            "requests": [r.to_json() for r in self.requests],
            "pending": {"reason": self.pending[0], "message": self.pending[1]} if self.pending else None,
            "reasonsNow": [{"reason": r, "cards": n, "fix": fix} for r, n, fix in self.fixes()],
            "now": {"reason": self.now[0], "message": self.now[1]} if self.now else None,
            "nodesRefused": [{"node": node, "reason": why} for node, why in self.nodes_refused.items()],
            "note": self.note,
            "events": [event.to_json() for event in self.events],
            "preemption": self.preemption.to_json() if self.preemption else None,
        }
        if self.gang is not None:  # a gang member only
            document["gang"] = self.gang.to_json()
        return document


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


def _devices(claim: Mapping[str, Any], driver: str) -> tuple[str, ...]:
    """``pool/device`` of each of the claim's allocation results of our driver."""
    return tuple(
        f"{result.device.pool}/{result.device.device}"
        for result in allocation_results((claim.get("status") or {}).get("allocation"))
        if result.device.driver == driver
    )


def _missing_claim(line: ClaimLine) -> str:
    """Why the pod waits for a claim: which one does not exist."""
    if line.claim is None:
        return f"the claim of its {line.pod_claim} (from a template) is not created yet"
    return f"its claim {line.claim} does not exist yet"


def explain(
    pod: Mapping[str, Any],
    *,
    claims: Mapping[str, Mapping[str, Any]],
    cluster: ClusterObjects,
    driver: str,
    defaults: ControllerDefaults | None = None,
    events: Sequence[Mapping[str, Any]] = (),
) -> Explanation:
    """Explain ``pod``; ``claims``: its ResourceClaims by name (read one by one: a tenant may read
    them where it may not list the cluster's), ``cluster``: what the controller's informers list
    (the pod and its claims are added where the lists lack them), ``events`` those involving the
    pod."""
    view = PodView.parse(pod)
    result = Explanation(
        view.key, "allocated", events=pod_warnings(events, pod, driver), priority=view.priority
    )
    # By claim name; a template's claim not created yet (no name) has none.
    devices: dict[str | None, tuple[str, ...]] = {
        name: _devices(claim, driver) for name, claim in claims.items()
    }
    result.claims = [
        ClaimLine(pod_claim, name, devices.get(name, ())) for pod_claim, name in view.claim_names
    ]
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
    missing = [line for line in result.claims if line.claim not in claims]
    if missing:
        result.state = "waiting"
        result.note = result.note or _missing_claim(missing[0])
        return result
    allocator = allocator_for(_with_pod(cluster, pod, claims.values()), driver, defaults)
    cached = allocator.cache.pods[view.key]
    if not view.gated and not allocator.is_candidate(cached):
        result.state = "allocated" if any(line.devices for line in result.claims) else "not ours"
        result.note = result.note or "no decision record: placed by another scheduler or an older controller"
        return result
    result.state = "pending"
    _evaluate_now(result, allocator, cached)
    _gang_now(result, cluster, allocator, cached)
    return result


def _gang_now(result: Explanation, cluster: ClusterObjects, allocator: Allocator, pod: PodView) -> None:
    """For a gang member: the gang's joint plan now (members placeable, members needed); a member
    that fits alone still waits for its gang."""
    plan = gang_plan_for(cluster, allocator, pod)
    if plan is None:
        return
    result.gang = GangState(plan.ref.describe(), plan.placeable, plan.members, plan.needed, plan.summary())
    if not result.gang.ready and result.now is None:
        result.now = ("Unschedulable", plan.summary())
        result.note = "it fits alone, but its gang is placed all together or not at all"
    if not result.gang.ready:
        # A member never preempts alone: the gang does, as a whole.
        result.preemption = _gang_preemption(allocator, plan, pod)


def _with_pod(
    cluster: ClusterObjects, pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]]
) -> ClusterObjects:
    """``cluster`` with the pod and its claims in it (each replacing its listed version: the one
    read by name is the newer)."""
    own_claims = list(claims)
    claim_keys = {_key(claim) for claim in own_claims}
    return dataclasses.replace(
        cluster,
        pods=[pod, *(obj for obj in cluster.pods if _key(obj) != _key(pod))],
        claims=[*own_claims, *(obj for obj in cluster.claims if _key(obj) not in claim_keys)],
    )


def _key(obj: Mapping[str, Any]) -> str:
    return object_key(dict(obj))


def _evaluate_now(result: Explanation, allocator: Allocator, pod: PodView) -> None:
    """What the controller would decide for the pod now: its allocator's outcome, the planner's
    decisions card by card, and the nodes where the pod itself cannot run."""
    outcome = allocator.allocate(pod)
    decisions: tuple[PlanDecision, ...] = ()
    if isinstance(outcome, Placed):
        decisions = outcome.decisions
        result.note = (
            "it fits now: the controller places it at its next pass"
            if outcome.writes
            else "no unallocated claim of ours: the pod waits for something else"
        )
    elif isinstance(outcome, Unschedulable):
        decisions = outcome.decisions
        result.now = (outcome.reason, outcome.message)
        result.preemption = _preemption(allocator, pod, outcome.reason)
    elif isinstance(outcome, NotCandidate):
        result.note = result.note or "not the controller's to place now (bound, ended, or being deleted)"
    elif isinstance(outcome, WaitingForClaim):
        result.state = "waiting"
        result.note = result.note or "a claim of the pod does not exist yet"
    ledger = allocator.cache.ledger
    result.requests = [request_record(s, d, c, ledger.device_name) for s, d, c in decisions]
    counts: Counter[str] = Counter()
    for planned in decisions:
        counts.update(card.reason.value for card in planned.decision.candidates if card.reason is not None)
    result.reasons = dict(counts)
    refused = ((node, allocator.fit_problem(pod, node)) for node in sorted(ledger.inventory))
    result.nodes_refused = {node: problem for node, problem in refused if problem is not None}


def _nominated(allocator: Allocator, pod: PodView, preemption: Preemption) -> None:
    """The pod's nomination as recorded on it, into ``preemption``."""
    value = pod.annotations.get(nomination_annotation(allocator.driver))
    if value is None:
        return
    try:
        nomination = Nomination.decode(value, allocator.driver)
    except ValueError as err:
        preemption.why_not = str(err)
    else:
        preemption.nominated_node = nomination.node
        preemption.evicted = nomination.victims
        preemption.nominated_at = nomination.at


def _chosen(preemption: Preemption, found: Candidate) -> None:
    preemption.node = found.node
    preemption.victims = tuple(Victim(v.key, v.priority, v.node) for v in found.victims)
    preemption.waiting = tuple(victim.key for victim in found.waiting_for)


def _preemption(allocator: Allocator, pod: PodView, reason: str) -> Preemption:
    """The pod's nomination as recorded on it, and the victims the controller's preemption would
    choose for it now on the same cache (with the same holds)."""
    preemption = Preemption()
    _nominated(allocator, pod, preemption)
    why = refusal(pod, reason)
    if why is not None:
        preemption.why_not = f"it preempts nothing: {why}"
        return preemption
    found = candidates_for(allocator, pod, hidden=allocator.hidden_holds(pod), now=time.time())
    if not found:
        preemption.why_not = (
            "no node where evicting pods of lower priority would make room for it "
            "(pods of equal or higher priority are never evicted)"
        )
        return preemption
    _chosen(preemption, found[0])
    return preemption


def _gang_preemption(allocator: Allocator, plan: GangPlan, pod: PodView) -> Preemption:
    """For a member of a waiting gang: its nomination, and the victims the controller would
    evict for the whole gang now (``gang_preemption.py``), or why none."""
    preemption = Preemption(gang=plan.ref.describe())
    _nominated(allocator, pod, preemption)
    why = gang_refusal(plan)
    if why is not None:
        preemption.why_not = f"the gang preempts nothing: {why}"
        return preemption
    hidden = gang_hidden(plan, allocator.hidden_holds)
    found = gang_candidate(allocator, plan, hidden=hidden, now=time.time())
    if found is None:
        preemption.why_not = (
            "no nodes where evicting pods of lower priority would make room for the whole gang "
            "(pods of equal or higher priority are never evicted)"
        )
        return preemption
    _chosen(preemption, found)
    return preemption
