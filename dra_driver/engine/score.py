"""Usage scores of cards and nodes, computed in float32 exactly as HAMi's Go code does.

``score = 10 * (w_slot*tenants/slots + w_core*usedCores/totalCores + w_mem*usedMem/totalMem)``

HAMi computes in float32 and compares scores with exact float32 equality, so ties (and therefore
placements) depend on float32 rounding. Every intermediate result is rounded to float32 here;
double rounding through float64 is exact for +, -, *, / of float32 operands, so this matches Go.
The request being placed is never counted: the score reflects current usage only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from dra_driver.engine.model import CardUsage, GpuCard
from dra_driver.engine.weights import DEFAULT_WEIGHTS, ScoringWeights

#: HAMi's ``util.Weight``.
SCORE_SCALE = 10.0

_F32 = struct.Struct("f")


def f32(value: float) -> float:
    """Round a Python float to the nearest float32 value."""
    result: float = _F32.unpack(_F32.pack(value))[0]
    return result


def _ratio(used: int, total: int) -> float:
    return f32(f32(float(used)) / f32(float(total)))


def usage_score(
    tenants: int,
    used_cores: int,
    used_memory: int,
    slots: int,
    total_cores: int,
    total_memory: int,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
) -> float:
    """The weighted usage score; 0 when any denominator is 0 (HAMi's guard)."""
    if slots <= 0 or total_cores <= 0 or total_memory <= 0:
        return 0.0
    slot_term = f32(f32(float(weights.slot)) * _ratio(tenants, slots))
    core_term = f32(f32(float(weights.core)) * _ratio(used_cores, total_cores))
    memory_term = f32(f32(float(weights.memory)) * _ratio(used_memory, total_memory))
    return f32(SCORE_SCALE * f32(f32(slot_term + core_term) + memory_term))


def card_score(card: GpuCard, usage: CardUsage, weights: ScoringWeights = DEFAULT_WEIGHTS) -> float:
    """The card's usage score, memoised in ``usage.scores`` until its usage changes."""
    score = usage.scores.get(weights)
    if score is None:
        score = usage_score(
            usage.tenants, usage.used_cores, usage.used_memory, card.slots, card.cores, card.memory, weights
        )
        usage.scores[weights] = score
    return score


def node_score(cards: Iterable[tuple[GpuCard, CardUsage]]) -> float:
    """HAMi's node score: the same formula over the sums of all cards, weights fixed at 1:1:1."""
    tenants = slots = used_cores = total_cores = used_memory = total_memory = 0
    for card, usage in cards:
        tenants += usage.tenants
        slots += card.slots
        used_cores += usage.used_cores
        total_cores += card.cores
        used_memory += usage.used_memory
        total_memory += card.memory
    return usage_score(tenants, used_cores, used_memory, slots, total_cores, total_memory)
