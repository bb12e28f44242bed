"""Simulated GPUs: named hardware profiles and a devices file for anything custom.

Used by the sandbox, the demo and CPU-only CI; never chosen implicitly. Profiles carry real
numbers as NVML reports them (total and reserved memory in MiB as ``nvidia-smi -q`` shows them,
architecture, compute capability, NVLink fabric) so that slices and placements look like those of
real nodes: a GPU publishes its total minus the driver's reserved memory, as NVML discovery does.

* :class:`SimulatedSource` – ``--profile t4|a100-80gb|h100-80gb|h200 --gpus N``: GPUs are split
  evenly over the profile's NUMA nodes in index order (8 GPUs on 2 nodes: 0-3 -> 0, 4-7 -> 1) and get
  deterministic UUIDs derived from the node name and index, so a restarted plugin publishes the
  same devices.
* :class:`DevicesFileSource` – ``--devices-file F`` (YAML or JSON). Accepted shapes: a list of GPUs,
  ``{gpus: [...]}``, or a ``simulate`` scenario ``{nodes: [{name, gpus}]}`` (the node named
  ``--node-name`` is used). GPU keys are the scenario's (``index``, ``productName``, ``memory``,
  ``numaNode``, ``uuid``, ``cores``, ``slots``, ``healthy``; ``allocations`` is ignored here) plus
  optional ``profile`` (fills in the rest from a profile), ``memoryReserved`` (what the driver
  reserves; ``memory`` is what is published), ``computeMode`` (``Default``, ``Exclusive_Process``,
  ``Prohibited``: any but Default is given out whole only), ``minor``, ``brand``, ``architecture``,
  ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``, ``pciBusID``, ``pcieRoot``,
  ``migEnabled``, ``migDevices`` and ``nvlinkPeers`` (``{peerIndex: links}``). See
  ``examples/devices/``. ``migDevices`` (``[3g.40gb, "1g.10gb@6"]``: GPU instance profiles of the
  card's model, each placed at the given start slot or the first free one) puts the card in MIG
  mode with those instances, published instead of the card as on a real node; a GPU with
  ``migEnabled: true`` and no ``migDevices`` publishes nothing, with a warning.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_driver.contract import ISOLATION_SIMULATED
from dra_driver.devices.mig import (
    MigDevice,
    MigModelError,
    checked_mig_cards,
    gpu_instance_id,
    place,
)
from dra_driver.devices.mig_profiles import mig_model
from dra_driver.devices.model import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODES,
    DEFAULT_CORES,
    DEFAULT_SLOTS,
    MIB,
    DeviceModelError,
    Gpu,
    normalize_pci_bus_id,
)
from dra_driver.devices.source import DeviceSourceError
from dra_driver.quantity import QuantityError, parse_bytes

#: Namespace of the deterministic simulated UUIDs (uuid5 of "<node>/<index>").
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.gpu.hami.io")
MAX_SIMULATED_GPUS = 1024


@dataclass(frozen=True, slots=True)
class Profile:
    """A GPU model and the typical server it sits in."""

    product_name: str
    #: ``nvidia-smi -q``'s FB memory total; what is published is this minus ``reserved_mib``.
    memory_mib: int
    architecture: str
    cuda_compute_capability: str
    brand: str
    driver_version: str
    cuda_driver_version: str
    default_gpus: int
    numa_nodes: int
    #: NVLinks per GPU through an NVSwitch fabric (all GPUs of the node are peers); 0 = PCIe only.
    nvswitch_links: int
    #: FB memory the driver reserves (``nvidia-smi -q``'s "Reserved"; it varies a little with the
    #: driver, these are figures seen on real cards).
    reserved_mib: int = 0


PROFILES: Mapping[str, Profile] = {
    "t4": Profile(
        "Tesla T4", 15360, "Turing", "7.5", "NVIDIA", "535.104.05", "12.2", 4, 2, 0, reserved_mib=393
    ),
    "a100-80gb": Profile(
        "NVIDIA A100-SXM4-80GB",
        81920,
        "Ampere",
        "8.0",
        "NVIDIA",
        "550.54.15",
        "12.4",
        8,
        2,
        12,
        reserved_mib=763,
    ),
    "h100-80gb": Profile(
        "NVIDIA H100 80GB HBM3",
        81559,
        "Hopper",
        "9.0",
        "NVIDIA",
        "550.54.15",
        "12.4",
        8,
        2,
        18,
        reserved_mib=516,
    ),
    "h200": Profile(
        "NVIDIA H200", 143771, "Hopper", "9.0", "NVIDIA", "570.124.06", "12.8", 8, 2, 18, reserved_mib=700
    ),
}


def simulated_uuid(node_name: str, index: int) -> str:
    """Deterministic NVIDIA-style UUID (``GPU-<uuid>``) for GPU ``index`` of ``node_name``."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'{node_name}/{index}')}"


