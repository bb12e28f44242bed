"""GPU discovery: one device model (:class:`Gpu`) behind one small interface (:class:`DeviceSource`).

Sources: :mod:`.nvml` (real GPUs through ``pynvml``) and :mod:`.simulated` (named profiles
``t4``, ``a100-80gb``, ``h100-80gb``, ``h200`` and YAML/JSON devices files). Pick one with
:func:`open_source`; the ResourceSlice builder lives in :mod:`dra_driver.resource.slice_builder`.

Public API::

    open_source(kind, *, node_name, profile=None, gpus=None, devices_file=None) -> DeviceSource
    DeviceSource.discover() -> list[Gpu]          # sorted by index
    Gpu(index, uuid, product_name, memory_bytes, minor, brand, architecture,
        cuda_compute_capability, driver_version, cuda_driver_version, pci_bus_id, pcie_root,
        numa_node, mig_enabled, nvlink_peers, healthy, cores, slots, name_by_minor)
        .name -> "gpu-<index>" (simulated) or "gpu-<minor>" (NVML)
        .pair_scores -> {peer index: 100 * NVLinks}
    DeviceSourceError   # one actionable line for the user

A GPU in MIG mode carries its MIG devices (``Gpu.mig_devices``, :mod:`.mig`), which are
published instead of it. NVML health events, for the kubelet plugin's
health state, are :mod:`.nvml_events`; both NVML users hold their own initialisation
(:mod:`.nvml_session`).
"""

from dra_driver.devices.model import DeviceModelError, Gpu, normalize_pci_bus_id, semver
from dra_driver.devices.source import SOURCE_KINDS, DeviceSource, DeviceSourceError, open_source

__all__ = [
    "SOURCE_KINDS",
    "DeviceModelError",
    "DeviceSource",
    "DeviceSourceError",
    "Gpu",
    "normalize_pci_bus_id",
    "open_source",
    "semver",
]
