"""``place()``: the filter-then-sort pipeline for one request.

1. Rank nodes by the node policy (binpack: highest node score first; spread: lowest; ties by name).
2. On each node, in that order: score every card (current usage, request not counted), run the
   fit checks (filters: health, type, UUID, slots, ``mutex``, memory, cores), sort the eligible
   cards by the chain's sort keys with the lowest index as the final tie-break, then take the
   first ``count`` (one NUMA node with ``numaBind``; ``topology-aware`` picks among them).
3. The first node that fits wins. A pending decision carries HAMi's reason string.

The decision lists every card of the chosen node with its score, eligibility and reason, so the
CLI, the controller's log and events can explain the choice score by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.engine.fit import check_card
from dra_driver.engine.model import (
    FULL_CORES,
    CandidateCard,
    Decision,
    DeviceShare,
    GpuCard,
    NodeOutcome,
    Placement,
    PlacementRequest,
)
from dra_driver.engine.policy import NodePolicy, Policy, PolicyChain
from dra_driver.engine.reasons import Reason, format_reasons
from dra_driver.engine.score import card_score
from dra_driver.engine.state import ClusterState, NodeState
from dra_driver.engine.topology import select_by_topology

DEFAULT_MAX_CANDIDATES = 32
_UNKNOWN_NUMA = 1 << 30  # cards without a NUMA node sort after every known one


@dataclass(slots=True)
class _CardEval:
    card: GpuCard
    score: float
    reason: Reason | None
    chosen: bool = False


@dataclass(slots=True)
class _NodeEval:
    node: NodeState
    cards: list[_CardEval]
    chosen: list[GpuCard]
    reason: str | None


def sort_key(keys: Sequence[Policy], score: float, card: GpuCard) -> tuple[float | int, ...]:
    """The chain's ordering as a tuple: earlier keys dominate, the device index breaks final ties."""
    parts: list[float | int] = []
    for key in keys:
        if key is Policy.BINPACK:
            parts.append(-score)
        elif key is Policy.SPREAD:
            parts.append(score)
        else:
            parts.append(_UNKNOWN_NUMA if card.numa_node is None else card.numa_node)
    parts.append(card.index)
    return tuple(parts)


def could_fit(node: NodeState, request: PlacementRequest) -> bool:
    """Cheap necessary conditions over the node's free capacity; ``False`` means the node cannot fit.

    It mirrors the capacity checks of ``check_card`` (slots, mutex, memory, cores, exclusivity)
    without health/type/UUID filters or scores, so it may say ``True`` for a node that then fails
    the full checks, but never ``False`` for a node that fits.
    """
    mutex, cores, needed = request.policy.mutex, request.cores, request.count
    if mutex and node.idle_cards < needed:
        return False  # the common case on a busy cluster, without looking at each card
    for free in node.free:
        if not free.free_slot or free.free_cores < cores:
            continue
        if (mutex or (cores == FULL_CORES and free.total_cores == FULL_CORES)) and not free.idle:
            continue
        if cores == 0 and free.free_cores <= 0:
            continue
        if free.free_memory < request.memory_for(free.total_memory):
            continue
        needed -= 1
        if needed == 0:
            return True
    return False


def evaluate_node(node: NodeState, request: PlacementRequest) -> _NodeEval:
    """Score, filter and sort one node's cards and choose ``request.count`` of them if possible."""
    evals = [
        _CardEval(card, card_score(card, node.usage[card.index], request.weights), None)
        for card in node.cards
    ]
    for evaluation in evals:
        evaluation.reason = check_card(evaluation.card, node.usage[evaluation.card.index], request)
    keys = request.policy.sort_keys
    eligible = sorted(
        (evaluation for evaluation in evals if evaluation.reason is None),
        key=lambda evaluation: sort_key(keys, evaluation.score, evaluation.card),
    )
    chosen = _choose(eligible, request)
    if chosen is None:
        reason = format_reasons((evaluation.reason for evaluation in evals), len(evals))
        if request.count > len(evals):
            reason = ", ".join(filter(None, (reason, Reason.NODE_INSUFFICIENT_DEVICE.value)))
        return _NodeEval(node, evals, [], reason)
    chosen_indexes = {card.index for card in chosen}
    for evaluation in evals:
        evaluation.chosen = evaluation.card.index in chosen_indexes
    return _NodeEval(node, evals, chosen, None)


