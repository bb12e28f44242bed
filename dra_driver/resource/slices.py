"""Our driver's ResourceSlices (resource.k8s.io/v1): the names written once, the devices read once.

The slices are built beside this module (``slice_builder.py``, for the kubelet plugin, ``devices``
and the fake nodes), and published by the kubelet plugin; the controller's
inventory (``dra_driver/controller/inventory.py``, hence ``explain`` and ``simulate
--from-cluster``) and ``top`` read them. What both sides must agree on lives here:

* **device names**: ``gpu-<n>`` (:func:`device_name`), ``n`` the GPU's index, or its minor number
  on NVML nodes; the ``index`` attribute is authoritative, the name only a fallback
  (:func:`device_index`);
* **attribute and capacity names** (the ``*_ATTRIBUTE`` constants; unqualified names live in the
  driver's domain) and the **capacities with their request policies** (:func:`capacity_entries`):
  ``memory`` in bytes (min 1Mi, step 1Mi, default the whole card), ``cores`` in percent of one GPU
  (0..cores, step 1, default 0) and ``slots`` (tenants; 1..slots, default 1);
* **one device entry -> a typed device** (:func:`parse_device`): each fact read once, whatever
  its absence means decided by the reader;
* **which slices count** (:func:`current_pools`): kube-scheduler's rule, each pool's newest
  ``generation`` and only when complete (as many slices as ``resourceSliceCount`` says), plus
  ours: a pool belongs to one node (a slice of node A naming node B's pool is ignored, warned).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import CORES, ISOLATION_ATTRIBUTE, MEMORY, SLOTS
from dra_driver.quantity import MIB, floor_quantity, format_bytes

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]

# --- device names ----------------------------------------------------------------------------
DEVICE_NAME_PREFIX = "gpu-"


def device_name(number: int) -> str:
    """The published name of GPU ``number`` (its index, or its minor number on NVML nodes)."""
    return f"{DEVICE_NAME_PREFIX}{number}"


def device_index(name: str) -> int | None:
    """Inverse of :func:`device_name`: ``gpu-3`` -> 3; None for any other name."""
    number = name.removeprefix(DEVICE_NAME_PREFIX)
    if number == name or not number.isascii() or not number.isdigit():
        return None
    return int(number)


# --- attribute names (unqualified: the driver's domain) ---------------------------------------
TYPE_ATTRIBUTE = "type"
INDEX_ATTRIBUTE = "index"
MINOR_ATTRIBUTE = "minor"
UUID_ATTRIBUTE = "uuid"
PRODUCT_NAME_ATTRIBUTE = "productName"
BRAND_ATTRIBUTE = "brand"
ARCHITECTURE_ATTRIBUTE = "architecture"
CUDA_COMPUTE_CAPABILITY_ATTRIBUTE = "cudaComputeCapability"
DRIVER_VERSION_ATTRIBUTE = "driverVersion"
CUDA_DRIVER_VERSION_ATTRIBUTE = "cudaDriverVersion"
HEALTHY_ATTRIBUTE = "healthy"
#: Whether anything watches the GPU's health (false: health checks off, or NVML offers no XIDs).
HEALTH_MONITORED_ATTRIBUTE = "healthMonitored"
#: NVML's compute mode as nvidia-smi names it; any but ``Default`` makes the card whole-only.
COMPUTE_MODE_ATTRIBUTE = "computeMode"
NVLINK_PEERS_ATTRIBUTE = "nvlinkPeers"
#: Standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute).
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
#: Read as well as the standard name: what plugins published before it existed.
LEGACY_NUMA_NODE_ATTRIBUTE = "numaNode"
#: The value of ``type``.
GPU_TYPE = "gpu"
#: MIG devices (issue 37): ``type`` is ``mig``; a MIG device has no ``index`` of its own (the
#: controller's inventory keeps it apart from the cards, ``controller/inventory.py`` ``mig_device``)
#: and names its card by the ``parent*`` attributes. Its ``profile`` is CUDA's (``1g.10gb``, ``1c.3g.40gb``).
MIG_TYPE = "mig"
MIG_PROFILE_ATTRIBUTE = "profile"
MIG_PARENT_UUID_ATTRIBUTE = "parentUUID"
MIG_PARENT_INDEX_ATTRIBUTE = "parentIndex"
MIG_PARENT_MINOR_ATTRIBUTE = "parentMinor"
MIG_PARENT_PCI_BUS_ID_ATTRIBUTE = "parentPciBusID"
MIG_GPU_INSTANCE_ATTRIBUTE = "gpuInstance"
MIG_COMPUTE_INSTANCE_ATTRIBUTE = "computeInstance"
MIG_SLICES_ATTRIBUTE = "slices"
MIG_MULTIPROCESSORS_ATTRIBUTE = "multiprocessors"
MIG_PLACEMENT_START_ATTRIBUTE = "placementStart"
MIG_MEMORY_SLICES_ATTRIBUTE = "memorySlices"
#: true on a possible placement of a card in MIG on demand (no instance yet; created at prepare).
MIG_ON_DEMAND_ATTRIBUTE = "onDemand"
#: The value kinds of a ``DeviceAttribute`` (exactly one is set).
ATTRIBUTE_KINDS = ("int", "bool", "string", "version")


# --- capacities --------------------------------------------------------------------------------
def capacity_entries(memory: int, cores: int, slots: int) -> dict[str, dict[str, Any]]:
    """The ``capacity`` of a GPU with ``memory`` bytes (published in whole MiB), cores and slots.

    The request policies are what kube-scheduler (and our controller) round a request to
    (``dra_driver/resource/capacity.py``): memory in 1Mi steps from 1Mi, the whole card when not
    asked for, so a claim without amounts gets the card to itself; cores in steps of 1, none
    when not asked for; one slot per allocation.
    """
    whole_mib = format_bytes((memory // MIB) * MIB)
    return {
        MEMORY: {
            "value": whole_mib,
            "requestPolicy": {"default": whole_mib, "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        CORES: {
            "value": str(cores),
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": str(cores), "step": "1"}},
        },
        SLOTS: {"value": str(slots), "requestPolicy": _slots_policy(slots)},
    }


def _slots_policy(slots: int) -> dict[str, Any]:
    # The API requires min + step <= value, so a card that allows one tenant gets no step.
    if slots >= 2:
        return {"default": "1", "validRange": {"min": "1", "max": str(slots), "step": "1"}}
    return {"default": "1", "validRange": {"min": "1", "max": "1"}}


# --- one device ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One ``spec.devices[]`` entry of our slices, each fact typed; None where it is not published."""

    name: str
    #: The ``index`` attribute, else the number in the name (``gpu-<n>``), else None.
    index: int | None
    uuid: str | None
    product_name: str | None
    healthy: bool | None
    isolation: str | None
    numa_node: int | None
    nvlink_peers: str | None
    #: Capacities as whole numbers, rounded down (a device never offers more than it publishes).
    memory: int | None
    cores: int | None
    slots: int | None
    taints: tuple[Obj, ...]
    #: The entry as published (attributes by their names, for CEL and claim constraints).
    entry: Obj
    #: ``computeMode``; None when not published (an older plugin, or NVML did not say).
    compute_mode: str | None = None
    #: ``healthMonitored``: False when nothing watches the device's health; None when not published.
    health_monitored: bool | None = None

    def qualified_attributes(self, driver: str) -> dict[str, Any]:
        """Attribute values by fully qualified name (``gpu.hami.io/index``), for claim constraints."""
        return {
            (key if "/" in key else f"{driver}/{key}"): next(iter(value.values()), None)
            for key, value in (self.entry.get("attributes") or {}).items()
            if isinstance(value, Mapping) and value
        }


