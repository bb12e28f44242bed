"""Build the ``resource.k8s.io/v1`` ResourceSlices that describe one node's GPUs.

Public API::

    build_resource_slices(gpus, *, driver_name, node_name, generation=1, node_uid=None,
                          pool_name=None, policy_taint=False, taint_unhealthy=False) -> list[dict]
    device_entry(gpu, *, policy_taint=False, taint_unhealthy=False, driver_name=...) -> dict
    policy_taint_key(driver_name) -> str      # "gpu.hami.io/policy-managed"
    unhealthy_taint_key(driver_name) -> str   # "gpu.hami.io/unhealthy"

One pool per node (pool name = node name), device names ``Gpu.name`` (``gpu-<index>`` for simulated
GPUs, ``gpu-<minor>`` from NVML). Each device carries the attributes and consumable capacity this
driver publishes, named and with the request policies of ``dra_driver/resource/slices.py`` (which
the controller and ``top`` read them back with): ``memory`` (bytes, request policy min 1Mi / step
1Mi / default = the whole card, so a claim that does not ask for memory gets the card to itself),
``cores`` (100, 0..100 step 1, default 0) and ``slots`` (HAMi's split count, default 1 per
allocation), with ``allowMultipleAllocations: true``. Version attributes are strict semver (``535.104.05`` ->
``535.104.5``) because Kubernetes rejects anything else at CEL time.

Attributes (unqualified names live in the driver's domain, e.g. ``device.attributes["gpu.hami.io"].index``):
``type`` ("gpu"), ``index``, ``minor``, ``uuid``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability`` / ``driverVersion`` / ``cudaDriverVersion`` (version), ``healthy`` (bool),
``healthMonitored`` (bool: does anything watch its health; set by the plugin), ``computeMode``
(NVML's, as nvidia-smi names it: ``Default``, ``Exclusive_Process``, ``Prohibited``),
``nvlinkPeers`` (string, see :mod:`dra_driver.devices.nvlink`; only with NVLink),
``resource.kubernetes.io/numaNode`` (int), ``resource.kubernetes.io/pciBusID`` and
``resource.kubernetes.io/pcieRoot``. Anything the source did not determine is omitted.

A card in MIG mode publishes its MIG devices instead of itself (``type: mig``, whole devices,
:mod:`dra_driver.resource.mig_slices`); a card in MIG on demand its possible placements, which
consume its shared counters (:mod:`dra_driver.resource.mig_on_demand_slices`), in slices after the
others.

A card whose compute mode is not ``Default`` publishes ``slots: 1`` (one tenant at a time, also for
kube-scheduler's own allocator) and the controller gives it out whole only.

Health is always visible as the attribute ``healthy``; with ``taint_unhealthy`` a sick GPU also
gets the ``NoSchedule`` taint ``<driver>/unhealthy``. With ``policy_taint`` every GPU gets the
``NoSchedule`` taint ``<driver>/policy-managed`` that only our controller tolerates, so
kube-scheduler never hands our GPUs out first-fit. Device taints are honoured from Kubernetes 1.36
(``DRADeviceTaints`` beta); older API servers drop the field, so the caller (the kubelet plugin)
decides when to ask for them. Both default to off.

API limits are respected: at most 128 devices per slice (64 when any device has taints), at most
32 attributes + capacities per device, string attributes at most 64 bytes; a larger node is
split into several slices of one pool, all with the same ``generation`` and ``resourceSliceCount``.
Memory is published in whole MiB (rounded down) so that the 1Mi step validates, as NVIDIA's
driver does. When the Node's UID is known, the slices are owned by the Node (garbage collection).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.contract import (
    HAMI_CORE_VERSION_ATTRIBUTE,
    ISOLATION_ATTRIBUTE,
    policy_taint_key,
    unhealthy_taint_key,
)
from dra_driver.devices.model import Gpu, semver
from dra_driver.devices.nvlink import nvlink_peers_attribute
from dra_driver.resource.mig_on_demand_slices import on_demand_slice_specs
from dra_driver.resource.mig_slices import mig_device_entries
from dra_driver.resource.slices import (
    ARCHITECTURE_ATTRIBUTE,
    BRAND_ATTRIBUTE,
    COMPUTE_MODE_ATTRIBUTE,
    CUDA_COMPUTE_CAPABILITY_ATTRIBUTE,
    CUDA_DRIVER_VERSION_ATTRIBUTE,
    DRIVER_VERSION_ATTRIBUTE,
    GPU_TYPE,
    HEALTH_MONITORED_ATTRIBUTE,
    HEALTHY_ATTRIBUTE,
    INDEX_ATTRIBUTE,
    MINOR_ATTRIBUTE,
    NUMA_NODE_ATTRIBUTE,
    NVLINK_PEERS_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    PRODUCT_NAME_ATTRIBUTE,
    TYPE_ATTRIBUTE,
    UUID_ATTRIBUTE,
    capacity_entries,
)

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES_PER_SLICE = 128
#: Since 1.35 a slice whose devices have taints (or counters) may hold at most 64 devices.
MAX_TAINTED_DEVICES_PER_SLICE = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_STRING = 64

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SliceError(ValueError):
    """The inputs cannot form a valid ResourceSlice (bad driver or node name, duplicate GPUs)."""


def build_resource_slices(
    gpus: Iterable[Gpu],
    *,
    driver_name: str = DEFAULT_DRIVER_NAME,
    node_name: str,
    generation: int = 1,
    node_uid: str | None = None,
    pool_name: str | None = None,
    policy_taint: bool = False,
    taint_unhealthy: bool = False,
    mig_on_demand_layout: str | None = None,
) -> list[dict[str, Any]]:
    """Return the ResourceSlices (plain dicts, ready for the API) of one node's pool.

    Cards in MIG on demand publish their placements and counter sets in ``mig_on_demand_layout``
    (:mod:`dra_driver.resource.mig_on_demand_slices`); without a layout (the API server does not
    serve partitionable devices) they publish their existing instances, as static MIG.

    Always at least one slice: an empty pool ("this node has no GPUs") differs from no pool.
    Slice names are deterministic (``<node>-<driver>-<n>``, hashed when too long) so that a
    publisher can create-or-update them idempotently.
    """
    _check_dns_subdomain(driver_name, "driver name", 63)
    _check_dns_subdomain(node_name, "node name", 253)
    pool = pool_name or node_name
    for part in pool.split("/"):
        _check_dns_subdomain(part, "pool name", 253)
    if len(pool) > 253:
        raise SliceError(f"pool name {pool!r} is longer than 253 characters")
    if isinstance(generation, bool) or generation < 0:
        raise SliceError(f"generation must be >= 0, got {generation}")
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    _check_unique(ordered)
    devices: list[dict[str, Any]] = []
    on_demand = [gpu for gpu in ordered if gpu.mig_on_demand and mig_on_demand_layout is not None]
    for gpu in ordered:
        if gpu in on_demand:
            continue
        if gpu.mig_enabled:  # never whole nor as shares: its MIG devices instead (resource/mig_slices.py)
            devices += mig_device_entries(gpu, driver_name=driver_name, taint_unhealthy=taint_unhealthy)
        else:
            devices.append(
                device_entry(
                    gpu, driver_name=driver_name, policy_taint=policy_taint, taint_unhealthy=taint_unhealthy
                )
            )
    tainted = any("taints" in device for device in devices)
    per_slice = MAX_TAINTED_DEVICES_PER_SLICE if tainted else MAX_DEVICES_PER_SLICE
    chunks = [devices[start : start + per_slice] for start in range(0, len(devices), per_slice)]
    specs: list[dict[str, Any]] = [{"devices": chunk} for chunk in chunks]
    if on_demand and mig_on_demand_layout is not None:
        specs += on_demand_slice_specs(
            on_demand, layout=mig_on_demand_layout, driver_name=driver_name, taint_unhealthy=taint_unhealthy
        )
    specs = specs or [{"devices": []}]
    slices = []
    for number, parts in enumerate(specs):
        metadata: dict[str, Any] = {"name": slice_name(node_name, driver_name, number)}
        if node_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": metadata,
                "spec": {
                    "driver": driver_name,
                    "nodeName": node_name,
                    "pool": {"name": pool, "generation": generation, "resourceSliceCount": len(specs)},
                    **parts,
                },
            }
        )
    return slices


def slice_name(node_name: str, driver_name: str, number: int) -> str:
    """Deterministic object name of slice ``number``; at most 253 characters."""
    name = f"{node_name}-{driver_name}-{number}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: 253 - len(digest) - len(str(number)) - 2]}-{digest}-{number}"


def device_entry(
    gpu: Gpu,
    *,
    driver_name: str = DEFAULT_DRIVER_NAME,
    policy_taint: bool = False,
    taint_unhealthy: bool = False,
) -> dict[str, Any]:
    """The ``spec.devices[]`` entry for one GPU."""
    attributes = _attributes(gpu)
    # One process per card (Exclusive_Process) or none (Prohibited): never two tenants.
    capacity = capacity_entries(gpu.memory_bytes, gpu.cores, 1 if gpu.whole_only else gpu.slots)
    overflow = len(attributes) + len(capacity) - MAX_ATTRIBUTES_AND_CAPACITIES
    if overflow > 0:  # pragma: no cover - we publish far fewer; kept as a guard for future attributes
        for key in list(attributes)[-overflow:]:
            del attributes[key]
    device: dict[str, Any] = {
        "name": gpu.name,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": True,
    }
    taints = []
    if policy_taint:
        taints.append({"key": policy_taint_key(driver_name), "effect": "NoSchedule"})
    if taint_unhealthy and not gpu.healthy:
        taints.append({"key": unhealthy_taint_key(driver_name), "effect": "NoSchedule"})
    if taints:
        device["taints"] = taints
    return device


def _attributes(gpu: Gpu) -> dict[str, dict[str, Any]]:
    attributes: dict[str, dict[str, Any]] = {
        TYPE_ATTRIBUTE: {"string": GPU_TYPE},
        INDEX_ATTRIBUTE: {"int": gpu.index},
        UUID_ATTRIBUTE: _string(gpu.uuid, gpu, UUID_ATTRIBUTE),
        PRODUCT_NAME_ATTRIBUTE: _string(gpu.product_name, gpu, PRODUCT_NAME_ATTRIBUTE),
        HEALTHY_ATTRIBUTE: {"bool": gpu.healthy},
        ISOLATION_ATTRIBUTE: {"string": gpu.isolation},
    }
    if gpu.health_monitored is not None:
        attributes[HEALTH_MONITORED_ATTRIBUTE] = {"bool": gpu.health_monitored}
    if gpu.compute_mode is not None:
        attributes[COMPUTE_MODE_ATTRIBUTE] = {"string": gpu.compute_mode}
    if gpu.minor is not None:
        attributes[MINOR_ATTRIBUTE] = {"int": gpu.minor}
    for key, text in ((BRAND_ATTRIBUTE, gpu.brand), (ARCHITECTURE_ATTRIBUTE, gpu.architecture)):
        if text:
            attributes[key] = _string(text, gpu, key)
    for key, raw in (
        (CUDA_COMPUTE_CAPABILITY_ATTRIBUTE, gpu.cuda_compute_capability),
        (DRIVER_VERSION_ATTRIBUTE, gpu.driver_version),
        (CUDA_DRIVER_VERSION_ATTRIBUTE, gpu.cuda_driver_version),
        (HAMI_CORE_VERSION_ATTRIBUTE, gpu.hami_core_version),
    ):
        if raw:
            version = semver(raw)
            if version is None:
                log.warning("%s: %s %r is not a version; attribute omitted", gpu.name, key, raw)
            else:
                attributes[key] = {"version": version}
    if gpu.numa_node is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
    if gpu.pci_bus_id:
        attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": gpu.pci_bus_id}
    if gpu.pcie_root:
        attributes[PCIE_ROOT_ATTRIBUTE] = _string(gpu.pcie_root, gpu, "pcieRoot")
    if gpu.nvlink_peers:
        peers = nvlink_peers_attribute(gpu.nvlink_peers)
        if len(peers) <= MAX_ATTRIBUTE_STRING:
            attributes[NVLINK_PEERS_ATTRIBUTE] = {"string": peers}
        else:
            log.warning(
                "%s: NVLink peer list longer than %d characters; omitted", gpu.name, MAX_ATTRIBUTE_STRING
            )
    return attributes


def _string(text: str, gpu: Gpu, key: str) -> dict[str, str]:
    # The API counts UTF-8 bytes (Go's len), so cut at a character boundary within 64 bytes.
    encoded = text.encode()
    if len(encoded) > MAX_ATTRIBUTE_STRING:
        log.warning("%s: %s longer than %d bytes; truncated", gpu.name, key, MAX_ATTRIBUTE_STRING)
        text = encoded[:MAX_ATTRIBUTE_STRING].decode("utf-8", "ignore")
    return {"string": text}


def _check_dns_subdomain(value: str, what: str, limit: int) -> None:
    if not value or len(value) > limit or not all(_DNS_LABEL.match(label) for label in value.split(".")):
        raise SliceError(
            f"{what} {value!r} is not a valid DNS subdomain (lower-case letters, digits, '-' and '.', "
            f"at most {limit} characters)"
        )


def _check_unique(gpus: Sequence[Gpu]) -> None:
    seen: set[int] = set()
    uuids: set[str] = set()
    for gpu in gpus:
        if gpu.index in seen:
            raise SliceError(f"two GPUs have index {gpu.index}; the engine places cards by index")
        if gpu.uuid in uuids:
            raise SliceError(f"two GPUs have UUID {gpu.uuid}")
        seen.add(gpu.index)
        uuids.add(gpu.uuid)