def _choose(eligible: list[_CardEval], request: PlacementRequest) -> list[GpuCard] | None:
    """Pick the cards from the sorted eligible list; on failure, mark the accepted cards' reasons."""
    if request.numa_bind:
        groups: dict[int | None, list[_CardEval]] = {}
        for evaluation in eligible:
            group = groups.setdefault(evaluation.card.numa_node, [])
            group.append(evaluation)
            if len(group) == request.count and not request.policy.topology_aware:
                return [member.card for member in group]
        if request.policy.topology_aware:
            for group in groups.values():
                if len(group) >= request.count:
                    return select_by_topology([member.card for member in group], request.count)
        # HAMi's accounting: partial groups abandoned for another NUMA node are NumaNotFit,
        # the group the walk ended in is AllocatedCardsInsufficientRequest.
        ordered_groups = list(groups.values())
        for position, group in enumerate(ordered_groups):
            last = position == len(ordered_groups) - 1
            for member in group:
                member.reason = Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST if last else Reason.NUMA_NOT_FIT
        return None
    if len(eligible) < request.count:
        for evaluation in eligible:
            evaluation.reason = Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST
        return None
    cards = [evaluation.card for evaluation in eligible]
    if request.policy.topology_aware:
        return select_by_topology(cards, request.count)
    return cards[: request.count]


def _candidates(evaluation: _NodeEval) -> list[CandidateCard]:
    node = evaluation.node
    result = []
    for card_eval in evaluation.cards:
        card, usage = card_eval.card, node.usage[card_eval.card.index]
        result.append(
            CandidateCard(
                node=node.name,
                index=card.index,
                product_name=card.product_name,
                numa_node=card.numa_node,
                tenants=usage.tenants,
                used_memory=usage.used_memory,
                used_cores=usage.used_cores,
                total_memory=card.memory,
                score=card_eval.score,
                eligible=card_eval.reason is None,
                chosen=card_eval.chosen,
                reason=card_eval.reason,
            )
        )
    return result


def place(
    state: ClusterState, request: PlacementRequest, *, max_candidates: int = DEFAULT_MAX_CANDIDATES
) -> Decision:
    """Decide where ``request`` goes. Pure: the state is not changed (see ``place_and_allocate``)."""
    # A mutex request needs idle cards: only nodes with one can take it (the same order).
    for node in state.ranked_nodes(request.node_policy, with_idle_card=request.policy.mutex):
        if request.allowed_nodes is not None and node.name not in request.allowed_nodes:
            continue
        if not could_fit(node, request):
            continue
        evaluation = evaluate_node(node, request)
        if evaluation.reason is None:
            shares = tuple(
                DeviceShare(index=card.index, memory=request.memory_on(card), cores=request.cores)
                for card in evaluation.chosen
            )
            return Decision(
                request=request.name,
                policy=request.policy,
                node_policy=request.node_policy,
                placement=Placement(node=node.name, devices=shares),
                reason=None,
                candidates=tuple(_candidates(evaluation)),
                nodes=(NodeOutcome(node.name, node.score, True, None),),
            )
    ranked = [
        node
        for node in state.ranked_nodes(request.node_policy)
        if request.allowed_nodes is None or node.name in request.allowed_nodes
    ]
    return _pending(ranked, request, max_candidates)


def _pending(ranked: list[NodeState], request: PlacementRequest, max_candidates: int) -> Decision:
    """Evaluate every allowed node fully (the slow path) to explain why nothing fits."""
    outcomes: list[NodeOutcome] = []
    candidates: list[CandidateCard] = []
    reasons: list[Reason | None] = []
    total_cards = 0
    for node in ranked:
        evaluation = evaluate_node(node, request)
        outcomes.append(NodeOutcome(node.name, node.score, False, evaluation.reason))
        reasons.extend(card_eval.reason for card_eval in evaluation.cards)
        total_cards += len(evaluation.cards)
        if len(candidates) < max_candidates:
            candidates.extend(_candidates(evaluation)[: max_candidates - len(candidates)])
    return unplaced(request, "GPUs", outcomes, reasons, total_cards, candidates)


class _Asked(Protocol):
    """What a pending decision repeats of its request (a card or a MIG request)."""

    @property
    def name(self) -> str: ...
    @property
    def policy(self) -> PolicyChain: ...
    @property
    def node_policy(self) -> NodePolicy: ...


def unplaced(
    request: _Asked,
    devices: str,
    outcomes: Sequence[NodeOutcome],
    reasons: Sequence[Reason | None],
    evaluated: int,
    candidates: Sequence[CandidateCard],
) -> Decision:
    """The decision when no node fits (cards or MIG instances, ``devices`` naming them): no node
    at all, the one node's reason, or every device's reasons counted over the ``evaluated`` ones."""
    if not outcomes:
        reason = f"no node with {devices} of this driver is available to this request"
    elif len(outcomes) == 1:
        reason = outcomes[0].reason or "request does not fit"
    else:
        reason = format_reasons(reasons, evaluated) or "request does not fit"
    return Decision(
        request=request.name,
        policy=request.policy,
        node_policy=request.node_policy,
        placement=None,
        reason=reason,
        candidates=tuple(candidates),
        nodes=tuple(outcomes),
    )


def place_and_allocate(
    state: ClusterState, request: PlacementRequest, *, max_candidates: int = DEFAULT_MAX_CANDIDATES
) -> Decision:
    """``place()`` and, when it succeeds, record the placement so the next request sees the usage."""
    decision = place(state, request, max_candidates=max_candidates)
    if decision.placement is not None:
        state.allocate(decision.placement)
    return decision
