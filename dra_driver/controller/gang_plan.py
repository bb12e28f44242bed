"""Joint planning of a gang: its gated members planned together, or none of them.

Members are planned one after another (oldest first) by the controller's own allocator, so the
whole policy chain applies across them: each member's placement is held tentatively on the
ledger (``Tentative``) before the next member is planned, so ``binpack`` packs the group onto few
nodes, ``spread`` spreads it, ``numa``/topology keep each member's cards close, and quotas count
the members already planned. When the plan ends, the tentative holds are undone, whatever its
outcome: the ledger is exactly as before. Nothing here writes; the caller
(dra_driver/controller/gangs.py in the controller, dra_driver/explain for ``explain``) acts on
the ``GangPlan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from dra_driver.controller.allocator import (
    Allocator,
    ClaimBusy,
    ClaimWrite,
    Placed,
    Unschedulable,
    WaitingForClaim,
)
from dra_driver.controller.gang_refs import GangPolicy, GroupRef
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.nomination import hold_key
from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import PodView
from dra_driver.resource.uses import Use

#: Why a gated member cannot be placed now.
Refusal = Unschedulable | WaitingForClaim


class Tentative:
    """Uses held on the ledger for the length of one joint plan, then restored."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._previous: dict[str, tuple[Use, ...]] = {}

    def hold(self, writes: Iterable[ClaimWrite]) -> None:
        for write in writes:
            uid = write.claim.uid
            self._previous.setdefault(uid, self.ledger.claims().get(uid, ()))
            self.ledger.set_claim(uid, write.uses)

    def undo(self) -> None:
        for uid, uses in self._previous.items():
            self.ledger.set_claim(uid, uses)
        self._previous.clear()


@contextmanager
def tentative(ledger: Ledger) -> Iterator[Tentative]:
    held = Tentative(ledger)
    try:
        yield held
    finally:
        held.undo()


@dataclass(slots=True)
class GangPlan:
    """A gang's members as the controller sees them now, and whether enough can be placed."""

    ref: GroupRef
    policy: GangPolicy
    #: Members past our gate (bound, or ungated): placed already, or not ours to place.
    admitted: list[str] = field(default_factory=list)
    #: Gated members placeable now, planned together (each seeing the ones before).
    placed: list[Placed] = field(default_factory=list)
    #: Gated members that cannot be placed now, and why.
    refused: dict[str, Refusal] = field(default_factory=dict)
    #: Every gated member (PodView by key), oldest first.
    gated: dict[str, PodView] = field(default_factory=dict)
    #: A member's claim is being written: plan the gang again next pass.
    busy: bool = False

    @property
    def needed(self) -> int:
        return self.policy.min_members or 0

    @property
    def placeable(self) -> int:
        return len(self.admitted) + len(self.placed)

    @property
    def members(self) -> int:
        return len(self.admitted) + len(self.gated)

    @property
    def ready(self) -> bool:
        """At least the minimum is placed already or placeable now."""
        return self.policy.problem is None and not self.busy and self.placeable >= self.needed

    @property
    def satisfied(self) -> bool:
        """Enough members are past the gate already: the rest are placed one by one."""
        return self.policy.problem is None and len(self.admitted) >= self.needed

    def summary(self) -> str:
        """One line: "gang X: 3 of 4 members placeable now, needs 4; <why the others wait>"."""
        if self.policy.problem is not None:
            return f"gang {self.ref.describe()}: {self.policy.problem}"
        text = f"gang {self.ref.describe()}: {self.placeable} of {self.members} members placeable now"
        if self.admitted:
            text += f" ({len(self.admitted)} placed already)"
        text += f", needs {self.needed}"
        if self.members < self.needed:
            text += f"; {self.needed - self.members} more member(s) not created yet"
        for key, refusal in list(self.refused.items())[:2]:
            why = refusal.message if isinstance(refusal, Unschedulable) else "a claim does not exist yet"
            text += f"; {key}: {why}"
        if len(self.refused) > 2:
            text += f"; and {len(self.refused) - 2} more"
        return text

    def reason(self) -> Reason:
        """The condition's reason: the refusals' one where they all agree, else Unschedulable."""
        reasons = {r.reason for r in self.refused.values() if isinstance(r, Unschedulable)}
        return reasons.pop() if len(reasons) == 1 else Reason.UNSCHEDULABLE


def member_order(pod: PodView) -> tuple[str, str]:
    return (pod.created, pod.key)


def plan_gang(
    allocator: Allocator,
    ref: GroupRef,
    policy: GangPolicy,
    members: Sequence[PodView],
    *,
    quiet: bool = False,
) -> GangPlan:
    """Plan every gated member of the gang together on the allocator's cache; the ledger is left
    as it was. Members that ended or are being deleted do not count. The capacity held for
    members (nominated while a preemption's victims terminate: ``nomination.py``) is theirs to
    take: every member's hold is left out while the gang is planned, each member then takes its
    share of it. ``quiet``: plans are not logged (a preemption's what-ifs)."""
    plan = GangPlan(ref, policy)
    for pod in sorted(members, key=member_order):
        if not pod.active or pod.deleting:
            continue
        if pod.gated:
            plan.gated[pod.key] = pod
        else:
            plan.admitted.append(pod.key)
    if policy.problem is not None or plan.satisfied:
        return plan
    planned_claims: dict[str, str] = {}  # claim key -> the member planned with it
    holds = [hold_key(pod.uid) for pod in plan.gated.values()]
    with allocator.cache.ledger.hiding(holds), tentative(allocator.cache.ledger) as held:
        for key, pod in plan.gated.items():
            shared = [
                (claim.key, planned_claims[claim.key])
                for _, claim in allocator.cache.pod_claims(pod)
                if claim is not None and claim.key in planned_claims
            ]
            if shared:
                claim_key, other = shared[0]
                plan.refused[key] = Unschedulable(
                    Reason.UNSCHEDULABLE,
                    f"claim {claim_key} is also member {other}'s: members of a gang cannot share an "
                    "unallocated claim (give each member its own, from a ResourceClaimTemplate)",
                )
                continue
            outcome = allocator.allocate(pod, quiet=quiet)
            if isinstance(outcome, ClaimBusy):
                plan.busy = True
                break
            if isinstance(outcome, Placed):
                held.hold(outcome.writes)
                plan.placed.append(outcome)
                planned_claims.update((write.claim.key, key) for write in outcome.writes)
            elif isinstance(outcome, Unschedulable | WaitingForClaim):
                plan.refused[key] = outcome
    return plan
