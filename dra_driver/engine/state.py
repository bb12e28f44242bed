"""Indexed cluster state: cards, their usage, node scores and node rankings, updated incrementally.

Placing a request must not rescan every card of every node: nodes are kept in two sorted lists
(binpack order and spread order) keyed by their node score, and each node keeps what each healthy
card has left, so that nodes which cannot fit are rejected without the full fit checks and
scores. Allocating or releasing touches one node only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from dra_driver.engine.model import CardUsage, DeviceShare, GpuCard, Placement
from dra_driver.engine.policy import NodePolicy
from dra_driver.engine.score import node_score


class StateError(ValueError):
    """An allocation or release that does not match the state (unknown card, double release, overcommit)."""


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    """What a healthy card has left; enough to reject most non-fitting nodes without full fit checks."""

    idle: bool
    free_slot: bool
    free_memory: int
    free_cores: int
    total_memory: int
    total_cores: int


@dataclass(slots=True)
class NodeState:
    name: str
    cards: tuple[GpuCard, ...]
    usage: dict[int, CardUsage]
    score: float = 0.0
    free: tuple[FreeCapacity, ...] = ()
    #: Healthy cards without a tenant: a mutex request skips a node with too few in one comparison.
    idle_cards: int = 0

    def card(self, index: int) -> GpuCard:
        for card in self.cards:
            if card.index == index:
                return card
        raise StateError(f"node {self.name} has no gpu-{index}")

    def refresh(self) -> None:
        self.score = node_score((card, self.usage[card.index]) for card in self.cards)
        self.free = tuple(
            FreeCapacity(
                idle=usage.tenants == 0,
                free_slot=usage.tenants < card.slots,
                free_memory=card.memory - usage.used_memory,
                free_cores=card.cores - usage.used_cores,
                total_memory=card.memory,
                total_cores=card.cores,
            )
            for card in self.cards
            if card.healthy
            for usage in (self.usage[card.index],)
        )
        self.idle_cards = sum(1 for free in self.free if free.idle)


class ClusterState:
    """All nodes' cards and usage. Not thread-safe: one owner (the controller's ledger, a simulation)."""

    def __init__(self, cards: Iterable[GpuCard] = ()) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._binpack_order: list[tuple[float, str]] = []  # (-score, name): highest score first
        self._spread_order: list[tuple[float, str]] = []  # (score, name): lowest score first
        # The same two rankings of only the nodes with an idle card: what a mutex request scans,
        # so a full cluster costs it the nodes that could take it, not every node.
        self._idle_binpack_order: list[tuple[float, str]] = []
        self._idle_spread_order: list[tuple[float, str]] = []
        by_node: dict[str, list[GpuCard]] = {}
        for card in cards:
            by_node.setdefault(card.node, []).append(card)
        for name, node_cards in by_node.items():
            self.set_node(name, node_cards)

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        return self._nodes

    def set_node(self, name: str, cards: Iterable[GpuCard]) -> None:
        """Add or replace a node's inventory, keeping the usage of cards that still exist."""
        ordered = tuple(sorted(cards, key=lambda card: card.index))
        indexes = [card.index for card in ordered]
        if len(set(indexes)) != len(indexes):
            raise StateError(f"node {name} lists a GPU index twice: {indexes}")
        if any(card.node != name for card in ordered):
            raise StateError(f"node {name}: every card must belong to node {name}")
        previous = self._nodes.get(name)
        if previous is not None:
            self._unrank(previous)
        old_usage = previous.usage if previous is not None else {}
        usage = {card.index: old_usage.get(card.index, CardUsage()) for card in ordered}
        node = NodeState(name=name, cards=ordered, usage=usage)
        node.refresh()
        self._nodes[name] = node
        self._rank(node)

    def remove_node(self, name: str) -> None:
        node = self._nodes.pop(name, None)
        if node is not None:
            self._unrank(node)

    def ranked_nodes(self, policy: NodePolicy, *, with_idle_card: bool = False) -> Iterator[NodeState]:
        """Nodes in the order the node policy prefers them; ties by node name (``with_idle_card``:
        only those with a healthy card that has no tenant, in the same order).

        Do not allocate or release while iterating: the ranking is live.
        """
        if with_idle_card:
            order = self._idle_binpack_order if policy is NodePolicy.BINPACK else self._idle_spread_order
        else:
            order = self._binpack_order if policy is NodePolicy.BINPACK else self._spread_order
        for _, name in order:
            yield self._nodes[name]

    def allocate(self, placement: Placement, *, strict: bool = True) -> None:
        """Record a placement; ``strict`` refuses overcommit (the ledger passes False for observed facts)."""
        node = self._node(placement.node)
        if strict:
            self._check_capacity(node, placement.devices)
        self._apply(node, placement.devices, sign=1)

    def release(self, placement: Placement) -> None:
        """Undo ``allocate``; refuses a release that would drive usage negative (a double release)."""
        node = self._node(placement.node)
        for share in placement.devices:
            usage = node.usage[node.card(share.index).index]
            if (
                usage.tenants < share.tenants
                or usage.used_memory < share.memory
                or usage.used_cores < share.cores
            ):
                raise StateError(f"release of {node.name}/gpu-{share.index} exceeds its recorded usage")
        self._apply(node, placement.devices, sign=-1)

    def _node(self, name: str) -> NodeState:
        node = self._nodes.get(name)
        if node is None:
            raise StateError(f"unknown node {name!r}")
        return node

    @staticmethod
    def _check_capacity(node: NodeState, shares: Iterable[DeviceShare]) -> None:
        for share in shares:
            card = node.card(share.index)
            usage = node.usage[card.index]
            if (
                usage.tenants + share.tenants > card.slots
                or usage.used_memory + share.memory > card.memory
                or usage.used_cores + share.cores > card.cores
            ):
                raise StateError(f"placement overcommits {node.name}/gpu-{card.index}")

    def _apply(self, node: NodeState, shares: Iterable[DeviceShare], sign: int) -> None:
        shares = tuple(shares)
        for share in shares:
            if share.index not in node.usage:
                raise StateError(f"node {node.name} has no gpu-{share.index}")
        self._unrank(node)
        for share in shares:
            usage = node.usage[share.index]
            usage.tenants += sign * share.tenants
            usage.used_memory += sign * share.memory
            usage.used_cores += sign * share.cores
            usage.scores.clear()
        node.refresh()
        self._rank(node)

    def _orders(self, node: NodeState) -> list[tuple[list[tuple[float, str]], float]]:
        """The rankings ``node`` belongs in, with its key in each (its state as last refreshed)."""
        orders = [(self._binpack_order, -node.score), (self._spread_order, node.score)]
        if node.idle_cards:
            orders += [(self._idle_binpack_order, -node.score), (self._idle_spread_order, node.score)]
        return orders

    def _rank(self, node: NodeState) -> None:
        for order, key in self._orders(node):
            insort(order, (key, node.name))

    def _unrank(self, node: NodeState) -> None:
        for order, key in self._orders(node):
            position = bisect_left(order, (key, node.name))
            if position < len(order) and order[position] == (key, node.name):
                del order[position]
