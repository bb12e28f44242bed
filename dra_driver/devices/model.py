"""The one device model every GPU source produces: :class:`Gpu`, a frozen dataclass.

NVML and the simulated profiles both end in a list of ``Gpu``; the ResourceSlice builder
(:mod:`dra_driver.resource.slice_builder`) and anything that feeds the policy engine read only this
type, so neither ever asks which source it has. Values are kept as the hardware reports them
(e.g. NVIDIA's driver version ``535.104.05``); conversions the Kubernetes API needs, such as strict
semver, happen where the slice is built (:func:`semver`).

Fields that a source cannot determine are ``None`` and the matching attribute is left out of the
ResourceSlice, rather than published with a made-up value that a CEL selector might match.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dra_driver.contract import ISOLATION_NONE, ISOLATION_VALUES
from dra_driver.devices.mig import MigDevice
from dra_driver.devices.nvlink import pair_scores
from dra_driver.quantity import MIB as MIB  # re-exported: the unit of every memory amount here
from dra_driver.resource.slices import device_name

DEFAULT_CORES = 100
DEFAULT_SLOTS = 10

#: ``nvmlComputeMode_t`` -> the name ``nvidia-smi`` shows (and the ``computeMode`` attribute holds).
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
COMPUTE_MODE_DEFAULT = "Default"

_PCI_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)
_VERSION = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$")


class DeviceModelError(ValueError):
    """A device description is inconsistent (bad index, memory, PCI address, ...)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical NVIDIA GPU on this node, as discovered.

    ``index`` is the nvidia-smi / NVML enumeration index. The device name is ``gpu-<index>``, or
    ``gpu-<minor>`` (the ``/dev/nvidia<minor>`` number) when ``name_by_minor`` is set: NVML
    discovery sets it because NVML's indexes shift when a GPU falls off the bus, and a name must
    keep meaning the same physical card. ``index`` stays the engine's and the slice's ``index``.
    ``nvlink_peers`` holds ``(peer index, active NVLink count)`` pairs sorted by peer index; the
    engine's ``topology-aware`` filter uses :attr:`pair_scores` derived from it.
    ``cores`` and ``slots`` are HAMi's sharing limits (100 % of the SMs, split count), published as
    consumable capacity. ``memory_bytes`` is what a tenant can get: NVML's total minus the memory
    the driver reserves (``memory_reserved_bytes``), as NVIDIA publishes it. ``compute_mode`` is
    NVML's (``COMPUTE_MODES``); anything but ``Default`` lets one process at most (or none) hold a
    CUDA context, so such a card is given out whole only (:attr:`whole_only`).
    ``health_monitored`` is set by the kubelet plugin (None: not known here, attribute omitted).
    """

    index: int
    uuid: str
    product_name: str
    memory_bytes: int
    minor: int | None = None
    brand: str | None = None
    architecture: str | None = None
    cuda_compute_capability: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    mig_enabled: bool | None = None
    nvlink_peers: tuple[tuple[int, int], ...] = ()
    healthy: bool = True
    cores: int = DEFAULT_CORES
    slots: int = DEFAULT_SLOTS
    name_by_minor: bool = False
    #: How shares of this GPU are enforced (``dra_driver/contract.py``: hami-core, none, simulated).
    isolation: str = ISOLATION_NONE
    hami_core_version: str | None = None
    memory_reserved_bytes: int = 0
    compute_mode: str | None = None
    health_monitored: bool | None = None
    #: The MIG devices of a card in MIG mode (``mig_enabled``), published instead of the card
    #: (:mod:`dra_driver.devices.mig`); in GPU instance, then compute instance id order.
    mig_devices: tuple[MigDevice, ...] = ()
    #: The admin marked this card (in MIG mode) for MIG on demand (``--mig-on-demand``,
    #: :mod:`dra_driver.devices.mig_on_demand`): it publishes its possible placements, and the
    #: instances are created at prepare. ``mig_devices`` then lists only instances this driver did
    #: not create (their memory slices are not offered).
    mig_on_demand: bool = False

    def __post_init__(self) -> None:
        where = f"gpu-{self.index}"
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise DeviceModelError(f"GPU index must be a non-negative integer, got {self.index!r}")
        if not self.uuid:
            raise DeviceModelError(f"{where}: uuid must not be empty")
        if not self.product_name:
            raise DeviceModelError(f"{where}: product name must not be empty")
        if self.isolation not in ISOLATION_VALUES:
            raise DeviceModelError(
                f"{where}: isolation must be one of {', '.join(ISOLATION_VALUES)}, got {self.isolation!r}"
            )
        # Two MiB is the smallest memory whose capacity request policy (min 1Mi, step 1Mi) validates.
        if self.memory_bytes < 2 * MIB:
            raise DeviceModelError(f"{where}: memory must be at least 2Mi, got {self.memory_bytes} bytes")
        if self.memory_reserved_bytes < 0:
            raise DeviceModelError(f"{where}: reserved memory must not be negative")
        if self.compute_mode is not None and self.compute_mode not in COMPUTE_MODES.values():
            raise DeviceModelError(
                f"{where}: compute mode must be one of {', '.join(COMPUTE_MODES.values())}, "
                f"got {self.compute_mode!r}"
            )
        if not 1 <= self.cores <= 100:
            raise DeviceModelError(f"{where}: cores must be within 1..100, got {self.cores}")
        if self.slots < 1:
            raise DeviceModelError(f"{where}: slots must be at least 1, got {self.slots}")
        if self.minor is not None and self.minor < 0:
            raise DeviceModelError(f"{where}: minor number must not be negative, got {self.minor}")
        if self.name_by_minor and self.minor is None:
            raise DeviceModelError(f"{where}: named by minor number, but the minor number is unknown")
        if self.numa_node is not None and self.numa_node < 0:
            raise DeviceModelError(f"{where}: NUMA node must be >= 0 or unknown (None), got {self.numa_node}")
        if self.pci_bus_id is not None and normalize_pci_bus_id(self.pci_bus_id) != self.pci_bus_id:
            raise DeviceModelError(
                f"{where}: PCI bus id {self.pci_bus_id!r} is not normalized; use normalize_pci_bus_id()"
            )
        if self.mig_devices and not self.mig_enabled:
            raise DeviceModelError(f"{where}: has MIG devices but MIG mode is not enabled")
        if self.mig_on_demand and not self.mig_enabled:
            raise DeviceModelError(f"{where}: MIG on demand needs MIG mode enabled")
        ids = [(mig.gpu_instance, mig.compute_instance) for mig in self.mig_devices]
        if ids != sorted(set(ids)):
            raise DeviceModelError(
                f"{where}: MIG devices must be sorted by unique (GPU, compute) instance ids"
            )
        peers = [peer for peer, _ in self.nvlink_peers]
        if peers != sorted(set(peers)) or self.index in peers:
            raise DeviceModelError(f"{where}: nvlink_peers must be sorted, unique and not include itself")
        if any(links < 1 for _, links in self.nvlink_peers):
            raise DeviceModelError(f"{where}: NVLink counts must be positive")

    @property
    def name(self) -> str:
        """The device name in our ResourceSlices: ``gpu-<minor>`` if ``name_by_minor``, else ``gpu-<index>``.

        Only NVML discovery names by minor, so simulated nodes keep ``gpu-<index>``.
        """
        return device_name(self.minor if self.name_by_minor and self.minor is not None else self.index)

    @property
    def whole_only(self) -> bool:
        """A compute mode other than Default: two tenants' processes cannot both use the card."""
        return self.compute_mode not in (None, COMPUTE_MODE_DEFAULT)

    @property
    def pair_scores(self) -> Mapping[int, int]:
        """Pair scores to other GPUs of the node by index, HAMi-style (``100 * NVLinks``)."""
        return pair_scores(self.nvlink_peers)


