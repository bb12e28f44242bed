"""The node's GPUs as the kubelet plugin needs them: by pool device name, with what CDI needs.

The plugin prepares devices by the names it published (``gpu-<index>``). This module keeps the
mapping from those names to the facts that preparation needs (minor number for the device node,
PCI bus id for the CUDA ordinal, UUID for the NVIDIA CDI device, capacities for the last-line-of-
defence check) and nothing else, so that prepare/CDI code never depends on how GPUs were discovered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_CORES = 100
DEFAULT_SLOTS = 10


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


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    """First present attribute/key among ``names`` (device models name fields slightly differently)."""
    for name in names:
        if isinstance(obj, Mapping) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def gpu_from_model(device: Any) -> NodeGpu:
    """Adapt a ``dra_driver.devices`` GPU (or a plain mapping with the same keys) to a NodeGpu."""
    index = int(_get(device, "index"))
    name = _get(device, "device_name", "name")
    if not isinstance(name, str) or not name.startswith("gpu-"):
        name = f"gpu-{index}"
    memory = _get(device, "memory_bytes", "memory", "total_memory", "memory_total")
    if isinstance(memory, str):
        from dra_driver.quantity import parse_bytes

        memory = parse_bytes(memory)
    minor = _get(device, "minor", "minor_number", default=index)
    return NodeGpu(
        name=name,
        index=index,
        minor=int(minor if minor is not None else index),
        uuid=str(_get(device, "uuid", default="")),
        pci_bus_id=str(_get(device, "pci_bus_id", "pciBusID", "pci_bus", default="")),
        memory_bytes=int(memory or 0),
        cores=int(_get(device, "cores", default=DEFAULT_CORES) or DEFAULT_CORES),
        slots=int(_get(device, "slots", "split_count", default=DEFAULT_SLOTS) or DEFAULT_SLOTS),
        healthy=bool(_get(device, "healthy", default=True)),
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
