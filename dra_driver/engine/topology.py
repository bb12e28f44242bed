"""``topology-aware`` selection over NVLink pair scores.

HAMi's ``computeWorstSingleCard`` and ``computeBestCombination``, with the seed's ordering.

For one GPU, take the card whose loss hurts connectivity least (smallest sum of pair scores to the
other candidates), so well-connected groups stay free for multi-GPU jobs. For N GPUs, take the
N-subset with the largest sum of pair scores. Ties go to the earlier candidate(s) in sort order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from dra_driver.engine.model import GpuCard

#: Beyond this many subsets the search is cut off and the best found so far is used; 16 choose 8 fits.
MAX_COMBINATIONS = 20_000


def pair_score(a: GpuCard, b: GpuCard) -> int:
    """Link score between two cards; a one-sided or missing entry counts as 0."""
    return a.links.get(b.index, 0)


def select_by_topology(candidates: Sequence[GpuCard], count: int) -> list[GpuCard]:
    """Choose ``count`` of ``candidates`` (already in policy order); returns them in candidate order."""
    if len(candidates) <= count:
        return list(candidates)
    if count == 1:

        def connectivity(card: GpuCard) -> int:
            return sum(pair_score(card, other) for other in candidates if other is not card)

        return [min(candidates, key=connectivity)]  # min() keeps the first of equal values
    best: tuple[int, ...] = tuple(range(count))
    best_score: int | None = None
    for examined, subset in enumerate(combinations(range(len(candidates)), count)):
        if examined >= MAX_COMBINATIONS:
            break
        score = sum(
            pair_score(candidates[subset[i]], candidates[subset[j]])
            for i in range(count)
            for j in range(i + 1, count)
        )
        if best_score is None or score > best_score:
            best, best_score = subset, score
    return [candidates[position] for position in best]
