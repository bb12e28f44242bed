"""``simulate --from-cluster``: the live cluster as a scenario, seen exactly as the controller sees it.

The GPUs come from our driver's ResourceSlices through the controller's own parser
(``controller/inventory.py``: each pool's newest generation, only when complete; capacities,
``isolation``, ``healthy``, NUMA node, NVLink peers), and the tenants from every allocated
ResourceClaim's results through the controller's ledger (``controller/ledger.py``:
``consumedCapacity`` for a share, the whole card for a result without a ``shareID``, nothing for
``adminAccess``), whoever allocated them. Quotas are the ``GpuQuota`` objects and the
ResourceQuotas with HAMi's names that the controller enforces. So a claim placed against the
snapshot gets the cards, scores and quota answers the controller would give now; node fit is not
in a scenario (no Node objects): ``simulate --from-cluster --claims`` places with the controller's
allocator itself (``cluster.py``).

What a scenario cannot hold is left out, and said so on stderr: a result naming a device that is
not published (or whose pool is incomplete), a quota the controller would ignore too. A
ResourceQuota with HAMi's names becomes a quota named ``resourcequota/<name>`` (it may share its
name with a GpuQuota of the namespace). Device taints are not in a scenario: an unhealthy GPU is
``healthy: false`` (the attribute the plugin publishes beside the taint). The controller's
``--default-policy``/``--default-node-policy`` are its flags, not cluster state: the snapshot
writes the scenario defaults (``spread``/``binpack``, the controller's own defaults), for the
user to edit if the controller runs with others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dra_driver.contract import ISOLATION_NONE, ISOLATION_VALUES, DeviceId
from dra_driver.controller.inventory import Device, build_inventory
from dra_driver.controller.ledger import card_capacity
from dra_driver.controller.offline import ClusterObjects, bare_nodes
from dra_driver.devices.mig_profiles import MEMORY_SLICES, MigModel, mig_model
from dra_driver.engine import DEFAULT_CARD_POLICY, DEFAULT_NODE_POLICY
from dra_driver.engine.mig import card_memory
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    KubeApi,
    ObjView,
)
from dra_driver.kube.errors import Forbidden, KubeError
from dra_driver.quantity import format_bytes
from dra_driver.quota import Quota, QuotaError, quota_from_gpu_quota, quota_from_resource_quota
from dra_driver.resource.uses import claim_uses


@dataclass(frozen=True)
class Source:
    """Where the objects came from, recorded in the snapshot's ``snapshot`` key."""

    context: str = ""
    server: str = ""


@dataclass
class Snapshot:
    """A scenario document (``nodes``, ``quotas``, ``defaults``, ``snapshot``) and what was left out."""

    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def fetch(kube: KubeApi, warnings: list[str] | None = None, *, placing: bool = True) -> ClusterObjects:
    """List what the controller's informers list: the snapshot reads the slices, claims and quotas,
    placing what-if claims (``simulate/cluster.py``, ``placing``) all of them. A cluster without
    the GpuQuota CRD simply has no quotas. A user who may not list Pods or Nodes gets a placement
    without them, said in ``warnings``: no bound pod's CPU and memory counted, or no node fit
    checked at all (every node with devices of ours taken as one any pod may run on)."""
    objects = ClusterObjects(
        slices=list(kube.list(RESOURCE_SLICES).get("items") or ()),
        claims=list(kube.list(RESOURCE_CLAIMS).get("items") or ()),
        resource_quotas=list(kube.list(RESOURCE_QUOTAS).get("items") or ()),
    )
    try:
        objects.gpu_quotas = list(kube.list(GPU_QUOTAS).get("items") or ())
    except KubeError as err:
        if not err.not_found:
            raise
    if not placing:  # a snapshot to save holds no classes, pods or nodes
        return objects
    objects.classes = list(kube.list(DEVICE_CLASSES).get("items") or ())
    said = warnings if warnings is not None else []
    try:
        objects.pods = list(kube.list(PODS).get("items") or ())
    except Forbidden as err:
        said.append(f"cannot list Pods ({err}): the CPU and memory of the pods on each node are not counted")
    try:
        objects.nodes = list(kube.list(NODES).get("items") or ())
    except Forbidden as err:
        objects.nodes = bare_nodes(objects.slices)
        said.append(f"cannot list Nodes ({err}): node fit (selectors, taints, CPU/memory) is not checked")
    return objects


