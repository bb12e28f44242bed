"""The usage ledger: every device of our driver and what all allocated claims take from it.

Usage comes from every allocated claim's results for our driver, whoever allocated it (our
controller, kube-scheduler, a human), by the consumable-capacity rule of
``dra_driver/resource/capacity.py``: ``consumedCapacity`` for results with a ``shareID``, the
whole card for a result without one; ``adminAccess`` results take nothing (as in the scheduler).
The ledger keeps each claim's contribution and rebuilds only the affected node of the engine's
``ClusterState`` when a claim or a node's inventory changes, so a result that names a device not
(yet) published is kept and applied as soon as the slice appears.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.controller.changelog import ChangeLog
from dra_driver.controller.inventory import Device, NodeInventory
from dra_driver.engine import ClusterState, DeviceShare, GpuCard, Placement, StateError
from dra_driver.engine.mig import MigState
from dra_driver.quota import Charge
from dra_driver.quota.usage import charged_cores
from dra_driver.resource.capacity import Capacity
from dra_driver.resource.slices import device_name
from dra_driver.resource.uses import Use

log = logging.getLogger(__name__)


def card_capacity(card: GpuCard) -> Capacity:
    """A card's consumable totals."""
    return Capacity(card.memory, card.cores, card.slots)


@dataclass(slots=True)
class LedgerChanges:
    """What changed since the last ``Ledger.take_changes`` (for the per-card and per-claim series):
    nodes whose engine state was rebuilt, nodes whose devices changed, claims whose uses changed."""

    nodes: set[str] = field(default_factory=set)
    inventory_nodes: set[str] = field(default_factory=set)
    claims: set[str] = field(default_factory=set)