def attribute(attributes: Obj, *names: str) -> Any:
    """The value of the first of ``names`` that ``attributes`` holds, whatever its kind; else None."""
    for name in names:
        value = attributes.get(name)
        if isinstance(value, (dict, Mapping)):  # API objects are dicts: checked before the slow ABC
            for kind in ATTRIBUTE_KINDS:
                if kind in value:
                    return value[kind]
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return str(value) if value else None


def parse_device(entry: Obj) -> SliceDevice:
    """Read one ``spec.devices[]`` entry; nothing is defaulted or dropped here (readers decide)."""
    name = str(entry.get("name", ""))
    attributes: Obj = entry.get("attributes") or {}
    capacity: Obj = entry.get("capacity") or {}
    index = _int(attribute(attributes, INDEX_ATTRIBUTE))
    healthy = attribute(attributes, HEALTHY_ATTRIBUTE)
    monitored = attribute(attributes, HEALTH_MONITORED_ATTRIBUTE)
    peers = attribute(attributes, NVLINK_PEERS_ATTRIBUTE)

    def amount(key: str) -> int | None:
        return floor_quantity((capacity.get(key) or {}).get("value"))

    return SliceDevice(
        name=name,
        index=device_index(name) if index is None else index,
        uuid=_str(attribute(attributes, UUID_ATTRIBUTE)),
        product_name=_str(attribute(attributes, PRODUCT_NAME_ATTRIBUTE)),
        healthy=healthy if isinstance(healthy, bool) else None,
        isolation=_str(attribute(attributes, ISOLATION_ATTRIBUTE)),
        numa_node=_int(attribute(attributes, NUMA_NODE_ATTRIBUTE, LEGACY_NUMA_NODE_ATTRIBUTE)),
        nvlink_peers=peers if isinstance(peers, str) else None,
        memory=amount(MEMORY),
        cores=amount(CORES),
        slots=amount(SLOTS),
        taints=tuple(entry.get("taints") or ()),
        entry=entry,
        compute_mode=_str(attribute(attributes, COMPUTE_MODE_ATTRIBUTE)),
        health_monitored=monitored if isinstance(monitored, bool) else None,
    )


