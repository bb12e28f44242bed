"""The filter-then-sort policy engine: pure Python, no Kubernetes objects, no I/O.

Typical use::

    state = ClusterState(cards)
    request = PlacementRequest(name="c1", memory=1000 * MIB, policy=parse_policy_chain("mutex,binpack"))
    decision = place_and_allocate(state, request)
    decision.node, decision.placement, decision.reason, decision.candidates
"""

from dra_driver.engine.model import (
    DEFAULT_SLOTS,
    FULL_CORES,
    MIB,
    CandidateCard,
    CardUsage,
    Decision,
    DeviceShare,
    GpuCard,
    NodeOutcome,
    Placement,
    PlacementRequest,
)
from dra_driver.engine.place import DEFAULT_MAX_CANDIDATES, place, place_and_allocate
from dra_driver.engine.policy import (
    DEFAULT_CARD_POLICY,
    DEFAULT_NODE_POLICY,
    KNOWN_POLICY_NAMES,
    NodePolicy,
    Policy,
    PolicyChain,
    parse_node_policy,
    parse_policy_chain,
)
from dra_driver.engine.reasons import Reason, format_reasons
from dra_driver.engine.score import card_score, node_score, usage_score
from dra_driver.engine.state import ClusterState, NodeState, StateError
from dra_driver.engine.weights import DEFAULT_WEIGHTS, ScoringWeights, WeightsError, parse_scoring_weights

__all__ = [
    "DEFAULT_CARD_POLICY",
    "DEFAULT_MAX_CANDIDATES",
    "DEFAULT_NODE_POLICY",
    "DEFAULT_SLOTS",
    "DEFAULT_WEIGHTS",
    "FULL_CORES",
    "KNOWN_POLICY_NAMES",
    "MIB",
    "CandidateCard",
    "CardUsage",
    "ClusterState",
    "Decision",
    "DeviceShare",
    "GpuCard",
    "NodeOutcome",
    "NodePolicy",
    "NodeState",
    "Placement",
    "PlacementRequest",
    "Policy",
    "PolicyChain",
    "Reason",
    "ScoringWeights",
    "StateError",
    "WeightsError",
    "card_score",
    "format_reasons",
    "node_score",
    "parse_node_policy",
    "parse_policy_chain",
    "parse_scoring_weights",
    "place",
    "place_and_allocate",
    "usage_score",
]