class Ledger:
    """Inventory + per-claim contributions -> ``ClusterState`` (single owner; not thread-safe)."""

    def __init__(self) -> None:
        self.state = ClusterState()
        #: MIG instances and which are in use (issue 37), rebuilt with the node like ``state``.
        self.mig_state = MigState()
        self.inventory: dict[str, NodeInventory] = {}
        self._devices: dict[DeviceId, Device] = {}
        self._claims: dict[str, tuple[Use, ...]] = {}  # claim uid -> uses
        self._by_node: dict[str, set[str]] = {}  # node -> claim uids using it
        self._unplaced: set[str] = set()  # claims with a use on an unknown device
        self._by_namespace: dict[str, set[str]] = {}  # namespace -> claim uids with uses
        self.generation = 0  # bumped whenever usage or inventory changes
        #: The nodes whose devices changed, batch by batch (the CEL selections catch up with it).
        self.inventory_log = ChangeLog()
        self._changes = LedgerChanges()
        #: Capacity held for a nominated preemptor while its victims terminate (key -> uses):
        #: counted on its node like an allocation, but by no quota, claim series or overcommit
        #: report (controller/nomination.py).
        self._holds: dict[str, tuple[Use, ...]] = {}
        #: Claim uids and hold keys left out of the engine state for now (``hiding``).
        self._hidden: frozenset[str] = frozenset()
        #: Rebuilds per node: a trial undoes its own allocations only on nodes not rebuilt since.
        self._rebuilds: dict[str, int] = {}

    @property
    def inventory_generation(self) -> int:
        """Bumped whenever the inventory changes (``inventory_log``'s position)."""
        return self.inventory_log.position

    def take_changes(self) -> LedgerChanges:
        """What changed since the last call (one reader: the controller's per-card series)."""
        changes, self._changes = self._changes, LedgerChanges()
        return changes

    def claims_on(self, node: str) -> frozenset[str]:
        """The uids of the claims with a use on ``node``'s devices."""
        return frozenset(self._by_node.get(node, ()))

    # --- inventory ---------------------------------------------------------------------------
    def set_inventory(self, nodes: Mapping[str, NodeInventory]) -> None:
        """Replace the whole inventory (after a slice change); rebuild the nodes that changed.

        Claims are re-indexed because a device may have appeared (a claim allocated before its
        slice was seen) or moved; nodes whose cards did not change keep their state.
        """
        names = set(self.inventory) | set(nodes)
        changed = {name for name in names if _cards(self.inventory.get(name)) != _cards(nodes.get(name))}
        previously_unplaced = set(self._unplaced)
        self.inventory = dict(nodes)
        self._devices = {key: device for node in nodes.values() for key, device in node.all_devices().items()}
        self._by_node = {}
        self._unplaced = set()
        for uid, uses in self._claims.items():
            nodes_used = self._index(uid, uses)
            if uid in previously_unplaced:
                changed |= nodes_used
        for name in changed:
            self._rebuild(name)
        self.generation += 1
        self._changes.inventory_nodes |= names
        self.inventory_log.note_all()

    def update_nodes(self, nodes: Mapping[str, NodeInventory | None]) -> None:
        """Replace the devices of these nodes only (None: it has none now), after a slice change
        there; every other node, its claims and its CEL selections are left as they are.

        The same result as ``set_inventory`` with the whole new inventory: the claims re-indexed
        are those on these nodes and those whose device was not published (it may be now).
        """
        if not nodes:
            return
        changed = {name for name, new in nodes.items() if _cards(self.inventory.get(name)) != _cards(new)}
        previously_unplaced = set(self._unplaced)
        affected = set(previously_unplaced)
        for name in nodes:
            affected |= self._by_node.get(name, set())
        for uid in affected:  # out of the index where its devices were (before they change)
            for name in self._nodes_of(uid):
                self._by_node.get(name, set()).discard(uid)
        for name in nodes:
            for key in self.inventory.pop(name, NodeInventory(name)).all_devices():
                self._devices.pop(key, None)
        for name, new in nodes.items():
            if new is not None:
                self.inventory[name] = new
                self._devices.update(new.all_devices())
        for uid in affected:
            nodes_used = self._index(uid, self._claims.get(uid, ()))
            if uid in previously_unplaced:
                changed |= nodes_used
        for name in changed:
            self._rebuild(name)
        self.generation += 1
        self._changes.inventory_nodes |= set(nodes)
        self.inventory_log.note(nodes)

    def device_name(self, node: str, index: int) -> str:
        """The published name of the engine's card ``index`` on ``node`` (``gpu-<index>`` if unknown)."""
        inventory = self.inventory.get(node)
        device = None
        if inventory is not None:
            device = inventory.by_index.get(index) or inventory.mig_by_index.get(index)
        return device.id.device if device is not None else device_name(index)

    def device(self, device: DeviceId) -> Device | None:
        return self._devices.get(device)

    # --- claims ------------------------------------------------------------------------------
    def set_claim(self, uid: str, uses: tuple[Use, ...]) -> None:
        if self._claims.get(uid, ()) == uses:
            return
        affected = self._nodes_of(uid)
        for previous in {use.namespace for use in self._claims.get(uid, ())}:
            self._by_namespace.get(previous, set()).discard(uid)
        if uses:
            self._claims[uid] = uses
            for use in uses:
                self._by_namespace.setdefault(use.namespace, set()).add(uid)
        else:
            self._claims.pop(uid, None)
        for node in affected:
            self._by_node.get(node, set()).discard(uid)
        added = self._index(uid, uses)
        if not affected and not self._add_to_state(uid, uses, added):
            affected |= added
        for node in affected:
            self._rebuild(node)
        self.generation += 1
        self._changes.claims.add(uid)

    def _add_to_state(self, uid: str, uses: tuple[Use, ...], nodes: set[str]) -> bool:
        """Count a new claim's shares on the engine state directly, as ``_rebuild`` would count
        them (``strict=False``: observed facts), without recounting every other claim on its nodes:
        a busy node holds dozens of shares and each placement used to rebuild it twice (the trial's
        end, then this). False, with nothing changed, where only a rebuild is right: a hidden
        claim, a MIG instance, a node the engine state does not hold."""
        if uid in self._hidden:
            return False
        for use in uses:
            device = self._devices.get(use.device)
            if device is not None and (device.mig is not None or device.node not in self.state.nodes):
                return False
        for node in nodes:
            shares = tuple(self._shares(uses, node))
            if shares:
                self.state.allocate(Placement(node, shares), strict=False)
            self._changes.nodes.add(node)
        return True

    def remove_claim(self, uid: str) -> None:
        self.set_claim(uid, ())

    def claims(self) -> Mapping[str, tuple[Use, ...]]:
        return self._claims

    def namespace_charges(self, namespace: str) -> list[Charge]:
        """What every allocated claim of ``namespace`` (assumed ones included) charges its quotas.

        A whole-card use charges the card's memory and cores (nothing, while the card's slice is
        unknown: it is charged once the slice appears); a share without an SM limit charges the
        card's cores too (``charged_cores``).
        """
        charges = []
        for uid in sorted(self._by_namespace.get(namespace, ())):
            for use in self._claims.get(uid, ()):
                charges.append(self.charge(use))
        return charges

    def charge(self, use: Use) -> Charge:
        device = self._devices.get(use.device)
        if device is None:
            return Charge(use.class_name, use.device, 0, 0)
        card = card_capacity(device.card)
        taken = use.consumption.of(card)
        return Charge(use.class_name, use.device, taken.memory, charged_cores(taken.cores, card.cores))

    def _index(self, uid: str, uses: Iterable[Use]) -> set[str]:
        nodes = set()
        self._unplaced.discard(uid)
        for use in uses:
            device = self._devices.get(use.device)
            if device is None:
                self._unplaced.add(uid)
                continue
            nodes.add(device.node)
            self._by_node.setdefault(device.node, set()).add(uid)
        return nodes

    def _nodes_of(self, uid: str) -> set[str]:
        nodes = set()
        for use in self._claims.get(uid, ()):
            device = self._devices.get(use.device)
            if device is not None:
                nodes.add(device.node)
        return nodes

    def overcommit(self, device_id: DeviceId) -> tuple[list[str], list[str]]:
        """``(problems, claim uids)`` of one device: what its recorded uses exceed, and who uses it.

        Counts every allocated claim of the driver, whoever allocated it; a use without amounts
        (no shareID) takes the whole card, so it may not share the card with anything.
        """
        device = self._devices.get(device_id)
        if device is None:
            return [], []
        users = [
            (uid, use)
            for uid in sorted(self._by_node.get(device.node, ()))
            for use in self._claims.get(uid, ())
            if use.device == device_id
        ]
        card = card_capacity(device.card)
        problems = []
        if len(users) > 1 and any(use.consumption.whole_device for _, use in users):
            problems.append(f"a whole-card allocation shares it with {len(users) - 1} other(s)")
        taken = [use.consumption.of(card) for _, use in users]
        memory = sum(amounts.memory for amounts in taken)
        cores = sum(amounts.cores for amounts in taken)
        slots = sum(amounts.slots for amounts in taken)
        for what, used, total in (("memory", memory, card.memory), ("cores", cores, card.cores),
                                  ("slots", slots, card.slots)):  # fmt: skip
            if used > total:
                problems.append(f"{what} {used} > {total}")
        return problems, [uid for uid, _ in users]

    # --- holds and what-ifs -------------------------------------------------------------------
    def hold(self, key: str, uses: tuple[Use, ...]) -> None:
        """Count ``uses`` on their nodes under ``key`` (replacing what ``key`` held before), as if
        allocated: capacity kept for a preemptor while its victims terminate. A use of a device
        not published (yet) counts once it is."""
        if self._holds.get(key, ()) == uses:
            return
        affected = self._hold_nodes(key)
        if uses:
            self._holds[key] = uses
        else:
            self._holds.pop(key, None)
        for node in affected | self._hold_nodes(key):
            self._rebuild(node)
        self.generation += 1

    def unhold(self, key: str) -> None:
        self.hold(key, ())

    def holds(self) -> Mapping[str, tuple[Use, ...]]:
        return self._holds

    def _hold_nodes(self, key: str) -> set[str]:
        devices = (self._devices.get(use.device) for use in self._holds.get(key, ()))
        return {device.node for device in devices if device is not None}

    @contextmanager
    def hiding(self, keys: Iterable[str]) -> Iterator[None]:
        """The engine state without the claims (by uid) and holds (by key) of ``keys``, until the
        block ends: what a pod could get if those went (a preemption's what-if), or a hold of
        lower priority than the pod being planned. Nested blocks hide both sets."""
        added = frozenset(keys) - self._hidden
        if not added:
            yield
            return
        nodes = set()
        for key in added:
            nodes |= self._nodes_of(key) | self._hold_nodes(key)
        previous = self._hidden
        self._hidden = previous | added
        try:
            for node in nodes:
                self._rebuild(node)
            yield
        finally:
            self._hidden = previous
            for node in nodes:
                self._rebuild(node)

    # --- engine state ------------------------------------------------------------------------
    def shares_on(self, node: str) -> list[DeviceShare]:
        """What the claims (and holds) counted on ``node`` take from its cards (MIG instances:
        ``mig_in_use``)."""
        shares: list[DeviceShare] = []
        for uid in sorted(self._by_node.get(node, ())):
            if uid in self._hidden:
                continue
            shares.extend(self._shares(self._claims.get(uid, ()), node))
        return shares + self.held_on(node)

    def held_on(self, node: str) -> list[DeviceShare]:
        """What the holds counted on ``node`` take (in the engine state, not allocated: the
        per-card metrics leave them out)."""
        shares: list[DeviceShare] = []
        for key in sorted(self._holds):
            if key not in self._hidden:
                shares.extend(self._shares(self._holds[key], node))
        return shares

    def _shares(self, uses: Iterable[Use], node: str) -> Iterator[DeviceShare]:
        for use in uses:
            device = self._devices.get(use.device)
            if device is None or device.node != node or device.mig is not None:
                continue
            taken = use.consumption.of(card_capacity(device.card))
            yield DeviceShare(device.card.index, taken.memory, taken.cores, taken.slots)

    def mig_in_use(self, node: str) -> set[int]:
        """The engine indexes of ``node``'s MIG instances that a counted claim or hold uses (admin
        access takes nothing, as for cards)."""
        uses = [
            use
            for uid in self._by_node.get(node, ())
            if uid not in self._hidden
            for use in self._claims.get(uid, ())
        ]
        uses += [use for key, held in self._holds.items() if key not in self._hidden for use in held]
        used = set()
        for use in uses:
            device = self._devices.get(use.device)
            if device is not None and device.node == node and device.mig is not None:
                used.add(device.card.index)
        return used

    def _rebuild(self, node: str) -> None:
        """Reset one node of the engine state to inventory + recorded contributions."""
        self._rebuilds[node] = self._rebuilds.get(node, 0) + 1
        self._changes.nodes.add(node)
        self.state.remove_node(node)
        inventory = self.inventory.get(node)
        if inventory is not None and inventory.mig:
            self.mig_state.set_node(node, inventory.mig_instances, self.mig_in_use(node))
        else:
            self.mig_state.remove_node(node)
        if inventory is None or not inventory.devices:
            return
        try:
            self.state.set_node(node, inventory.cards)
        except StateError as err:
            log.warning("node %s: inconsistent inventory, ignored: %s", node, err)
            return
        shares = self.shares_on(node)
        if shares:
            # Observed facts are recorded even when they overcommit (someone else allocated them).
            self.state.allocate(Placement(node, tuple(shares)), strict=False)

    @contextmanager
    def trial(self) -> Iterator[Trial]:
        """Tentative allocations for one plan attempt, undone when the attempt ends.

        A pod's later requests must see its earlier ones (two requests never take the same share),
        so the planner allocates them on the engine state through the trial; on exit, normal or
        not, they are released again (``Trial.undo``; a node it cannot undo exactly is rebuilt from
        recorded claims). What is written and not yet
        observed is ``controller/assumed.py``'s, which records it here as claim uses.
        """
        trial = Trial(self.state, self.mig_state, self._rebuilds)
        try:
            yield trial
        finally:
            for node in trial.undo():
                self._rebuild(node)


