"""Policy chains: ``"mutex,binpack,numa"`` parsed into filters and ordered sort keys.

Semantics (README.md, "Policy chains"): split on commas, trim whitespace, drop
duplicates, keep known names only (unknown ones are reported, not fatal); ``mutex`` and
``topology-aware`` are filters, ``binpack``/``spread``/``numa`` are sort keys in the order written;
a chain without sort keys falls back to ``spread``; a single value keeps its pre-chain meaning,
where NUMA only breaks score ties (so ``binpack`` ranks like ``binpack,numa``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    MUTEX = "mutex"
    TOPOLOGY_AWARE = "topology-aware"
    BINPACK = "binpack"
    SPREAD = "spread"
    NUMA = "numa"


class NodePolicy(StrEnum):
    """How nodes are ranked before cards are chosen (HAMi's node-scheduler-policy)."""

    BINPACK = "binpack"
    SPREAD = "spread"


FILTERS = frozenset({Policy.MUTEX, Policy.TOPOLOGY_AWARE})
SORT_KEYS = frozenset({Policy.BINPACK, Policy.SPREAD, Policy.NUMA})
KNOWN_POLICY_NAMES: tuple[str, ...] = tuple(policy.value for policy in Policy)

DEFAULT_CARD_POLICY = "spread"
DEFAULT_NODE_POLICY = NodePolicy.BINPACK


@dataclass(frozen=True, slots=True)
class PolicyChain:
    """A parsed chain. ``text`` is the canonical form (known names, de-duplicated, in order)."""

    policies: tuple[Policy, ...]
    unknown: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return ",".join(policy.value for policy in self.policies)

    @property
    def mutex(self) -> bool:
        return Policy.MUTEX in self.policies

    @property
    def topology_aware(self) -> bool:
        return Policy.TOPOLOGY_AWARE in self.policies

    @property
    def sort_keys(self) -> tuple[Policy, ...]:
        """The effective sort keys, including the spread fallback and the single-value NUMA tie-break."""
        keys = tuple(policy for policy in self.policies if policy in SORT_KEYS)
        if not keys:
            keys = (Policy.SPREAD,)
        if len(self.policies) == 1 and Policy.NUMA not in keys:
            # Single values are unchanged from before chains existed: since HAMi's #2012 fix the
            # usage score leads and the NUMA node id only breaks ties.
            keys = (*keys, Policy.NUMA)
        return keys


def parse_policy_chain(text: str | None, default: str = DEFAULT_CARD_POLICY) -> PolicyChain:
    """Parse a chain; ``None`` means "not given" and yields the default, an empty string yields no policies.

    Unknown names never fail the parse: they are returned in ``unknown`` so callers can warn
    (events, webhook warnings) while the engine ignores them, as HAMi does.
    """
    if text is None:
        text = default
    policies: list[Policy] = []
    unknown: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name in KNOWN_POLICY_NAMES:
            policy = Policy(name)
            if policy not in policies:
                policies.append(policy)
        elif name not in unknown:
            unknown.append(name)
    return PolicyChain(tuple(policies), tuple(unknown))


def parse_node_policy(text: str | None) -> NodePolicy:
    """HAMi's node policy, ``spread`` or ``binpack``; anything else is an error (HAMi silently binpacks)."""
    if text is None:
        return DEFAULT_NODE_POLICY
    name = text.strip()
    try:
        return NodePolicy(name)
    except ValueError:
        raise ValueError(f"unknown node policy {text!r}: expected 'binpack' or 'spread'") from None
