"""The node's GPUs as the kubelet plugin needs them: by pool device name, with what CDI needs.

The plugin prepares devices by the names it published (``Gpu.name``: ``gpu-<index>``, or
``gpu-<minor>`` from NVML). This module keeps the mapping from those names to the facts that
preparation needs (minor number for the device node, PCI bus id for the CUDA ordinal, UUID for the
NVIDIA CDI device, capacities for the last-line-of- defence check) and nothing else, so that
prepare/CDI code never depends on how GPUs were discovered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from dra_driver.devices.model import DEFAULT_CORES, DEFAULT_SLOTS, Gpu


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
