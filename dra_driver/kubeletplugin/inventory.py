"""The node's GPUs as the kubelet plugin needs them: by pool device name, with what CDI needs.

The plugin prepares devices by the names it published (``Gpu.name``: ``gpu-<index>``, or
``gpu-<minor>`` from NVML). This module keeps the mapping from those names to the facts that
preparation needs (minor number for the device node, PCI bus id for the CUDA ordinal, UUID for the
NVIDIA CDI device, capacities for the last-line-of- defence check) and nothing else, so that
prepare/CDI code never depends on how GPUs were discovered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from dra_driver.devices.mig import mig_device_name
from dra_driver.devices.model import DEFAULT_CORES, DEFAULT_SLOTS, Gpu

#: Where the NVIDIA driver lists the minor of every MIG capability (procfs shows the host's).
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of this node, named as in the published pool."""

    name: str
    index: int
    minor: int
    uuid: str
    pci_bus_id: str
    memory_bytes: int
    cores: int = DEFAULT_CORES
    slots: int = DEFAULT_SLOTS
    healthy: bool = True
    #: A MIG device: the minors of its ``/dev/nvidia-caps`` access capabilities (GPU instance,
    #: compute instance); ``minor`` is then the parent card's and ``uuid`` the MIG device's.
    mig_caps: tuple[int, int] | None = None

    @property
    def sort_key(self) -> tuple[str, int]:
        """CUDA ordinal order inside a container: PCI bus id (normalised), then index."""
        return (normalise_pci_bus_id(self.pci_bus_id), self.index)


def normalise_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML's 8-digit domain) -> ``0000:3b:00.0``: the form PCI order sorts by."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}" if sep else text


def node_gpu(gpu: Gpu) -> NodeGpu:
    """The facts preparation needs of a discovered GPU (``dra_driver.devices.model.Gpu``)."""
    return NodeGpu(
        name=gpu.name,
        index=gpu.index,
        minor=gpu.index if gpu.minor is None else gpu.minor,
        uuid=gpu.uuid,
        pci_bus_id=gpu.pci_bus_id or "",
        memory_bytes=gpu.memory_bytes,
        cores=gpu.cores,
        slots=gpu.slots,
        healthy=gpu.healthy,
    )


def node_devices(gpus: Iterable[Gpu], mig_minors: Mapping[str, int] | None = None) -> list[NodeGpu]:
    """What the plugin prepares, by published name: each card, and for a card in MIG mode each of
    its MIG devices instead (given out whole: one slot, the instance's memory).

    ``mig_minors`` is the host's ``/proc/driver/nvidia-caps/mig-minors`` (:func:`read_mig_minors`);
    where it has no line for a capability, the driver's documented numbering is used.
    """
    devices = []
    for gpu in gpus:
        if not gpu.mig_enabled:
            devices.append(node_gpu(gpu))
            continue
        parent = node_gpu(gpu)
        for mig in gpu.mig_devices:
            gi_cap, ci_cap = mig.caps_minors(parent.minor)
            table = mig_minors or {}
            prefix = f"gpu{parent.minor}/gi{mig.gpu_instance}"
            caps = (
                table.get(f"{prefix}/access", gi_cap),
                table.get(f"{prefix}/ci{mig.compute_instance}/access", ci_cap),
            )
            devices.append(
                replace(
                    parent,
                    name=mig_device_name(gpu.name, mig),
                    uuid=mig.uuid,
                    memory_bytes=mig.memory_bytes,
                    slots=1,
                    healthy=gpu.healthy and mig.healthy,
                    mig_caps=caps,
                )
            )
    return devices


def read_mig_minors(path: Path = MIG_MINORS) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as ``{"gpu0/gi1/access": 12, ...}``; empty when the
    file is absent or unreadable (no MIG-capable driver: nothing needs it)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    table = {}
    for line in text.splitlines():
        name, _, minor = line.strip().rpartition(" ")
        if name and minor.isdigit():
            table[name] = int(minor)
    return table


class Inventory:
    """Thread-safe name -> NodeGpu map that the health monitor and discovery can replace at runtime."""

    def __init__(self, gpus: Iterable[NodeGpu] = ()) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[str, NodeGpu] = {gpu.name: gpu for gpu in gpus}

    def get(self, name: str) -> NodeGpu | None:
        with self._lock:
            return self._gpus.get(name)

    def all(self) -> list[NodeGpu]:
        with self._lock:
            return sorted(self._gpus.values(), key=lambda gpu: gpu.index)