def even_numa_node(index: int, gpus: int, numa_nodes: int) -> int:
    """NUMA node of GPU ``index`` when ``gpus`` GPUs are split evenly, in index order, over ``numa_nodes``."""
    return index * max(1, min(numa_nodes, gpus)) // gpus


def simulated_pci_bus_id(index: int) -> str:
    """A plausible, unique bus id per GPU: buses 0x20.. of domain 0, then further domains."""
    return f"{index // 200:04x}:{0x20 + index % 200:02x}:00.0"


def profile_gpus(profile_name: str, *, node_name: str, gpus: int | None = None) -> list[Gpu]:
    """The GPUs of a node built from a named profile (see :data:`PROFILES`)."""
    profile = PROFILES.get(profile_name)
    if profile is None:
        raise DeviceSourceError(f"unknown profile {profile_name!r}; choose one of: {', '.join(PROFILES)}")
    count = profile.default_gpus if gpus is None else gpus
    if isinstance(count, bool) or not 0 <= count <= MAX_SIMULATED_GPUS:
        raise DeviceSourceError(f"--gpus must be within 0..{MAX_SIMULATED_GPUS}, got {count}")
    result = []
    for index in range(count):
        numa = even_numa_node(index, count, profile.numa_nodes)
        bus_id = simulated_pci_bus_id(index)
        peers = tuple((peer, profile.nvswitch_links) for peer in range(count) if peer != index)
        result.append(
            Gpu(
                index=index,
                uuid=simulated_uuid(node_name, index),
                product_name=profile.product_name,
                memory_bytes=(profile.memory_mib - profile.reserved_mib) * MIB,
                memory_reserved_bytes=profile.reserved_mib * MIB,
                compute_mode=COMPUTE_MODE_DEFAULT,
                minor=index,
                brand=profile.brand,
                architecture=profile.architecture,
                cuda_compute_capability=profile.cuda_compute_capability,
                driver_version=profile.driver_version,
                cuda_driver_version=profile.cuda_driver_version,
                pci_bus_id=bus_id,
                pcie_root=f"pci{bus_id[:7]}",
                numa_node=numa,
                mig_enabled=False if profile.architecture in ("Ampere", "Hopper") else None,
                nvlink_peers=peers if profile.nvswitch_links else (),
                isolation=ISOLATION_SIMULATED,
            )
        )
    return result


class SimulatedSource:
    """``--source simulated --profile NAME [--gpus N]``."""

    def __init__(self, profile: str, *, node_name: str, gpus: int | None = None) -> None:
        self.profile = profile
        self.node_name = node_name
        self.gpus = gpus

    def discover(self) -> list[Gpu]:
        return profile_gpus(self.profile, node_name=self.node_name, gpus=self.gpus)


class DevicesFileSource:
    """``--source simulated --devices-file F``: GPUs described one by one in YAML or JSON."""

    def __init__(self, path: Path, *, node_name: str) -> None:
        self.path = Path(path)
        self.node_name = node_name

    def discover(self) -> list[Gpu]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as err:
            raise DeviceSourceError(f"cannot read devices file {self.path}: {err.strerror or err}") from err
        try:
            data = json.loads(text) if self.path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as err:
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DeviceSourceError(f"{self.path}: not valid YAML/JSON: {detail}") from err
        # Like NVML discovery: a card in MIG mode offers its MIG devices (dra_driver/devices/mig.py).
        return checked_mig_cards(parse_devices(data, node_name=self.node_name, origin=str(self.path)))


_GPU_KEYS = {
    "index",
    "productName",
    "memory",
    "memoryReserved",
    "computeMode",
    "numaNode",
    "uuid",
    "cores",
    "slots",
    "healthy",
    "allocations",
    "profile",
    "minor",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "pciBusID",
    "pcieRoot",
    "migEnabled",
    "migDevices",
    "nvlinkPeers",
}


