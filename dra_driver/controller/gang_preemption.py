"""Preemption for a whole gang: the lower-priority pods to evict so that the group fits, all
together (issue 38: "preemption of lower-priority pods for a whole gang follows the same rules").

A gang is planned jointly and never one member at a time (``gang_plan.py``), so it preempts as a
unit: when its joint plan cannot reach the group's minimum for capacity, the victims are searched
by ``preemption.select_joint``, the single-pod search (``best_on``: every lower-priority pod
removed, the most important reprieved, a bounded search for fewer) run over the nodes the members
may run on taken together, with the joint plan of the whole gang as the oracle. The rules are
one pod's:

* **who may preempt:** the group's minimum must be reachable (enough members exist, the group's
  minimum is known), no member's ``preemptionPolicy`` is ``Never``, and every member that cannot
  be placed waits for capacity: a member over its namespace's GpuQuota (or waiting for its claim,
  or its own input) means the gang preempts nothing. GpuQuota is never exceeded: the oracle is
  the allocator, quotas checked across the members.
* **who may be a victim:** a pod of strictly lower priority than every member (the gang's
  priority is its lowest member's); never one of equal or higher priority, never a member.
* **the hold:** each member the plan places once the victims are gone is nominated to its node
  (``nomination.py``): the devices and shares it would take are held in the ledger while the
  victims terminate, and written on the member, so a restart holds them again. The holds of a
  gang's members are its own to take when it is planned again (``plan_gang`` leaves them out).

Nothing here writes; ``preemptor.py`` evicts (the Eviction API, PodDisruptionBudgets respected)
and nominates; ``hami-dra explain`` and ``simulate`` show the same victims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.controller.allocator import Allocator, Unschedulable
from dra_driver.controller.gang_plan import GangPlan, plan_gang
from dra_driver.controller.preemption import (
    PREEMPT_NEVER,
    Candidate,
    Holder,
    JointFits,
    select_joint,
    sites_below,
)
from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import PodView
from dra_driver.resource.uses import Use


@dataclass(frozen=True, slots=True)
class MemberHold:
    """What one member of the gang takes once the victims are gone: held for it meanwhile."""

    pod: PodView
    node: str
    uses: tuple[Use, ...]


def gang_priority(plan: GangPlan) -> int:
    """The gang's priority as a preemptor: its lowest gated member's (a victim must be of lower
    priority than every member)."""
    return min((pod.priority for pod in plan.gated.values()), default=0)


def gang_refusal(plan: GangPlan) -> str | None:
    """Why the waiting gang may not have others preempted for it (None: it may)."""
    if plan.policy.problem is not None:
        return plan.policy.problem
    if plan.members < plan.needed:
        return f"{plan.needed - plan.members} member(s) not created yet"
    for key, pod in plan.gated.items():
        if pod.preemption_policy == PREEMPT_NEVER:
            return f"member {key}'s preemptionPolicy is Never"
    for key, refusal in plan.refused.items():
        if not isinstance(refusal, Unschedulable):
            return f"member {key} waits for its claim to be created, not for capacity"
        if refusal.reason != Reason.UNSCHEDULABLE:
            return f"member {key} waits for {refusal.reason}, not for capacity"
    if not plan.refused:
        return "it waits for nothing preemption frees"
    return None


def members_of(allocator: Allocator, plan: GangPlan) -> list[PodView]:
    """The gang's members as ``plan_gang`` takes them: the gated ones and those past the gate."""
    admitted = (allocator.cache.pods.get(key) for key in plan.admitted)
    return [*plan.gated.values(), *(pod for pod in admitted if pod is not None)]


def gang_hidden(plan: GangPlan, hidden_for: Callable[[PodView], frozenset[str]]) -> frozenset[str]:
    """The holds the gang may take: each member's own and those of lower priority than it."""
    hidden: frozenset[str] = frozenset()
    for pod in plan.gated.values():
        hidden |= hidden_for(pod)
    return hidden


def gang_fits(allocator: Allocator, plan: GangPlan, hidden: frozenset[str]) -> JointFits:
    """``fits(freed)`` by the controller's own joint plan: the gang reaches its minimum with
    the freed claims (and ``hidden``) left out of the ledger, quotas checked."""
    members = members_of(allocator, plan)

    def fits(freed: frozenset[str]) -> bool:
        with allocator.cache.ledger.hiding(hidden | freed):
            return plan_gang(allocator, plan.ref, plan.policy, members, quiet=True).ready

    return fits


def gang_candidate(
    allocator: Allocator,
    plan: GangPlan,
    *,
    hidden: frozenset[str] = frozenset(),
    going: Callable[[PodView], bool] = lambda pod: pod.deleting,
    refused: frozenset[str] = frozenset(),
    now: float,
) -> Candidate | None:
    """The victims whose eviction lets the waiting gang reach its minimum (None: there are none),
    over the nodes its gated members may run on. ``hidden``: the holds the gang may take
    (``gang_hidden``); ``refused``: pods a PodDisruptionBudget protects now."""
    priority = gang_priority(plan)
    nodes: frozenset[str] = frozenset()
    for pod in plan.gated.values():
        nodes |= allocator.allowed_nodes(pod)
    preemptors = frozenset(plan.gated) | frozenset(plan.admitted)
    sites = sites_below(allocator.cache, priority, preemptors, nodes, going)
    fits = gang_fits(allocator, plan, hidden)
    found = select_joint(sites, priority, fits, now=now, refused=refused)
    return None if found is None else _trimmed(allocator, plan, found, hidden, fits)


def _trimmed(
    allocator: Allocator, plan: GangPlan, found: Candidate, hidden: frozenset[str], fits: JointFits
) -> Candidate:
    """``found`` without the victims on devices the gang would not use: where the bounded reprieve
    stopped early (a gang over many cards), pods it did not get to try may still be victims;
    those on cards no member takes are let go at once, if the gang still fits without them (one
    more joint plan; ``found`` as it was otherwise)."""
    ledger = allocator.cache.ledger
    used = {use.device for hold in gang_holds(allocator, plan, found, hidden) for use in hold.uses}
    claims = ledger.claims()

    def needed(victim: Holder) -> bool:
        return any(use.device in used for uid in victim.claims for use in claims.get(uid, ()))

    kept = tuple(victim for victim in found.victims if needed(victim))
    if not used or len(kept) == len(found.victims):
        return found
    dropped = {uid for victim in found.victims if not needed(victim) for uid in victim.claims}
    freed = found.freed - dropped
    if not fits(freed):
        return found
    return dataclasses.replace(found, victims=kept, freed=freed)


def gang_holds(
    allocator: Allocator, plan: GangPlan, candidate: Candidate, hidden: frozenset[str]
) -> list[MemberHold]:
    """What each member would take once the candidate's victims are gone, to hold for it while
    they terminate (empty if the gang no longer fits)."""
    with allocator.cache.ledger.hiding(hidden | candidate.freed):
        replanned = plan_gang(allocator, plan.ref, plan.policy, members_of(allocator, plan), quiet=True)
    if not replanned.ready:
        return []
    holds = []
    for placed in replanned.placed:
        uses = tuple(use for write in placed.writes for use in write.uses)
        devices = (allocator.cache.ledger.device(use.device) for use in uses)
        nodes = {device.node for device in devices if device is not None}
        if uses and len(nodes) == 1:
            holds.append(MemberHold(placed.pod, nodes.pop(), uses))
    return holds
