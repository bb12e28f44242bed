"""Place a scenario's claims in order, each placement updating the usage the next one sees.

A claim whose placement would take its namespace past a quota stays pending, with the quota's
message as its reason, exactly as the controller holds such a pod (dra_driver/quota/).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dra_driver.engine import DEFAULT_MAX_CANDIDATES, Decision, place
from dra_driver.quota import Charge, Quota, find_breach
from dra_driver.simulate.scenario import Scenario, simulated_device


@dataclass(frozen=True)
class SimulationResult:
    decisions: tuple[Decision, ...]
    #: Per decision: the quota (``namespace/name``) that held the claim pending, else None.
    quota_blocks: tuple[str | None, ...] = ()

    def blocked_by(self, position: int) -> str | None:
        return self.quota_blocks[position] if position < len(self.quota_blocks) else None


def run_scenario(scenario: Scenario, *, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> SimulationResult:
    state = scenario.cluster_state()
    quotas: dict[str, list[Quota]] = {}
    for spec in scenario.quotas:
        quotas.setdefault(spec.namespace, []).append(spec.quota())
    charges = scenario.existing_charges()
    decisions: list[Decision] = []
    blocks: list[str | None] = []
    for claim, request in zip(scenario.claims, scenario.requests(), strict=True):
        decision = place(state, request, max_candidates=max_candidates)
        blocked = None
        if decision.placement is not None:
            new = [
                Charge("", simulated_device(decision.placement.node, share.index), share.memory, share.cores)
                for share in decision.placement.devices
            ]
            existing = charges.setdefault(claim.namespace, [])
            breach = find_breach(quotas.get(claim.namespace, []), existing, new)
            if breach is None:
                state.allocate(decision.placement)
                existing.extend(new)
            else:
                blocked = f"{breach.quota.namespace}/{breach.quota.name}"
                decision = _held(decision, breach.message)
        decisions.append(decision)
        blocks.append(blocked)
    return SimulationResult(tuple(decisions), tuple(blocks))


def _held(decision: Decision, reason: str) -> Decision:
    """The decision as a pending one: the cards are as scored, none chosen."""
    candidates = tuple(dataclasses.replace(card, chosen=False) for card in decision.candidates)
    return dataclasses.replace(decision, placement=None, reason=reason, candidates=candidates)
