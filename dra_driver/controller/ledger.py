"""The usage ledger: every device of our driver and what all allocated claims take from it.

Usage comes from every allocated claim's results for our driver, whoever allocated it (our
controller, kube-scheduler, a human): ``consumedCapacity`` for results with a ``shareID``, the
whole card for a result without one; ``adminAccess`` results take nothing (as in the scheduler).
The ledger keeps each claim's contribution and rebuilds only the affected node of the engine's
``ClusterState`` when a claim or a node's inventory changes, so a result that names a device not
(yet) published is kept and applied as soon as the slice appears.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dra_driver.cel.values import ValueParseError, parse_quantity
from dra_driver.contract import CORES, MEMORY, SLOTS, DeviceId
from dra_driver.controller.inventory import Device, NodeInventory
from dra_driver.engine import ClusterState, DeviceShare, Placement, StateError
from dra_driver.quota import Charge

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Use:
    """What one result takes from one device; ``None`` amounts mean the whole card."""

    device: DeviceId
    memory: int | None
    cores: int | None
    slots: int | None
    #: The claim's namespace and the result's DeviceClass: what namespace quotas count by.
    namespace: str = ""
    class_name: str = ""


def _amount(value: Any) -> int | None:
    """A consumed quantity as a whole number, rounded up.

    Our devices' request policies have whole steps (1Mi, 1 core, 1 slot), so kube-scheduler and
    we only ever write whole amounts; a fraction written by anyone else is counted up, never
    down: the ledger may then see a card as fuller than it is, never as emptier (the node's
    last-line check refuses such an allocation outright).
    """
    if value is None:
        return None
    try:
        return math.ceil(parse_quantity(str(value)))
    except ValueParseError:
        return None


def request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request name (``gpu``, or ``gpu/small`` for a firstAvailable entry) -> DeviceClass name."""
    classes: dict[str, str] = {}
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly"):
            classes[name] = str(request["exactly"].get("deviceClassName", ""))
        for sub in request.get("firstAvailable") or ():
            classes[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return classes


def claim_uses(claim: Mapping[str, Any], driver: str) -> tuple[Use, ...]:
    """The device uses recorded in a claim's ``status.allocation`` for our driver."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = [
        result
        for result in (allocation.get("devices") or {}).get("results") or ()
        if result.get("driver") == driver and not result.get("adminAccess")
    ]
    if not results:
        return ()
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    classes = request_classes(claim)
    uses = []
    for result in results:
        device = DeviceId(driver, str(result.get("pool", "")), str(result.get("device", "")))
        where = {"namespace": namespace, "class_name": classes.get(str(result.get("request", "")), "")}
        if not result.get("shareID"):
            uses.append(Use(device, None, None, None, **where))
            continue
        consumed = result.get("consumedCapacity") or {}
        uses.append(
            Use(
                device,
                _amount(consumed.get(MEMORY)) or 0,
                _amount(consumed.get(CORES)) or 0,
                _amount(consumed.get(SLOTS)) or 1,
                **where,
            )
        )
    return tuple(uses)


class Ledger:
    """Inventory + per-claim contributions -> ``ClusterState`` (single owner; not thread-safe)."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.inventory: dict[str, NodeInventory] = {}
        self._devices: dict[DeviceId, Device] = {}
        self._claims: dict[str, tuple[Use, ...]] = {}  # claim uid -> uses
        self._by_node: dict[str, set[str]] = {}  # node -> claim uids using it
        self._unplaced: set[str] = set()  # claims with a use on an unknown device
        self._by_namespace: dict[str, set[str]] = {}  # namespace -> claim uids with uses
        self.generation = 0  # bumped whenever usage or inventory changes
        self.inventory_generation = 0  # bumped whenever the inventory changes (CEL caches)

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
        self._devices = {key: device for node in nodes.values() for key, device in node.devices.items()}
        self._by_node = {}
        self._unplaced = set()
        for uid, uses in self._claims.items():
            nodes_used = self._index(uid, uses)
            if uid in previously_unplaced:
                changed |= nodes_used
        for name in changed:
            self._rebuild(name)
        self.generation += 1
        self.inventory_generation += 1

    def device_name(self, node: str, index: int) -> str:
        """The published name of the engine's card ``index`` on ``node`` (``gpu-<index>`` if unknown)."""
        inventory = self.inventory.get(node)
        device = inventory.by_index.get(index) if inventory is not None else None
        return device.id.device if device is not None else f"gpu-{index}"

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
        affected |= self._index(uid, uses)
        for node in affected:
            self._rebuild(node)
        self.generation += 1

    def remove_claim(self, uid: str) -> None:
        self.set_claim(uid, ())

    def claims(self) -> Mapping[str, tuple[Use, ...]]:
        return self._claims

    def namespace_charges(self, namespace: str) -> list[Charge]:
        """What every allocated claim of ``namespace`` (assumed ones included) charges its quotas.

        A whole-card use charges the card's memory and cores (nothing, while the card's slice is
        unknown: it is charged once the slice appears).
        """
        charges = []
        for uid in sorted(self._by_namespace.get(namespace, ())):
            for use in self._claims.get(uid, ()):
                charges.append(self.charge(use))
        return charges

    def charge(self, use: Use) -> Charge:
        memory, cores = use.memory, use.cores
        if memory is None or cores is None:
            device = self._devices.get(use.device)
            card_memory, card_cores = (device.card.memory, device.card.cores) if device else (0, 0)
            memory = card_memory if memory is None else memory
            cores = card_cores if cores is None else cores
        return Charge(use.class_name, use.device, memory, cores)

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
        card = device.card
        problems = []
        if len(users) > 1 and any(use.memory is None for _, use in users):
            problems.append(f"a whole-card allocation shares it with {len(users) - 1} other(s)")
        memory = sum(card.memory if use.memory is None else use.memory for _, use in users)
        cores = sum(card.cores if use.cores is None else use.cores for _, use in users)
        slots = sum(card.slots if use.slots is None else use.slots for _, use in users)
        for what, used, total in (("memory", memory, card.memory), ("cores", cores, card.cores),
                                  ("slots", slots, card.slots)):  # fmt: skip
            if used > total:
                problems.append(f"{what} {used} > {total}")
        return problems, [uid for uid, _ in users]

    # --- engine state ------------------------------------------------------------------------
    def shares_on(self, node: str) -> list[DeviceShare]:
        shares = []
        for uid in sorted(self._by_node.get(node, ())):
            for use in self._claims.get(uid, ()):
                device = self._devices.get(use.device)
                if device is None or device.node != node:
                    continue
                card = device.card
                if use.memory is None:
                    shares.append(DeviceShare(card.index, card.memory, card.cores, card.slots))
                else:
                    shares.append(DeviceShare(card.index, use.memory, use.cores or 0, use.slots or 1))
        return shares

    def _rebuild(self, node: str) -> None:
        """Reset one node of the engine state to inventory + recorded contributions."""
        self.state.remove_node(node)
        inventory = self.inventory.get(node)
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
        not, the nodes touched are rebuilt from recorded claims only. What is written and not yet
        observed is ``controller/assumed.py``'s, which records it here as claim uses.
        """
        trial = Trial(self.state)
        try:
            yield trial
        finally:
            for node in trial.touched:
                self._rebuild(node)


class Trial:
    """The tentative side of one plan attempt (``Ledger.trial``)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.touched: set[str] = set()

    def allocate(self, placement: Placement) -> None:
        self.state.allocate(placement)
        self.touched.add(placement.node)


def _cards(inventory: NodeInventory | None) -> tuple[Any, ...]:
    if inventory is None:
        return ()
    return tuple(sorted((key, device.card) for key, device in inventory.devices.items()))