class Trial:
    """The tentative side of one plan attempt (``Ledger.trial``)."""

    def __init__(self, state: ClusterState, mig_state: MigState, rebuilds: Mapping[str, int]) -> None:
        self.state = state
        self.mig_state = mig_state
        #: The ledger's rebuild count per node, read live.
        self._rebuilds = rebuilds
        #: What this attempt allocated on cards, in order, with the node's rebuild count then.
        self._placements: list[tuple[Placement, int]] = []
        self._mig_nodes: set[str] = set()

    def allocate(self, placement: Placement) -> None:
        self.state.allocate(placement)
        self._placements.append((placement, self._rebuilds.get(placement.node, 0)))

    def allocate_mig(self, placement: Placement) -> None:
        """Mark a MIG placement's instances in use for the rest of the attempt."""
        self.mig_state.allocate(placement)
        self._mig_nodes.add(placement.node)

    def undo(self) -> set[str]:
        """Release this attempt's card allocations, newest first; the nodes that must be rebuilt
        instead: MIG placements, and nodes rebuilt since the attempt allocated there (the
        allocation is gone already)."""
        rebuild = set(self._mig_nodes)
        for placement, rebuilds in reversed(self._placements):
            node = placement.node
            if node in rebuild or self._rebuilds.get(node, 0) != rebuilds:
                rebuild.add(node)
                continue
            try:
                self.state.release(placement)
            except StateError:
                rebuild.add(node)
        self._placements.clear()
        return rebuild


def _cards(inventory: NodeInventory | None) -> tuple[Any, ...]:
    if inventory is None:
        return ()
    return tuple(sorted((key, device.card) for key, device in inventory.all_devices().items()))
