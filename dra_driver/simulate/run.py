"""Place a scenario's claims in order, each placement updating the usage the next one sees."""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.engine import DEFAULT_MAX_CANDIDATES, Decision, place_and_allocate
from dra_driver.simulate.scenario import Scenario


@dataclass(frozen=True)
class SimulationResult:
    decisions: tuple[Decision, ...]


def run_scenario(scenario: Scenario, *, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> SimulationResult:
    state = scenario.cluster_state()
    decisions = tuple(
        place_and_allocate(state, request, max_candidates=max_candidates) for request in scenario.requests()
    )
    return SimulationResult(decisions)
