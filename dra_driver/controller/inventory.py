"""ResourceSlices of our driver -> engine cards and CEL inputs, per node.

Only the newest generation of each pool counts, and only complete pools (as many slices at that
generation as ``resourceSliceCount`` says), as kube-scheduler does. Slices are grouped by
(node, pool), and a pool belongs to one node: a slice of node A naming node B's pool would
otherwise replace B's devices (or, with a higher generation, hide them), so every node but the
pool's owner is ignored with a warning. Device ``gpu-<i>`` of pool P on
node N becomes ``GpuCard(node=N, index=i)``; capacities ``memory``/``cores``/``slots`` and the
attributes ``productName``, ``uuid``, ``healthy``, ``resource.kubernetes.io/numaNode`` and
``nvlinkPeers`` fill the card. CEL inputs are converted once here, when a slice changes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import DeviceInput, device_input
from dra_driver.cel.values import ValueParseError, parse_quantity
from dra_driver.contract import ISOLATION_ATTRIBUTE, SHARES_ENFORCED, DeviceId
from dra_driver.devices.nvlink import pair_scores, parse_nvlink_peers
from dra_driver.engine import GpuCard

log = logging.getLogger(__name__)

NUMA_ATTRIBUTES = ("resource.kubernetes.io/numaNode", "numaNode")
_DEVICE_NAME = re.compile(r"^gpu-(\d+)$")


@dataclass(frozen=True, slots=True)
class Device:
    """One published device: where it is, its card and its CEL input."""

    id: DeviceId
    node: str
    card: GpuCard
    cel: DeviceInput
    taints: tuple[Mapping[str, Any], ...] = ()
    #: Attribute values by fully qualified name (``gpu.hami.io/index``), for claim constraints.
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pool(self) -> str:
        return self.id.pool

    @property
    def name(self) -> str:
        return self.id.device


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

    @property
    def cards(self) -> list[GpuCard]:
        return [device.card for device in self.devices.values()]

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
        """The device the engine calls card ``index`` of this node."""
        return self.by_index[index]


def _attribute(attributes: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = attributes.get(name)
        if isinstance(value, Mapping):
            for kind in ("int", "string", "bool", "version"):
                if kind in value:
                    return value[kind]
    return None


def _capacity(capacity: Mapping[str, Any], name: str) -> int | None:
    value = (capacity.get(name) or {}).get("value")
    if value is None:
        return None
    try:
        amount = parse_quantity(str(value))
    except ValueParseError:
        return None
    return int(amount)


def nvlink_pair_scores(text: str) -> dict[int, int]:
    """``"18:1-3;4:5"`` -> ``{1: 1800, 2: 1800, 3: 1800, 5: 400}`` (pair scores by peer index)."""
    return dict(pair_scores(parse_nvlink_peers(text)))


def device_from_slice(driver: str, node: str, pool: str, entry: Mapping[str, Any]) -> Device | None:
    """Convert one ``spec.devices[]`` entry; None for devices that are not GPUs we can place."""
    name = str(entry.get("name", ""))
    attributes = entry.get("attributes") or {}
    capacity = entry.get("capacity") or {}
    index = _attribute(attributes, "index")
    if not isinstance(index, int):
        match = _DEVICE_NAME.match(name)
        if match is None:
            return None
        index = int(match.group(1))
    memory = _capacity(capacity, "memory")
    if not memory or memory <= 0:
        return None
    cores = _capacity(capacity, "cores") or 100
    slots = _capacity(capacity, "slots") or 10
    numa = _attribute(attributes, *NUMA_ATTRIBUTES)
    healthy = _attribute(attributes, "healthy")
    isolation = _attribute(attributes, ISOLATION_ATTRIBUTE)
    uuid = _attribute(attributes, "uuid")
    links: dict[int, int] = {}
    peers = _attribute(attributes, "nvlinkPeers")
    if isinstance(peers, str):
        try:
            links = nvlink_pair_scores(peers)
        except ValueError:
            links = {}
    card = GpuCard(
        node=node,
        index=index,
        memory=memory,
        product_name=str(_attribute(attributes, "productName") or ""),
        uuid=str(uuid) if uuid else f"{pool}/{name}",
        numa_node=numa if isinstance(numa, int) else None,
        cores=cores,
        slots=slots,
        healthy=healthy is not False,
        # Unknown (a plugin older than the attribute) counts as not enforced: shares need proof.
        shares_enforced=isolation in SHARES_ENFORCED,
        links=links,
    )
    qualified = {
        (key if "/" in key else f"{driver}/{key}"): next(iter(value.values()), None)
        for key, value in attributes.items()
        if isinstance(value, Mapping) and value
    }
    return Device(
        DeviceId(driver, pool, name),
        node,
        card,
        device_input(driver, entry),
        tuple(entry.get("taints") or ()),
        qualified,
    )


#: A pool as published by one node: (spec.nodeName, spec.pool.name).
PoolKey = tuple[str, str]


def complete_pools(
    slices: Iterable[Mapping[str, Any]], driver: str
) -> dict[PoolKey, list[Mapping[str, Any]]]:
    """Our slices by (node, pool), each pool of its owner only, at its newest generation if complete."""
    result = {}
    for key, items in owned_pools(_by_node_and_pool(slices, driver)).items():
        current = _newest_complete(items)
        if current is not None:
            result[key] = current
    return result


def _by_node_and_pool(
    slices: Iterable[Mapping[str, Any]], driver: str
) -> dict[PoolKey, list[Mapping[str, Any]]]:
    grouped: dict[PoolKey, list[Mapping[str, Any]]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver or not spec.get("nodeName"):
            continue
        key = (str(spec["nodeName"]), str((spec.get("pool") or {}).get("name", "")))
        grouped.setdefault(key, []).append(item)
    return grouped


def _newest_complete(items: list[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
    """The slices of the newest generation when there are as many as ``resourceSliceCount`` says."""
    newest = max(int(item["spec"]["pool"].get("generation", 0)) for item in items)
    current = [item for item in items if int(item["spec"]["pool"].get("generation", 0)) == newest]
    expected = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
    return current if len(current) == expected else None


def pool_owner(pool: str, nodes: Iterable[str]) -> str:
    """The node a pool published by several ``nodes`` belongs to.

    The node it is named after (our plugin publishes pool name = node name, ``<node>/...`` for
    other layouts), else the first node by name, so the choice never depends on the order in which
    slices arrive.
    """
    candidates = sorted(nodes)
    named = [node for node in candidates if pool == node or pool.startswith(f"{node}/")]
    return named[0] if named else candidates[0]


def owned_pools(pools: Mapping[PoolKey, list[Mapping[str, Any]]]) -> dict[PoolKey, list[Mapping[str, Any]]]:
    """``pools`` without the slices of nodes that publish a pool another node owns (warned).

    Decided on every slice, complete or not, so a node's pool that is being updated (for a moment
    incomplete) is not handed to another node that publishes the same name.
    """
    nodes_by_pool: dict[str, list[str]] = {}
    for node, pool in pools:
        nodes_by_pool.setdefault(pool, []).append(node)
    result = {}
    for (node, pool), items in pools.items():
        owner = pool_owner(pool, nodes_by_pool[pool])
        if node != owner:
            log.warning(
                "pool %s is published by node %s and by node %s; ignoring the slices of node %s "
                "(a pool belongs to one node: the one it is named after, else the first by name)",
                pool, owner, node, node,
            )  # fmt: skip
            continue
        result[(node, pool)] = items
    return result


def build_inventory(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, NodeInventory]:
    """All nodes' devices from the current slices."""
    nodes: dict[str, NodeInventory] = {}
    for (node, pool), items in complete_pools(slices, driver).items():
        inventory = nodes.setdefault(node, NodeInventory(node))
        for item in items:
            for entry in item["spec"].get("devices") or ():
                device = device_from_slice(driver, node, pool, entry)
                if device is not None:
                    inventory.add(device)
    return nodes