# --- one slice ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SlicePlace:
    """Where one slice belongs: the driver that published it, its pool and its node."""

    #: ``spec.driver``; None when absent (or not a name).
    driver: str | None
    #: ``spec.pool.name``; "" when the slice names no pool.
    pool: str
    #: ``spec.nodeName``; None when absent or empty (a slice of no node: network-attached devices).
    node: str | None
    #: ``spec.pool.generation``; 0 when absent.
    generation: int = 0


def slice_place(obj: Obj) -> SlicePlace | None:
    """Where a slice belongs; None when it has no ``spec`` to tell (nowhere to place it)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    driver, pool = spec.get("driver"), spec.get("pool")
    return SlicePlace(
        driver=driver if isinstance(driver, str) else None,
        pool=str(pool.get("name", "")) if isinstance(pool, Mapping) else "",
        node=str(spec.get("nodeName") or "") or None,
        generation=int(pool.get("generation") or 0) if isinstance(pool, Mapping) else 0,
    )


def slice_devices(obj: Obj) -> Sequence[Obj]:
    """A slice's ``spec.devices[]`` entries (none when absent), the very objects it holds: a reader
    may tell a device of an unchanged slice by identity (``build_inventory``)."""
    devices: Sequence[Obj] = (obj.get("spec") or {}).get("devices") or ()
    return devices


# --- which slices count ----------------------------------------------------------------------
#: A pool as published by one node: (spec.nodeName, spec.pool.name).
PoolKey = tuple[str, str]


def current_pools(slices: Iterable[Obj], driver: str) -> dict[PoolKey, list[Obj]]:
    """Our slices by (node, pool), each pool of its owner only, at its newest generation if complete."""
    result = {}
    for key, items in owned_pools(_by_node_and_pool(slices, driver)).items():
        current = newest_complete(items)
        if current is not None:
            result[key] = current
    return result


def current_devices(slices: Iterable[Obj], driver: str) -> Iterator[tuple[str, str, SliceDevice]]:
    """``(node, pool, device)`` for every device of :func:`current_pools`, in slice order."""
    for (node, pool), items in current_pools(slices, driver).items():
        for item in items:
            for entry in slice_devices(item):
                yield node, pool, parse_device(entry)


def _by_node_and_pool(slices: Iterable[Obj], driver: str) -> dict[PoolKey, list[Obj]]:
    grouped: dict[PoolKey, list[Obj]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver or not spec.get("nodeName"):
            continue
        key = (str(spec["nodeName"]), str((spec.get("pool") or {}).get("name", "")))
        grouped.setdefault(key, []).append(item)
    return grouped


def newest_complete(items: list[Obj]) -> list[Obj] | None:
    """The slices of one pool's newest generation when there are as many as ``resourceSliceCount`` says."""
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


def owned_pools(pools: Mapping[PoolKey, list[Obj]]) -> dict[PoolKey, list[Obj]]:
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
