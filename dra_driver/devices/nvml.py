"""GPU discovery through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Only index, UUID, product name and memory are essential: without them a GPU cannot be published,
so it is skipped with an error log. Every other call may be missing from an older driver
(``Function Not Found``) or unsupported on a board (``Not Supported``); then the attribute is
omitted and the fact logged once per call, never a crash. An ``nvmlInit`` failure becomes one
:class:`~dra_driver.devices.source.DeviceSourceError` line that says what to check. Discovery holds
its own NVML initialisation (:mod:`dra_driver.devices.nvml_session`) and gives it back when done.

* Names: ``gpu-<minor>`` (``nvmlDeviceGetMinorNumber``, the ``/dev/nvidia<minor>`` number), which
  stays with the physical card when another GPU falls off the bus and NVML's indexes shift; the
  index stays the ``index`` attribute. If any GPU's minor number is unknown or repeated, every GPU
  is named ``gpu-<index>`` instead, with a warning.
* Memory: ``total - reserved`` of ``nvmlDeviceGetMemoryInfo_v2``, because the driver's reserved
  memory can never be handed to a tenant; drivers without the v2 call publish the v1 total.
* Compute mode: ``nvmlDeviceGetComputeMode``, published as ``computeMode``; a card in any mode but
  Default is given out whole only (one process may hold a context, or none), logged once here.
* NUMA node: sysfs ``<sysfs>/bus/pci/devices/<busid>/numa_node`` first (the CPU affinity;
  ``-1`` means none and the attribute is omitted), ``nvmlDeviceGetNumaNodeId`` only when sysfs has
  no answer (on Grace it reports the GPU memory's node, not the CPUs').
* The PCIe root (``pci<domain>:<bus>``) comes from the sysfs path of the device, like upstream's
  ``deviceattribute`` helper.
* NVLink: every link is probed on its own, so one failing link costs only itself. An active link
  whose remote end is another GPU of this node counts for that pair; links into an NVSwitch fabric
  make every GPU with switch links a peer of every other (with the smaller of the two link counts).
* MIG: a GPU in MIG mode carries its MIG devices (:mod:`dra_driver.devices.nvml_mig`), which are
  published instead of the card (:mod:`dra_driver.devices.mig`).

Tests run this module unmodified against ``hack/mock-nvml`` through the real ``pynvml`` bindings.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from dra_driver.devices.mig import checked_mig_cards
from dra_driver.devices.model import (
    COMPUTE_MODES,
    DeviceModelError,
    Gpu,
    cuda_version_from_int,
    normalize_pci_bus_id,
)
from dra_driver.devices.nvml_mig import read_mig_devices
from dra_driver.devices.nvml_session import NVML_NOT_FOUND_HINT as NVML_NOT_FOUND_HINT
from dra_driver.devices.nvml_session import NvmlSession
from dra_driver.devices.source import DeviceSourceError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: nvmlBrandType_t -> name (nvml.h).
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "TITAN",
    7: "NVIDIA vApps",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "TITAN RTX",
}

#: nvmlDeviceArchitecture_t -> name (nvml.h).
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@dataclass
class _Found:
    gpu: Gpu
    switch_links: int = 0
    gpu_links: dict[str, int] = field(default_factory=dict)


class NvmlSource:
    """``--source nvml``: the node's real GPUs.

    ``sysfs_root`` exists for tests (a fake ``/sys`` tree); ``nvml`` lets tests pass another module
    with pynvml's API, the default is the real ``pynvml``.
    """

    def __init__(self, *, sysfs_root: Path = Path("/sys"), nvml: Any = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self._nvml = nvml
        self._logged: set[str] = set()

    def discover(self) -> list[Gpu]:
        with NvmlSession(self._nvml) as nvml:
            self._nvml = nvml
            return self._discover(nvml)

    def _discover(self, nvml: Any) -> list[Gpu]:
        driver_version = self._optional(
            nvml, "nvmlSystemGetDriverVersion", lambda: _text(nvml.nvmlSystemGetDriverVersion())
        )
        cuda = self._optional(nvml, "nvmlSystemGetCudaDriverVersion", nvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver_version = cuda_version_from_int(cuda) if isinstance(cuda, int) and cuda > 0 else None
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            raise DeviceSourceError(f"NVML could not count the GPUs (nvmlDeviceGetCount: {err})") from err
        found: list[_Found] = []
        for index in range(count):
            try:
                item = self._device(nvml, index, driver_version, cuda_driver_version)
            except (nvml.NVMLError, DeviceModelError) as err:
                log.error("GPU index %d skipped: NVML could not describe it: %s", index, err)
                continue
            found.append(item)
        # Peers first: a link to a MIG-mode GPU is a GPU link, not a switch link.
        return checked_mig_cards(_named_by_minor(_with_nvlink_peers(found)))

    def _device(
        self, nvml: Any, index: int, driver_version: str | None, cuda_driver_version: str | None
    ) -> _Found:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        label = f"GPU index {index} ({uuid})"
        memory, reserved = self._memory(nvml, handle, label)

        def call(label: str, fn: Callable[[], T]) -> T | None:
            return self._optional(nvml, label, fn)

        minor = call("nvmlDeviceGetMinorNumber", lambda: int(nvml.nvmlDeviceGetMinorNumber(handle)))
        brand_id = call("nvmlDeviceGetBrand", lambda: int(nvml.nvmlDeviceGetBrand(handle)))
        arch_id = call("nvmlDeviceGetArchitecture", lambda: int(nvml.nvmlDeviceGetArchitecture(handle)))
        capability = call(
            "nvmlDeviceGetCudaComputeCapability", lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle)
        )
        bus_raw = call("nvmlDeviceGetPciInfo", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        bus_id = None
        if bus_raw:
            try:
                bus_id = normalize_pci_bus_id(bus_raw)
            except DeviceModelError as err:
                self._note(f"bus:{index}", f"{label}: PCI bus id omitted: {err}")
        compute_mode = self._compute_mode(nvml, handle, label)
        mig = call("nvmlDeviceGetMigMode", lambda: nvml.nvmlDeviceGetMigMode(handle))
        if mig and not mig[0] and mig[1]:
            log.warning(
                "%s: MIG mode is pending and takes effect at the next GPU reset; the GPU will then be "
                "published as its MIG devices, no longer whole",
                label,
            )
        mig_devices = read_mig_devices(nvml, handle, label, self._note) if mig and mig[0] else ()
        gpu = Gpu(
            index=index,
            uuid=uuid,
            product_name=name,
            memory_bytes=memory,
            memory_reserved_bytes=reserved,
            compute_mode=compute_mode,
            minor=minor,
            brand=BRANDS.get(brand_id) if brand_id is not None else None,
            architecture=ARCHITECTURES.get(arch_id) if arch_id is not None else None,
            cuda_compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            driver_version=driver_version,
            cuda_driver_version=cuda_driver_version,
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            numa_node=self._numa_node(nvml, handle, index, label, bus_id),
            mig_enabled=bool(mig[0]) if mig else None,
            mig_devices=mig_devices,
        )
        item = _Found(gpu)
        self._nvlinks(nvml, handle, item, label)
        return item

    def _compute_mode(self, nvml: Any, handle: Any, label: str) -> str | None:
        """NVML's compute mode by name; a mode that forbids sharing is logged (once per GPU)."""
        code = self._optional(
            nvml, "nvmlDeviceGetComputeMode", lambda: int(nvml.nvmlDeviceGetComputeMode(handle))
        )
        if code is None:
            return None
        mode = COMPUTE_MODES.get(code)
        if mode is None:
            self._note(f"compute:{label}", f"{label}: unknown compute mode {code}; attribute omitted")
        elif mode != "Default":
            self._note(
                f"compute:{label}",
                f"{label}: compute mode {mode}: CUDA cannot run two tenants' processes on it, so it is "
                "given out whole only (nvidia-smi -c DEFAULT to share it)",
            )
        return mode

    def _memory(self, nvml: Any, handle: Any, label: str) -> tuple[int, int]:
        """Memory a tenant can get and what the driver reserves: v2's ``total - reserved`` and
        ``reserved``, else (older drivers) the v1 total and 0."""
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except nvml.NVMLError as err:
                self._note(
                    "nvmlDeviceGetMemoryInfo_v2",
                    f"nvmlDeviceGetMemoryInfo_v2 unavailable ({err}); published memory includes the "
                    "driver's reserved memory",
                )
            else:
                total, reserved = int(info.total), int(info.reserved)
                if 0 <= reserved < total:
                    return total - reserved, reserved
                self._note(
                    f"reserved:{label}",
                    f"{label}: NVML reports {reserved} bytes reserved of {total}; publishing the total",
                )
                return total, 0
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).total), 0

    def _numa_node(self, nvml: Any, handle: Any, index: int, label: str, bus_id: str | None) -> int | None:
        path = None
        if bus_id is not None:
            path = self.sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node"
            try:
                value = int(path.read_text().strip())
            except (OSError, ValueError):
                pass
            else:
                if value >= 0:
                    return value
                self._note(
                    f"numa:{index}",
                    f"{label}: {path} says -1 (no NUMA affinity); attribute omitted",
                    logging.INFO,
                )
                return None
        node = self._optional(
            nvml, "nvmlDeviceGetNumaNodeId", lambda: int(nvml.nvmlDeviceGetNumaNodeId(handle))
        )
        if node is not None and node >= 0:
            return node
        where = f"neither {path} nor NVML knows" if path else "no PCI bus id, and NVML does not know"
        self._note(f"numa:{index}", f"{label}: NUMA node unknown ({where}); attribute omitted")
        return None

    def _pcie_root(self, bus_id: str | None) -> str | None:
        if bus_id is None:
            return None
        try:
            resolved = (self.sysfs_root / "bus" / "pci" / "devices" / bus_id).resolve(strict=True)
        except OSError:
            return None
        return next((part for part in resolved.parts if _PCIE_ROOT.match(part)), None)

    def _nvlinks(self, nvml: Any, handle: Any, item: _Found, label: str) -> None:
        """Probe every link on its own: a link that fails is left out, the others still count."""
        absent = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}
        failed: list[str] = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = normalize_pci_bus_id(
                    _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                )
            except nvml.NVMLError as err:
                if err.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    break  # a driver without NVLink calls at all
                if err.value not in absent:  # absent: no NVLink on this board, or no such link
                    failed.append(f"{link} ({err})")
                continue
            except DeviceModelError as err:
                failed.append(f"{link} ({err})")
                continue
            item.gpu_links[remote] = item.gpu_links.get(remote, 0) + 1
        if failed:
            self._note(
                f"nvlink:{item.gpu.index}",
                f"{label}: NVLink link(s) {', '.join(failed)} could not be read; its peers are counted "
                "without them",
            )

    def _optional(self, nvml: Any, label: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except nvml.NVMLError as err:
            # "Not Supported" is a property of the board (no MIG on a T4): worth an info line, not a
            # warning. Anything else (a driver without the call, a failing GPU) is a warning.
            level = logging.INFO if err.value == nvml.NVML_ERROR_NOT_SUPPORTED else logging.WARNING
            self._note(label, f"{label} unavailable ({err}); the attribute is omitted", level)
            return None

    def _note(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, "%s", message)


def _named_by_minor(gpus: list[Gpu]) -> list[Gpu]:
    """Name every GPU ``gpu-<minor>`` when all minor numbers are known and distinct, else none."""
    minors = [gpu.minor for gpu in gpus]
    if all(minor is not None for minor in minors) and len(set(minors)) == len(minors):
        return [replace(gpu, name_by_minor=True) for gpu in gpus]
    log.warning(
        "device names fall back to gpu-<index>: the minor numbers %s are not all known and distinct; "
        "such names follow NVML's index, which shifts when a GPU falls off the bus",
        minors,
    )
    return gpus


def _with_nvlink_peers(found: list[_Found]) -> list[Gpu]:
    """Resolve remote PCI addresses of active links to GPU indexes (or to the NVSwitch fabric)."""
    by_bus = {item.gpu.pci_bus_id: item.gpu.index for item in found if item.gpu.pci_bus_id}
    for item in found:
        for bus, links in list(item.gpu_links.items()):
            if bus not in by_bus:
                item.switch_links += links
                del item.gpu_links[bus]
    result = []
    for item in found:
        peers: dict[int, int] = {}
        for bus, links in item.gpu_links.items():
            if by_bus[bus] != item.gpu.index:
                peers[by_bus[bus]] = peers.get(by_bus[bus], 0) + links
        if item.switch_links:
            for other in found:
                if other is not item and other.switch_links:
                    peer = other.gpu.index
                    peers[peer] = peers.get(peer, 0) + min(item.switch_links, other.switch_links)
        result.append(replace(item.gpu, nvlink_peers=tuple(sorted(peers.items()))))
    return result


def _text(value: Any) -> str:
    """pynvml returns ``str`` from most calls but raw ``bytes`` from struct fields."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
