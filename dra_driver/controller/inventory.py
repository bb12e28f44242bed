"""ResourceSlices of our driver -> engine cards, per node.

Which slices count and how one device entry reads are ``dra_driver/resource/slices.py``'s
(``current_pools``: each pool's newest generation, only when complete, of the node that owns it;
``parse_device``); this module turns the typed devices into the engine's cards. Device ``gpu-<i>``
of pool P on node N (or whatever its ``index`` attribute says) becomes
``GpuCard(node=N, index=i)``; capacities ``memory``/``cores``/``slots`` and the attributes
``productName``, ``uuid``, ``healthy``, ``isolation``, the NUMA node and ``nvlinkPeers`` fill the
card. A device's CEL input and its qualified attributes are built when first asked for (at 5,000
nodes, building them for every device on every inventory was half of a snapshot's time), once.

A MIG device (``type: mig``, issue 37) becomes a ``Device`` with its ``MigInstance`` (parent card,
GPU/compute instance ids, profile, placement), kept in ``NodeInventory.mig`` apart from the cards
under a synthetic engine index (``engine/mig.py`` ``mig_index``): only MIG classes choose among
them, and a card published whole beside its own instances is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import DeviceInput, device_input
from dra_driver.contract import SHARES_ENFORCED, DeviceId
from dra_driver.devices.model import COMPUTE_MODE_DEFAULT
from dra_driver.devices.nvlink import pair_scores, parse_nvlink_peers
from dra_driver.engine import GpuCard
from dra_driver.engine.mig import MigInstance, mig_cores
from dra_driver.resource.slices import (
    MIG_COMPUTE_INSTANCE_ATTRIBUTE,
    MIG_GPU_INSTANCE_ATTRIBUTE,
    MIG_MEMORY_SLICES_ATTRIBUTE,
    MIG_ON_DEMAND_ATTRIBUTE,
    MIG_PARENT_INDEX_ATTRIBUTE,
    MIG_PARENT_UUID_ATTRIBUTE,
    MIG_PLACEMENT_START_ATTRIBUTE,
    MIG_PROFILE_ATTRIBUTE,
    MIG_SLICES_ATTRIBUTE,
    MIG_TYPE,
    TYPE_ATTRIBUTE,
    SliceDevice,
    attribute,
    current_pools,
    parse_device,
    slice_devices,
)

log = logging.getLogger(__name__)

#: What a device that does not publish them offers: all of a GPU's compute, HAMi's default split.
DEFAULT_CORES = 100
DEFAULT_SLOTS = 10


@dataclass(frozen=True, slots=True)
class Device:
    """One published device: where it is, its card, and (built on first use) its CEL input."""

    id: DeviceId
    node: str
    card: GpuCard
    #: The device as published (``resource/slices.py``), what the CEL input is built from.
    published: SliceDevice
    #: A MIG instance (``type: mig``): given out whole, placed by ``engine/mig.py``; its ``card``
    #: is the instance seen as a whole-only card (its memory, its share of the compute), which is
    #: what quotas charge and the ledger checks.
    mig: MigInstance | None = None
    _cel: DeviceInput | None = field(default=None, init=False, repr=False, compare=False)
    _attributes: Mapping[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def pool(self) -> str:
        return self.id.pool

    @property
    def name(self) -> str:
        return self.id.device

    @property
    def taints(self) -> tuple[Mapping[str, Any], ...]:
        return self.published.taints

    @property
    def cel(self) -> DeviceInput:
        """The device as CEL selectors see it, converted on first use."""
        cel = self._cel
        if cel is None:
            cel = device_input(self.id.driver, self.published.entry)
            object.__setattr__(self, "_cel", cel)
        return cel

    @property
    def attributes(self) -> Mapping[str, Any]:
        """Attribute values by fully qualified name (``gpu.hami.io/index``), for claim constraints."""
        attributes = self._attributes
        if attributes is None:
            attributes = self.published.qualified_attributes(self.id.driver)
            object.__setattr__(self, "_attributes", attributes)
        return attributes


@dataclass(slots=True)
class NodeInventory:
    """One node's devices, by their DRA identity and by the engine's card index.

    The engine knows a card as (node, index); a slice and an allocation name it by its
    ``DeviceId`` (driver, pool, device). Both keys
    are set here, once per inventory, so a placement maps back to its device in O(1), and two
    devices that would be the same card to the engine (one index, two pools) cannot both exist.
    """

    node: str
    devices: dict[DeviceId, Device] = field(default_factory=dict)
    by_index: dict[int, Device] = field(default_factory=dict)
    #: MIG instances (issue 37), apart from the cards: only MIG classes see them.
    mig: dict[DeviceId, Device] = field(default_factory=dict)
    mig_by_index: dict[int, Device] = field(default_factory=dict)

    @property
    def cards(self) -> list[GpuCard]:
        return [device.card for device in self.devices.values()]

    @property
    def mig_instances(self) -> list[MigInstance]:
        return [device.mig for device in self.mig.values() if device.mig is not None]

    def all_devices(self) -> dict[DeviceId, Device]:
        """Cards and MIG instances together, by DRA identity."""
        return {**self.devices, **self.mig}

    def add_mig(self, device: Device) -> bool:
        """Add a MIG instance; False (and a warning) when the node lists its ids twice."""
        taken = self.mig_by_index.get(device.card.index)
        if taken is not None and taken.id != device.id:
            log.warning("node %s: MIG device %s repeats %s; ignored", self.node, device.id, taken.id)
            return False
        self.mig[device.id] = device
        self.mig_by_index[device.card.index] = device
        return True

    def add(self, device: Device) -> bool:
        """Add a device; False (and a warning) when another device of the node has its index."""
        taken = self.by_index.get(device.card.index)
        if taken is not None and taken.id != device.id:
            log.warning(
                "node %s: device %s has index %d like %s; ignored (GPUs of one node need distinct indexes)",
                self.node, device.id, device.card.index, taken.id,
            )  # fmt: skip
            return False
        self.devices[device.id] = device
        self.by_index[device.card.index] = device
        return True

    def device_at(self, index: int) -> Device:
        """The device the engine calls card ``index`` of this node (a MIG instance's synthetic one too)."""
        device = self.by_index.get(index)
        return device if device is not None else self.mig_by_index[index]


def prepare_cel(inventory: NodeInventory) -> None:
    """Convert the node's devices to their CEL inputs now, when its slices are read (the
    controller, after a slice change): the first decision that selects among them does not pay
    for every device of the cluster. A device that does not convert is left for the selection to
    report (its error is the selector's)."""
    for device in inventory.all_devices().values():
        cel = device.cel
        if cel.error is None:
            try:
                cel.activation()
            except Exception:  # reported by the selection that evaluates it
                log.debug("device %s: CEL input not prepared", device.id, exc_info=True)


def nvlink_pair_scores(text: str) -> dict[int, int]:
    """``"18:1-3;4:5"`` -> ``{1: 1800, 2: 1800, 3: 1800, 5: 400}`` (pair scores by peer index)."""
    return dict(pair_scores(parse_nvlink_peers(text)))


def _positive(value: int | None, default: int) -> int:
    return value if value is not None and value > 0 else default


def card_device(driver: str, node: str, pool: str, published: SliceDevice) -> Device | None:
    """The engine's view of one published device; None for devices that are not GPUs we can place.

    A device needs an index (attribute or name) and a positive memory capacity; cores and slots
    default to a whole GPU's 100 and HAMi's 10 splits, the UUID to ``<pool>/<device>``. An
    unknown isolation (a plugin older than the attribute) counts as not enforced: shares need
    proof. A malformed ``nvlinkPeers`` counts as no NVLink.
    """
    if published.index is None or not published.memory or published.memory <= 0:
        return None
    links: dict[int, int] = {}
    if published.nvlink_peers is not None:
        try:
            links = nvlink_pair_scores(published.nvlink_peers)
        except ValueError:
            links = {}
    card = GpuCard(
        node=node,
        index=published.index,
        memory=published.memory,
        product_name=published.product_name or "",
        uuid=published.uuid or f"{pool}/{published.name}",
        numa_node=published.numa_node,
        cores=_positive(published.cores, DEFAULT_CORES),
        slots=_positive(published.slots, DEFAULT_SLOTS),
        healthy=published.healthy is not False,
        shares_enforced=published.isolation in SHARES_ENFORCED,
        whole_only=published.compute_mode not in (None, COMPUTE_MODE_DEFAULT),
        links=links,
    )
    return Device(DeviceId(driver, pool, published.name), node, card, published)


def _int_attribute(attributes: Mapping[str, Any], name: str) -> int | None:
    value = attribute(attributes, name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def mig_device(driver: str, node: str, pool: str, published: SliceDevice) -> Device | None:
    """The engine's view of one published MIG device (``resource/mig_slices.py``); None for a
    device that is not one or lacks what placing it needs (its parent, ids, profile, memory)."""
    attributes: Mapping[str, Any] = published.entry.get("attributes") or {}
    if attribute(attributes, TYPE_ATTRIBUTE) != MIG_TYPE or not published.memory:
        return None
    parent = _int_attribute(attributes, MIG_PARENT_INDEX_ATTRIBUTE)
    gpu_instance = _int_attribute(attributes, MIG_GPU_INSTANCE_ATTRIBUTE)
    compute_instance = _int_attribute(attributes, MIG_COMPUTE_INSTANCE_ATTRIBUTE)
    profile = attribute(attributes, MIG_PROFILE_ATTRIBUTE)
    if parent is None or gpu_instance is None or compute_instance is None or not isinstance(profile, str):
        return None
    slices = _int_attribute(attributes, MIG_SLICES_ATTRIBUTE) or 1
    start = _int_attribute(attributes, MIG_PLACEMENT_START_ATTRIBUTE)
    size = _int_attribute(attributes, MIG_MEMORY_SLICES_ATTRIBUTE)
    parent_uuid = attribute(attributes, MIG_PARENT_UUID_ATTRIBUTE)
    instance = MigInstance(
        node=node,
        name=published.name,
        parent=parent,
        parent_name=published.name.split("-mig-", 1)[0],
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        profile=profile,
        memory=published.memory,
        slices=slices,
        placement_start=start if size is not None else None,
        placement_size=size if start is not None else None,
        product_name=published.product_name or "",
        uuid=published.uuid or f"{pool}/{published.name}",
        parent_uuid=parent_uuid if isinstance(parent_uuid, str) else "",
        numa_node=published.numa_node,
        healthy=published.healthy is not False,
        on_demand=attribute(attributes, MIG_ON_DEMAND_ATTRIBUTE) is True,
    )
    card = GpuCard(
        node=node,
        index=instance.index,
        memory=published.memory,
        product_name=instance.product_name,
        uuid=instance.uuid,
        numa_node=published.numa_node,
        cores=mig_cores(slices),
        slots=1,
        healthy=instance.healthy,
        whole_only=True,
    )
    return Device(DeviceId(driver, pool, published.name), node, card, published, instance)


def device_from_slice(driver: str, node: str, pool: str, entry: Mapping[str, Any]) -> Device | None:
    """:func:`card_device` of one raw ``spec.devices[]`` entry."""
    return card_device(driver, node, pool, parse_device(entry))


def build_inventory(
    slices: Iterable[Mapping[str, Any]], driver: str, previous: Mapping[str, NodeInventory] | None = None
) -> dict[str, NodeInventory]:
    """All nodes' devices from the current slices.

    ``previous`` is the inventory this one replaces: a device whose published entry is the very
    object it was built from there (its slice did not change) is kept, CEL input included, so a
    slice change costs what changed rather than every device of the cluster again.
    """
    kept = {key: device for node in (previous or {}).values() for key, device in node.all_devices().items()}
    nodes: dict[str, NodeInventory] = {}
    for (node, pool), items in current_pools(slices, driver).items():
        inventory = nodes.setdefault(node, NodeInventory(node))
        for item in items:
            for entry in slice_devices(item):
                device = kept.get(DeviceId(driver, pool, str(entry.get("name", ""))))
                if device is None or device.node != node or device.published.entry is not entry:
                    published = parse_device(entry)
                    device = card_device(driver, node, pool, published) or mig_device(
                        driver, node, pool, published
                    )
                if device is None:
                    continue
                if device.mig is not None:
                    inventory.add_mig(device)
                else:
                    inventory.add(device)
    for inventory in nodes.values():
        _drop_cards_in_mig_mode(inventory)
    return nodes


def _drop_cards_in_mig_mode(inventory: NodeInventory) -> None:
    """A card whose MIG instances are published is never placed whole nor shared: our plugin never
    publishes both, so both come from someone else's slice (or a plugin bug); the card goes."""
    parents = {device.mig.parent for device in inventory.mig.values() if device.mig is not None}
    for index in sorted(parents & set(inventory.by_index)):
        card = inventory.by_index.pop(index)
        del inventory.devices[card.id]
        log.warning(
            "node %s: %s is published whole and as MIG instances; only its MIG instances are placed",
            inventory.node, card.id,
        )  # fmt: skip