def parse_devices(data: Any, *, node_name: str, origin: str = "devices file") -> list[Gpu]:
    """Turn a loaded devices file into GPUs; every error names ``origin`` and the path inside it."""
    path = "gpus"
    if isinstance(data, Mapping) and "nodes" in data:
        nodes = data["nodes"]
        if not isinstance(nodes, list):
            raise DeviceSourceError(f"{origin}: nodes: expected a list of nodes")
        for position, node in enumerate(nodes):
            if isinstance(node, Mapping) and node.get("name") == node_name:
                data, path = node.get("gpus", []), f"nodes[{position}].gpus"
                break
        else:
            names = [str(node.get("name")) for node in nodes if isinstance(node, Mapping)]
            raise DeviceSourceError(
                f"{origin}: no node named {node_name!r} (nodes: {', '.join(names) or 'none'}); "
                "pass --node-name"
            )
    elif isinstance(data, Mapping):
        unknown = sorted(set(data) - {"gpus"})
        if unknown:
            raise DeviceSourceError(f"{origin}: unknown top-level key(s) {', '.join(unknown)}; expected gpus")
        data = data.get("gpus", [])
    if not isinstance(data, list):
        raise DeviceSourceError(f"{origin}: {path}: expected a list of GPUs")
    gpus = [
        _parse_gpu(entry, position, node_name, f"{origin}: {path}[{position}]")
        for position, entry in enumerate(data)
    ]
    seen: dict[int, int] = {}
    seen_uuids: set[str] = set()
    for position, gpu in enumerate(gpus):
        if gpu.index in seen:
            raise DeviceSourceError(
                f"{origin}: {path}[{position}].index: {gpu.index} already used by {path}[{seen[gpu.index]}]"
            )
        if gpu.uuid in seen_uuids:
            raise DeviceSourceError(f"{origin}: {path}[{position}].uuid: {gpu.uuid} is used twice")
        seen[gpu.index] = position
        seen_uuids.add(gpu.uuid)
    return sorted(gpus, key=lambda gpu: gpu.index)


def _parse_gpu(entry: Any, position: int, node_name: str, where: str) -> Gpu:
    if not isinstance(entry, Mapping):
        raise DeviceSourceError(f"{where}: expected a mapping such as {{index: 0, profile: t4}}")
    unknown = sorted(set(map(str, entry)) - _GPU_KEYS)
    if unknown:
        raise DeviceSourceError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_GPU_KEYS))}"
        )
    given_index = _int(entry, "index", where, default=None, minimum=0)
    index = position if given_index is None else given_index
    base: Gpu | None = None
    if "profile" in entry:
        profile_name = entry["profile"]
        if profile_name not in PROFILES:
            raise DeviceSourceError(
                f"{where}.profile: unknown profile {profile_name!r}; choose one of: {', '.join(PROFILES)}"
            )
        base = profile_gpus(str(profile_name), node_name=node_name, gpus=index + 1)[index]
    elif "productName" not in entry or "memory" not in entry:
        raise DeviceSourceError(f"{where}: give productName and memory, or a profile")
    memory = base.memory_bytes if base else 0
    reserved = base.memory_reserved_bytes if base else 0
    for key in ("memory", "memoryReserved"):
        if key in entry:
            try:
                amount = parse_bytes(entry[key])
            except QuantityError as err:
                raise DeviceSourceError(f"{where}.{key}: {err}") from err
            memory, reserved = (amount, reserved) if key == "memory" else (memory, amount)
    compute_mode = _str(entry, "computeMode", where, base.compute_mode if base else None)
    if compute_mode is not None and compute_mode not in COMPUTE_MODES.values():
        raise DeviceSourceError(
            f"{where}.computeMode: {compute_mode!r} is not a compute mode; choose one of "
            f"{', '.join(COMPUTE_MODES.values())}"
        )
    pci_bus_id = _str(entry, "pciBusID", where, base.pci_bus_id if base else None)
    product_name = _str(entry, "productName", where, base.product_name if base else None) or ""
    uuid_ = _str(entry, "uuid", where, None) or simulated_uuid(node_name, index)
    mig_enabled = _bool(entry, "migEnabled", where, base.mig_enabled if base else None)
    mig_devices: tuple[MigDevice, ...] = ()
    if entry.get("migDevices") is not None:
        if entry.get("migEnabled") is False:
            raise DeviceSourceError(f"{where}.migDevices: the GPU has migEnabled: false")
        mig_enabled = True
        mig_devices = simulated_mig_devices(entry["migDevices"], product_name, uuid_, f"{where}.migDevices")
    if pci_bus_id is not None:
        try:
            pci_bus_id = normalize_pci_bus_id(pci_bus_id)
        except DeviceModelError as err:
            raise DeviceSourceError(f"{where}.pciBusID: {err}") from err
    try:
        return Gpu(
            index=index,
            uuid=uuid_,
            product_name=product_name,
            memory_bytes=memory,
            memory_reserved_bytes=reserved,
            compute_mode=compute_mode,
            minor=_int(entry, "minor", where, default=base.minor if base else index, minimum=0),
            brand=_str(entry, "brand", where, base.brand if base else None),
            architecture=_str(entry, "architecture", where, base.architecture if base else None),
            cuda_compute_capability=_str(
                entry, "cudaComputeCapability", where, base.cuda_compute_capability if base else None
            ),
            driver_version=_str(entry, "driverVersion", where, base.driver_version if base else None),
            cuda_driver_version=_str(
                entry, "cudaDriverVersion", where, base.cuda_driver_version if base else None
            ),
            pci_bus_id=pci_bus_id,
            pcie_root=_str(entry, "pcieRoot", where, base.pcie_root if base else None),
            numa_node=_int(entry, "numaNode", where, default=None, minimum=0),
            mig_enabled=mig_enabled,
            mig_devices=mig_devices,
            nvlink_peers=_nvlink_peers(entry.get("nvlinkPeers"), index, f"{where}.nvlinkPeers"),
            healthy=bool(_bool(entry, "healthy", where, True)),
            isolation=_str(entry, "isolation", where, ISOLATION_SIMULATED) or ISOLATION_SIMULATED,
            cores=_int(entry, "cores", where, default=DEFAULT_CORES, minimum=1) or DEFAULT_CORES,
            slots=_int(entry, "slots", where, default=DEFAULT_SLOTS, minimum=1) or DEFAULT_SLOTS,
        )
    except DeviceModelError as err:
        raise DeviceSourceError(f"{where}: {err}") from err