def normalize_pci_bus_id(bus_id: str) -> str:
    """Return ``dddd:bb:dd.f`` in lower case, the form sysfs and ``resource.kubernetes.io/pciBusID`` use.

    NVML reports ``00000000:3B:00.0`` (eight-digit domain, upper case); sysfs names the same device
    ``0000:3b:00.0``. A missing domain means domain 0.
    """
    match = _PCI_BUS_ID.match(bus_id.strip())
    if match is None:
        raise DeviceModelError(f"{bus_id!r} is not a PCI address; expected the form 0000:3b:00.0")
    domain = int(match["domain"] or "0", 16)
    if domain > 0xFFFF:
        raise DeviceModelError(f"PCI domain of {bus_id!r} does not fit in 16 bits")
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['dev'], 16):02x}.{match['fn']}"


def semver(version: str) -> str | None:
    """Turn a vendor version into strict semver 2.0.0, or ``None`` if it is not a version at all.

    Kubernetes parses ``version`` attributes strictly: NVIDIA's ``535.104.05`` (leading zero) is
    invalid and would make every CEL selector that touches the device fail, so numeric parts lose
    their leading zeros (``535.104.5``) and missing parts become ``0`` (``12.2`` -> ``12.2.0``).
    """
    match = _VERSION.match(version)
    if match is None:
        return None
    parts = [int(part) if part is not None else 0 for part in match.groups()]
    return ".".join(str(part) for part in parts)


def cuda_version_from_int(value: int) -> str:
    """NVML encodes CUDA driver versions as ``1000 * major + 10 * minor`` (12020 -> ``12.2``)."""
    return f"{value // 1000}.{(value % 1000) // 10}"
