"""Where ResourceSlices changed since the inventory was last rebuilt: the nodes whose pending pods
a slice change may help (every node of a changed pool, as a pool's newest complete generation is
what counts), or "somewhere unknown" when a slice has no node; and the slices to re-read those
nodes' devices from (``take_nodes``), so a change costs its nodes, not the whole inventory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from dra_driver.resource.slices import slice_place

S = TypeVar("S", bound=Mapping[str, object])


class SliceChanges:
    """Collects slice events between two inventory rebuilds (``ClusterCache.refresh_slices``)."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.changed = False
        self._nodes: set[str] | None = set()  # None: somewhere unknown
        self._pools: set[str] = set()

    def place(self, obj: Mapping[str, object]) -> tuple[str | None, str | None]:
        """(pool, node) of a slice of our driver; (None, None) for another driver's (not ours to
        place, left out of the inventory)."""
        place = slice_place(obj)
        if place is None or place.driver != self.driver:
            return None, None
        return place.pool, place.node

    def note(self, old: Mapping[str, object] | None, new: Mapping[str, object] | None) -> None:
        """Note where a slice changed: its node and pool (all nodes when one has no node)."""
        self.changed = True
        for obj in (old, new):
            pool, node = (None, None) if obj is None else self.place(obj)
            if pool is None:
                continue
            self._pools.add(pool)
            if node is None:
                self._nodes = None
            elif self._nodes is not None:
                self._nodes.add(node)

    def take(self, slices: Iterable[Mapping[str, object]]) -> set[str] | None:
        """The nodes where room may have appeared (None: anywhere), given the current slices; and
        start collecting afresh."""
        nodes, pools = self._nodes, self._pools
        self.changed, self._nodes, self._pools = False, set(), set()
        if nodes is None:
            return None
        return nodes | {node for pool, node in map(self.place, slices) if pool in pools and node}

    def take_nodes(self, slices: Sequence[S]) -> tuple[set[str], list[S]] | None:
        """``take``'s nodes, and the current slices of every pool published on one of them (what
        their devices are read from: a pool's completeness and owner count all its slices); None
        when anywhere."""
        placed = [(obj, *self.place(obj)) for obj in slices]
        nodes, pools = self._nodes, self._pools
        self.changed, self._nodes, self._pools = False, set(), set()
        if nodes is None:
            return None
        nodes = nodes | {node for _, pool, node in placed if pool in pools and node}
        there = {pool for _, pool, node in placed if node in nodes and pool is not None}
        return nodes, [obj for obj, pool, _ in placed if pool in there]