def simulated_mig_devices(
    value: Any, product_name: str, parent_uuid: str, where: str
) -> tuple[MigDevice, ...]:
    """``migDevices: [3g.40gb, "1g.10gb@6"]``: GPU instances (each with one compute instance that
    spans it) placed like NVML would, at the given start slot or the first free one; UUIDs are
    derived from the parent's, so a restarted plugin publishes the same devices."""
    model = mig_model(product_name)
    if model is None:
        raise DeviceSourceError(f"{where}: {product_name!r} has no MIG profiles (A100, H100 and H200 do)")
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DeviceSourceError(f"{where}: expected a list of profiles such as [3g.40gb, 1g.10gb@6]")
    wanted: list[tuple[str, int | None]] = []
    for item in value:
        name, _, start = item.partition("@")
        if start and not start.isdigit():
            raise DeviceSourceError(f"{where}: {item!r}: the start slot after @ must be a number")
        wanted.append((name.strip(), int(start) if start else None))
    try:
        placed = place(model, wanted)
    except MigModelError as err:
        raise DeviceSourceError(f"{where}: {err}") from err
    devices = []
    for profile, start in placed:
        gi = gpu_instance_id(start, profile.placement_size)
        devices.append(
            MigDevice(
                uuid=f"MIG-{uuid.uuid5(UUID_NAMESPACE, f'{parent_uuid}/gi{gi}/ci0')}",
                profile=profile.name,
                gpu_instance=gi,
                compute_instance=0,
                memory_bytes=profile.memory_mib * MIB,
                slices=profile.slices,
                gpu_instance_slices=profile.slices,
                multiprocessors=profile.multiprocessors,
                placement_start=start,
                placement_size=profile.placement_size,
            )
        )
    return tuple(sorted(devices, key=lambda m: (m.gpu_instance, m.compute_instance)))


def _int(entry: Mapping[str, Any], key: str, where: str, *, default: int | None, minimum: int) -> int | None:
    if key not in entry or entry[key] is None:
        return default
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DeviceSourceError(f"{where}.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str(entry: Mapping[str, Any], key: str, where: str, default: str | None) -> str | None:
    if key not in entry or entry[key] is None:
        return default
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DeviceSourceError(f"{where}.{key}: expected a string, got {value!r}")
    return str(value)


def _bool(entry: Mapping[str, Any], key: str, where: str, default: bool | None) -> bool | None:
    if key not in entry or entry[key] is None:
        return default
    value = entry[key]
    if not isinstance(value, bool):
        raise DeviceSourceError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _nvlink_peers(value: Any, index: int, where: str) -> tuple[tuple[int, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise DeviceSourceError(f"{where}: expected a mapping of peer index to NVLink count, e.g. {{1: 12}}")
    peers = []
    for peer, links in value.items():
        try:
            peer_index = int(peer)
        except (TypeError, ValueError):
            raise DeviceSourceError(f"{where}: peer {peer!r} is not a GPU index") from None
        if peer_index < 0 or peer_index == index:
            raise DeviceSourceError(f"{where}: peer {peer_index} must be another GPU's index")
        if isinstance(links, bool) or not isinstance(links, int) or links < 1:
            raise DeviceSourceError(f"{where}.{peer}: expected a positive NVLink count, got {links!r}")
        peers.append((peer_index, links))
    return tuple(sorted(peers))
