"""ResourceSlice entries of MIG devices: what a card in MIG mode publishes instead of itself.

Each MIG device (:class:`~dra_driver.devices.mig.MigDevice`) becomes one device named
``gpu-<n>-mig-<gi>-<ci>`` (:func:`~dra_driver.devices.mig.mig_device_name`) with ``type: mig``,
its ``uuid`` (``MIG-...``), CUDA's ``profile`` (``1g.10gb``), its instance ids, compute
``slices``, ``multiprocessors``, ``placementStart``/``memorySlices`` (where the driver reports
them), and the parent card's facts: ``parentUUID``, ``parentIndex``, ``parentMinor``,
``parentPciBusID``, ``productName``, architecture, versions, ``resource.kubernetes.io/numaNode``
and ``pcieRoot``. The capacity is ``memory`` alone, without a request policy: a MIG device is
given out whole (``allowMultipleAllocations`` unset), because HAMi-core's memory and SM limits act
on CUDA's whole-device view and do not apply to MIG devices; the hardware partition is the limit.

MIG devices are allocated by our controller through the chart's class ``mig.gpu.hami.io``, whose
selector pins ``type == "mig"`` (``config/classes.py`` ``is_mig_class``), with the class's policy
chain (``engine/mig.py``); the class carries the scheduler fence, so kube-scheduler's first fit
takes none of its claims, and MIG devices need no ``policy-managed`` taint; a sick parent's MIG
devices get the ``unhealthy`` taint when the plugin taints unhealthy devices.
"""

from __future__ import annotations

from typing import Any

from dra_driver.contract import MEMORY, unhealthy_taint_key
from dra_driver.devices.mig import MigDevice, mig_device_name
from dra_driver.devices.model import Gpu, semver
from dra_driver.quantity import MIB, format_bytes
from dra_driver.resource.slices import (
    ARCHITECTURE_ATTRIBUTE,
    BRAND_ATTRIBUTE,
    CUDA_COMPUTE_CAPABILITY_ATTRIBUTE,
    CUDA_DRIVER_VERSION_ATTRIBUTE,
    DRIVER_VERSION_ATTRIBUTE,
    HEALTH_MONITORED_ATTRIBUTE,
    HEALTHY_ATTRIBUTE,
    MIG_COMPUTE_INSTANCE_ATTRIBUTE,
    MIG_GPU_INSTANCE_ATTRIBUTE,
    MIG_MEMORY_SLICES_ATTRIBUTE,
    MIG_MULTIPROCESSORS_ATTRIBUTE,
    MIG_PARENT_INDEX_ATTRIBUTE,
    MIG_PARENT_MINOR_ATTRIBUTE,
    MIG_PARENT_PCI_BUS_ID_ATTRIBUTE,
    MIG_PARENT_UUID_ATTRIBUTE,
    MIG_PLACEMENT_START_ATTRIBUTE,
    MIG_PROFILE_ATTRIBUTE,
    MIG_SLICES_ATTRIBUTE,
    MIG_TYPE,
    NUMA_NODE_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    PRODUCT_NAME_ATTRIBUTE,
    TYPE_ATTRIBUTE,
    UUID_ATTRIBUTE,
)

MAX_ATTRIBUTE_STRING = 64


def mig_device_entries(gpu: Gpu, *, driver_name: str, taint_unhealthy: bool = False) -> list[dict[str, Any]]:
    """The ``spec.devices[]`` entries of a card in MIG mode: one per MIG device, none for the card."""
    return [_entry(gpu, mig, driver_name, taint_unhealthy) for mig in gpu.mig_devices]


def _entry(gpu: Gpu, mig: MigDevice, driver_name: str, taint_unhealthy: bool) -> dict[str, Any]:
    name = mig_device_name(gpu.name, mig)
    healthy = gpu.healthy and mig.healthy
    attributes = parent_attributes(gpu, healthy=healthy)
    attributes.update(
        {
            UUID_ATTRIBUTE: {"string": mig.uuid},
            MIG_PROFILE_ATTRIBUTE: {"string": mig.profile},
            MIG_GPU_INSTANCE_ATTRIBUTE: {"int": mig.gpu_instance},
            MIG_COMPUTE_INSTANCE_ATTRIBUTE: {"int": mig.compute_instance},
            MIG_SLICES_ATTRIBUTE: {"int": mig.slices},
        }
    )
    if mig.multiprocessors is not None:
        attributes[MIG_MULTIPROCESSORS_ATTRIBUTE] = {"int": mig.multiprocessors}
    if mig.placement_start is not None and mig.placement_size is not None:
        attributes[MIG_PLACEMENT_START_ATTRIBUTE] = {"int": mig.placement_start}
        attributes[MIG_MEMORY_SLICES_ATTRIBUTE] = {"int": mig.placement_size}
    device: dict[str, Any] = {
        "name": name,
        "attributes": attributes,
        "capacity": {MEMORY: {"value": format_bytes((mig.memory_bytes // MIB) * MIB)}},
    }
    if taint_unhealthy and not healthy:
        device["taints"] = [{"key": unhealthy_taint_key(driver_name), "effect": "NoSchedule"}]
    return device


def parent_attributes(gpu: Gpu, *, healthy: bool) -> dict[str, dict[str, Any]]:
    """What every MIG device of ``gpu`` says of its card (static instances and on-demand placements
    alike): type, product, the parent's UUID/index/minor/PCI address/NUMA node, versions, health."""
    attributes: dict[str, dict[str, Any]] = {
        TYPE_ATTRIBUTE: {"string": MIG_TYPE},
        PRODUCT_NAME_ATTRIBUTE: {
            "string": gpu.product_name.encode()[:MAX_ATTRIBUTE_STRING].decode("utf-8", "ignore")
        },
        MIG_PARENT_UUID_ATTRIBUTE: {"string": gpu.uuid},
        MIG_PARENT_INDEX_ATTRIBUTE: {"int": gpu.index},
        HEALTHY_ATTRIBUTE: {"bool": healthy},
    }
    if gpu.health_monitored is not None:
        attributes[HEALTH_MONITORED_ATTRIBUTE] = {"bool": gpu.health_monitored}
    if gpu.minor is not None:
        attributes[MIG_PARENT_MINOR_ATTRIBUTE] = {"int": gpu.minor}
    if gpu.pci_bus_id:
        attributes[MIG_PARENT_PCI_BUS_ID_ATTRIBUTE] = {"string": gpu.pci_bus_id}
    for key, text in ((BRAND_ATTRIBUTE, gpu.brand), (ARCHITECTURE_ATTRIBUTE, gpu.architecture)):
        if text:
            attributes[key] = {"string": text}
    for key, raw in (
        (CUDA_COMPUTE_CAPABILITY_ATTRIBUTE, gpu.cuda_compute_capability),
        (DRIVER_VERSION_ATTRIBUTE, gpu.driver_version),
        (CUDA_DRIVER_VERSION_ATTRIBUTE, gpu.cuda_driver_version),
    ):
        version = semver(raw) if raw else None
        if version is not None:
            attributes[key] = {"version": version}
    if gpu.numa_node is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
    if gpu.pcie_root:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root}
    return attributes
