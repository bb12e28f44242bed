"""The engine's input validation and its explanation of a decision, field by field.

``hami-dra simulate`` and the controller's log print these fields; the validation messages are
what a user sees for a bad scenario file. Pinned so a change to either is deliberate.
"""

from __future__ import annotations

import pytest

from dra_driver.engine import MIB, ClusterState, GpuCard, PlacementRequest, parse_node_policy, place
from tests.engine.helpers import T4_MEMORY, request, t4, tenants


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"index": -1}, "node-1/gpu index must be >= 0, got -1"),
        ({"memory": 0}, "node-1/gpu-0: memory must be positive"),
        ({"cores": 0}, "node-1/gpu-0: cores must be positive"),
        ({"slots": 0}, "node-1/gpu-0: slots must be positive"),
    ],
)
def test_invalid_cards_are_refused_with_the_reason(fields: dict[str, int], message: str) -> None:
    values = {"node": "node-1", "index": 0, "memory": T4_MEMORY, **fields}
    with pytest.raises(ValueError) as refused:
        GpuCard(**values)  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_the_smallest_valid_card() -> None:
    card = GpuCard(node="n", index=0, memory=1, cores=1, slots=1)
    assert (card.memory, card.cores, card.slots) == (1, 1, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"count": 0}, "r: count must be at least 1, got 0"),
        ({"memory": MIB, "memory_percent": 50}, "r: give memory or memoryPercent, not both"),
        ({"memory": -1}, "r: memory must not be negative"),
        ({"memory_percent": 0}, "r: memoryPercent must be within 1..100, got 0"),
        ({"memory_percent": 101}, "r: memoryPercent must be within 1..100, got 101"),
        ({"cores": 101}, "r: cores must be within 0..100, got 101"),
        ({"cores": -1}, "r: cores must be within 0..100, got -1"),
    ],
)
def test_invalid_requests_are_refused_with_the_reason(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        PlacementRequest(name="r", **fields)  # type: ignore[arg-type]
    assert str(refused.value) == message


@pytest.mark.parametrize("percent", [1, 100])
def test_memory_percent_bounds_are_inclusive(percent: int) -> None:
    assert PlacementRequest(memory_percent=percent).memory_percent == percent


def test_memory_percent_floors_to_whole_mib_as_hami_does() -> None:
    odd_card = 15360 * MIB + 123  # not a whole number of MiB
    share = PlacementRequest(memory_percent=33).memory_for(odd_card)
    assert share == 5068 * MIB and isinstance(share, int)  # 15360 * 33 / 100 = 5068.8 -> 5068 MiB
    assert PlacementRequest().memory_for(odd_card) == 15360 * MIB


def test_a_decision_explains_every_card_and_the_node() -> None:
    state = ClusterState([t4(0), t4(1), t4(2, numa=1)])
    tenants(state, "node-1", 0, 2, memory_mib=1000, cores=10)
    decision = place(state, request("mutex,binpack", memory_mib=1000, node_policy="spread", name="latency"))
    assert decision.request == "latency"
    assert [p.value for p in decision.policy.policies] == ["mutex", "binpack"]
    assert decision.node_policy is parse_node_policy("spread")
    assert decision.placement is not None and decision.placement.node == "node-1"
    by_index = {card.index: card for card in decision.candidates}
    busy = by_index[0]
    explained = (
        busy.node,
        busy.product_name,
        busy.tenants,
        busy.used_memory,
        busy.used_cores,
        busy.total_memory,
    )
    assert explained == ("node-1", "Tesla T4", 2, 2000 * MIB, 20, T4_MEMORY)
    assert (
        not busy.eligible
        and busy.reason is not None
        and busy.reason.value == "ExclusiveDeviceAllocateConflict"
    )
    assert by_index[1].chosen and by_index[1].eligible and by_index[2].numa_node == 1
    (outcome,) = decision.nodes
    assert (outcome.node, outcome.fits, outcome.reason) == ("node-1", True, None)
    assert outcome.score == pytest.approx(10 * (2 / 30 + 20 / 300 + 2000 / (3 * 15360)), rel=1e-6)


def test_candidate_scores_use_the_request_weights() -> None:
    from dra_driver.engine import ScoringWeights

    state = ClusterState([t4(0), t4(1)])
    tenants(state, "node-1", 0, 1, memory_mib=7680)
    heavy = place(
        state, request("binpack", memory_mib=1000, weights=ScoringWeights(slot=0, core=0, memory=2))
    )
    assert {c.index: round(c.score, 6) for c in heavy.candidates} == {0: 10.0, 1: 0.0}
