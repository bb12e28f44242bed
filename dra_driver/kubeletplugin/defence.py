"""Last line of defence: refuse a claim that would overcommit a GPU given what is prepared already.

The scheduler (or our controller) is supposed to never do that, but allocations can race (two
allocators, stale caches) and the node is the only place that sees every prepared claim. The
rules are consumable-capacity semantics (``dra_driver/resource/capacity.py``, as the controller's
ledger counts): a result without shareID owns the whole GPU; shares add up their consumed memory,
cores and slots (at least one slot per share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dra_driver.kubeletplugin.claims import AllocatedDevice, ClaimError
from dra_driver.kubeletplugin.inventory import NodeGpu
from dra_driver.quantity import format_bytes
from dra_driver.resource.capacity import Capacity


@dataclass
class GpuUsage:
    """What prepared claims use of one GPU."""

    exclusive_by: str | None = None
    tenants: int = 0
    memory: int = 0
    cores: int = 0
    slots: int = 0


def usage_by_gpu(
    prepared: Iterable[tuple[str, AllocatedDevice]], gpus: dict[str, NodeGpu]
) -> dict[str, GpuUsage]:
    """Aggregate (claim UID, device) pairs into per-GPU usage; admin-access results do not count."""
    usage: dict[str, GpuUsage] = {}
    for claim_uid, device in prepared:
        gpu = gpus.get(device.device)
        if gpu is None or device.admin_access:
            continue
        entry = usage.setdefault(gpu.name, GpuUsage())
        entry.tenants += 1
        taken = device.consumption
        if taken.whole_device:
            entry.exclusive_by = claim_uid
        amounts = taken.of(Capacity(gpu.memory_bytes, gpu.cores, gpu.slots))
        entry.memory += amounts.memory
        entry.cores += amounts.cores
        entry.slots += amounts.slots
    return usage


class CapacityError(ClaimError):
    """The claim does not fit next to what this node has prepared (maybe stale entries)."""


def check_fits(
    claim: str,
    devices: list[tuple[AllocatedDevice, NodeGpu]],
    prepared: Iterable[tuple[str, AllocatedDevice]],
    gpus: dict[str, NodeGpu],
) -> None:
    """Raise CapacityError (with the GPU and the numbers) if ``devices`` do not fit next to ``prepared``."""
    usage = usage_by_gpu(prepared, gpus)
    combined = usage_by_gpu([(claim, d) for d, _ in devices], gpus)
    for name, mine in combined.items():
        other = usage.get(name)
        if other is None or other.tenants == 0:
            continue
        gpu = gpus[name]
        if other.exclusive_by is not None:
            raise CapacityError(f"{gpu.name} is allocated exclusively to prepared claim {other.exclusive_by}")
        if mine.exclusive_by is not None:
            raise CapacityError(
                f"{gpu.name} is requested exclusively but {other.tenants} prepared claim(s) share it"
            )
        if other.memory + mine.memory > gpu.memory_bytes:
            raise CapacityError(
                f"{gpu.name} memory overcommitted: {format_bytes(other.memory)} prepared + "
                f"{format_bytes(mine.memory)} requested > {format_bytes(gpu.memory_bytes)}"
            )
        if other.cores + mine.cores > gpu.cores:
            raise CapacityError(
                f"{gpu.name} cores overcommitted: {other.cores} prepared + {mine.cores} requested "
                f"> {gpu.cores}"
            )
        if other.slots + mine.slots > gpu.slots:
            raise CapacityError(f"{gpu.name} has no free slot: {other.slots} of {gpu.slots} used")