def take_snapshot(objects: ClusterObjects, driver: str, source: Source = Source()) -> Snapshot:
    """The cluster's GPUs, tenants and quotas as a scenario document (no claims to place yet)."""
    warnings: list[str] = []
    inventory = build_inventory(objects.slices, driver)
    devices: dict[DeviceId, Device] = {
        key: device for node in inventory.values() for key, device in node.devices.items()
    }
    mig_devices = {key for node in inventory.values() for key in node.mig}
    #: MIG instances held by a claim: written on their card's ``migDevices``, not as allocations.
    mig_holders: dict[DeviceId, dict[str, Any]] = {}
    tenants: dict[DeviceId, list[dict[str, Any]]] = {}
    for claim in sorted(objects.claims, key=_claim_ref):
        for use in claim_uses(claim, driver):
            if use.device in mig_devices:
                mig_holders[use.device] = {"namespace": use.namespace, "deviceClass": use.class_name}
                continue
            device = devices.get(use.device)
            if device is None:
                warnings.append(
                    f"claim {_claim_ref(claim)}: device {use.device} is not in a complete published pool; "
                    "its use is left out (the controller applies it once the slice appears)"
                )
                continue
            whole = use.consumption.whole_device
            taken = use.consumption.of(card_capacity(device.card))
            allocation: dict[str, Any] = {
                "memory": format_bytes(taken.memory),
                "cores": taken.cores,
                "slots": taken.slots,
                "namespace": use.namespace,
            }
            if use.class_name:
                allocation["deviceClass"] = use.class_name
            allocation["claim"] = _claim_ref(claim) + (" (whole card)" if whole else "")
            tenants.setdefault(use.device, []).append(allocation)
    nodes = []
    for name in sorted(inventory):
        gpus = [
            _gpu(device, tenants.get(device.id, ())) for _, device in sorted(inventory[name].by_index.items())
        ]
        gpus += _mig_gpus(inventory[name].mig.values(), mig_holders, warnings)
        nodes.append({"name": name, "gpus": gpus})
    data: dict[str, Any] = {
        "snapshot": {
            "context": source.context,
            "server": source.server,
            "driver": driver,
            "taken": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "defaults": {"policy": DEFAULT_CARD_POLICY, "nodePolicy": DEFAULT_NODE_POLICY.value},
        "nodes": nodes,
        "quotas": _quotas(objects, warnings),
    }
    return Snapshot(data, warnings)


def _claim_ref(claim: ObjView) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _gpu(device: Device, allocations: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A scenario GPU with every field the engine reads from the card, written out."""
    card = device.card
    isolation = device.published.isolation
    gpu: dict[str, Any] = {
        "index": card.index,
        "productName": card.product_name,
        "memory": format_bytes(card.memory),
        "numaNode": card.numa_node,
        "uuid": card.uuid,
        "cores": card.cores,
        "slots": card.slots,
        "healthy": card.healthy,
        # The controller treats an absent or unknown value as not enforced: so does ``none``.
        "isolation": isolation if isolation in ISOLATION_VALUES else ISOLATION_NONE,
    }
    if card.whole_only:  # the slice's computeMode forbids sharing
        gpu["wholeOnly"] = True
    if card.links:
        gpu["links"] = dict(sorted(card.links.items()))
    listed = list(allocations)
    if listed:
        gpu["allocations"] = listed
    return gpu


def _mig_gpus(
    devices: Iterable[Device], holders: Mapping[DeviceId, Mapping[str, Any]], warnings: list[str]
) -> list[dict[str, Any]]:
    """The node's cards in MIG mode as scenario GPUs with ``migDevices`` (each at its placement,
    ``inUse`` with its holder's namespace and class). Their ``memory`` is their instances' total
    (a card in MIG on demand: its largest placement's): the card itself is not published. A card in
    MIG on demand is ``migOnDemand`` with the placements claims hold as its ``migDevices``. The
    simulator names instances after the card's index."""
    by_card: dict[int, list[Device]] = {}
    for device in devices:
        if device.mig is not None:
            by_card.setdefault(device.mig.parent, []).append(device)
    gpus = []
    for parent, members in sorted(by_card.items()):
        first = members[0].mig
        assert first is not None
        model = mig_model(first.product_name)
        known = {profile.name for profile in model.profiles} if model is not None else set()
        if any(d.mig is not None and d.mig.profile not in known for d in members):
            warnings.append(
                f"{first.node}/{first.parent_name}: MIG instances of {first.product_name!r} "
                "(or compute instances smaller than their GPU instance) cannot be simulated; left out"
            )
            continue
        on_demand = any(d.mig is not None and d.mig.on_demand for d in members)
        entries = []
        for device in sorted(members, key=lambda d: d.card.index):
            mig = device.mig
            assert mig is not None
            holder = holders.get(device.id)
            if on_demand and holder is None:
                continue  # a placement nobody holds: the card offers it again in the simulation
            entry: dict[str, Any] = {"profile": mig.profile, "start": mig.placement_start}
            if holder is not None:
                entry.update(inUse=True, namespace=holder["namespace"])
                if holder["deviceClass"]:
                    entry["deviceClass"] = holder["deviceClass"]
            entries.append(entry)
        gpu: dict[str, Any] = {
            "index": parent,
            "productName": first.product_name,
            "memory": format_bytes(card_memory([d.mig for d in members if d.mig is not None])),
            "numaNode": first.numa_node,
            "uuid": first.parent_uuid,
            "healthy": all(d.card.healthy for d in members),
        }
        if on_demand:
            gpu["migOnDemand"] = True
            entries += _not_offered(members, model)
        gpu["migDevices"] = entries
        gpus.append(gpu)
    return gpus


def _not_offered(members: Iterable[Device], model: MigModel | None) -> list[dict[str, Any]]:
    """A card in MIG on demand whose slices no published placement covers (the plugin leaves out
    those of instances it did not create): instances there, not in use, in aligned blocks (the
    profile with the fewest compute slices for each), so the simulation offers what the card does."""
    offered = {s for d in members if d.mig is not None for s in d.mig.span}
    missing = set(range(MEMORY_SLICES)) - offered
    if model is None or not missing:
        return []
    entries = []
    for size in (8, 4, 2, 1):
        for start in range(0, MEMORY_SLICES, size):
            block = set(range(start, start + size))
            fitting = [
                p
                for p in model.profiles
                if p.placement_size == size and start in p.placements and not p.name.endswith("+me")
            ]
            if block <= missing and fitting:
                entries.append({"profile": min(fitting, key=lambda p: p.slices).name, "start": start})
                missing -= block
    return entries


def _quotas(objects: ClusterObjects, warnings: list[str]) -> list[dict[str, Any]]:
    quotas: list[Quota] = []
    for obj in objects.gpu_quotas:
        try:
            quotas.append(quota_from_gpu_quota(obj))
        except QuotaError as err:
            warnings.append(f"{err}; left out (the controller does not enforce it either)")
    for obj in objects.resource_quotas:
        try:
            quota = quota_from_resource_quota(obj)
        except QuotaError as err:
            warnings.append(f"{err}; left out (the controller does not enforce it either)")
            continue
        if quota is not None:
            quotas.append(quota)
    specs = []
    for quota in sorted(quotas, key=lambda q: (q.namespace, q.metric_name)):
        hard: dict[str, Any] = {}
        if quota.hard.memory is not None:
            hard["memory"] = format_bytes(quota.hard.memory) if quota.hard.memory else 0
        if quota.hard.cores is not None:
            hard["cores"] = quota.hard.cores
        if quota.hard.devices is not None:
            hard["devices"] = quota.hard.devices
        if not hard:
            continue  # an empty GpuQuota limits nothing (the API server refuses one anyway)
        # A ResourceQuota keeps its kind in the name: it may share its name with a GpuQuota.
        spec: dict[str, Any] = {"name": quota.metric_name, "namespace": quota.namespace, "hard": hard}
        if quota.class_names:
            spec["deviceClassNames"] = sorted(quota.class_names)
        specs.append(spec)
    return specs
