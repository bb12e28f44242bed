"""GPUs in MIG mode publish their MIG devices, never themselves (issue 37, static MIG).

A card with MIG enabled cannot run CUDA work as a whole GPU: CUDA sees only its MIG devices (one
per compute instance inside a GPU instance), each with its own SMs, memory and L2, isolated in
hardware from the others. So such a card is never offered whole nor as HAMi shares; each of its
existing MIG devices is (:class:`MigDevice`, carried by the parent :class:`~dra_driver.devices.model.Gpu`
in ``mig_devices``), given out whole: HAMi-core's memory and SM limits work through CUDA's
whole-device view and say nothing of MIG (a MIG device's limits are the hardware's), so this
driver does not split a MIG device further.

Both sources fill ``mig_devices``: :mod:`dra_driver.devices.nvml` from NVML's MIG device handles,
:mod:`dra_driver.devices.simulated` from ``migDevices`` in a devices file (placed on the card's
fixed start slots, :mod:`dra_driver.devices.mig_profiles`). A card in MIG mode without MIG devices
publishes nothing and says so (:func:`checked_mig_cards`).

The device model is shaped for on-demand MIG (KEP-4815 partitionable devices) to come: a MIG device
names its profile and its placement (start and size in memory slices), which is what a possible
placement that consumes a card's slice counters will carry too; the existing instance adds its ids
and UUID.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dra_driver.devices.mig_profiles import MEMORY_SLICES, MigModel, MigProfile

if TYPE_CHECKING:
    from dra_driver.devices.model import Gpu

log = logging.getLogger(__name__)

#: /proc/driver/nvidia-caps/mig-minors: ``config 1``, ``monitor 2``, then per GPU minor 15 GPU
#: instances of 1 access + 8 compute instance access capabilities, in order (NVIDIA's driver
#: documentation lists ``gpu0/gi0/access 3`` ... ``gpu31/gi14/ci7/access 4322``).
_CAPS_FIRST = 3
_CAPS_PER_GI = 1 + 8
_CAPS_PER_GPU = 15 * _CAPS_PER_GI


class MigModelError(ValueError):
    """A MIG device description is inconsistent (ids out of range, bad placement, ...)."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a compute instance of a GPU instance) of a card in MIG mode.

    ``profile`` is the name CUDA, ``nvidia-smi`` and NVIDIA's device plugin use: the GPU instance's
    profile (``1g.10gb``) when the compute instance spans it, else ``<c>c.<profile>``
    (``1c.3g.40gb``). ``gpu_instance`` / ``compute_instance`` are NVML's ids, which name the
    device's ``/dev/nvidia-caps`` capabilities; ``placement_start``/``placement_size`` are the
    GPU instance's memory slices (None where NVML would not say).
    """

    uuid: str
    profile: str
    gpu_instance: int
    compute_instance: int
    memory_bytes: int
    #: Compute slices of the MIG device (its compute instance) and of its GPU instance.
    slices: int
    gpu_instance_slices: int
    multiprocessors: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    healthy: bool = True

    def __post_init__(self) -> None:
        where = f"MIG device {self.uuid or '?'}"
        if not self.uuid:
            raise MigModelError("a MIG device needs its UUID")
        if not self.profile:
            raise MigModelError(f"{where}: profile must not be empty")
        if not 0 <= self.gpu_instance < 15:
            raise MigModelError(f"{where}: GPU instance id must be within 0..14, got {self.gpu_instance}")
        if not 0 <= self.compute_instance < 8:
            raise MigModelError(
                f"{where}: compute instance id must be within 0..7, got {self.compute_instance}"
            )
        if self.memory_bytes <= 0:
            raise MigModelError(f"{where}: memory must be positive")
        if not 1 <= self.slices <= self.gpu_instance_slices <= 8:
            raise MigModelError(
                f"{where}: slices must satisfy 1 <= {self.slices} <= {self.gpu_instance_slices} <= 8"
            )
        if (self.placement_start is None) != (self.placement_size is None):
            raise MigModelError(f"{where}: placement start and size go together")
        start, size = self.placement_start, self.placement_size
        if start is not None and size is not None and (start < 0 or start + size > MEMORY_SLICES):
            raise MigModelError(f"{where}: placement {start}+{size} is off the card")

    def caps_minors(self, parent_minor: int) -> tuple[int, int]:
        """Minors of ``/dev/nvidia-caps/nvidia-cap<N>`` for this GPU instance's and compute
        instance's access capabilities, by the mig-minors numbering (``parent_minor`` is the
        card's ``/dev/nvidia<minor>``). The plugin prefers the host's mig-minors file."""
        return mig_caps_minors(parent_minor, self.gpu_instance, self.compute_instance)


def mig_caps_minors(gpu_minor: int, gpu_instance: int, compute_instance: int) -> tuple[int, int]:
    """``(gpu<m>/gi<g>/access, gpu<m>/gi<g>/ci<c>/access)`` minors as the driver numbers them."""
    gi = _CAPS_FIRST + gpu_minor * _CAPS_PER_GPU + gpu_instance * _CAPS_PER_GI
    return gi, gi + 1 + compute_instance


def mig_device_name(parent_name: str, mig: MigDevice) -> str:
    """``gpu-<n>-mig-<gi>-<ci>``: the parent card's device name and the instance ids, which stay
    the same as long as the instance exists (NVML's MIG device index does not)."""
    return f"{parent_name}-mig-{mig.gpu_instance}-{mig.compute_instance}"


def mig_profile_name(gpu_instance_profile: str, slices: int, gpu_instance_slices: int) -> str:
    """``1g.10gb`` for a compute instance spanning its GPU instance, ``1c.3g.40gb`` for a smaller one."""
    if slices == gpu_instance_slices:
        return gpu_instance_profile
    return f"{slices}c.{gpu_instance_profile}"


def place(model: MigModel, wanted: Sequence[tuple[str, int | None]]) -> list[tuple[MigProfile, int]]:
    """GPU instances ``(profile name, start or None)`` placed on an empty card of ``model``.

    A given start must be one of the profile's start slots; without one, the first free slot is
    taken, in the order given. Raises :class:`MigModelError` naming what does not fit, as NVML's
    create would (INSUFFICIENT_RESOURCES / INVALID_ARGUMENT).
    """
    placed: list[tuple[MigProfile, int]] = []
    for name, start in wanted:
        try:
            profile = model.by_name(name)
        except KeyError as err:
            raise MigModelError(str(err.args[0])) from None
        if start is not None and start not in profile.placements:
            raise MigModelError(
                f"{name} cannot start at memory slice {start}; its start slots are "
                f"{', '.join(map(str, profile.placements))}"
            )
        same = sum(1 for other, _ in placed if other.profile_id == profile.profile_id)
        candidates = [start] if start is not None else list(profile.placements)
        free = [
            slot
            for slot in candidates
            if same < profile.instance_count
            and not any(set(profile.spans(slot)) & set(other.spans(at)) for other, at in placed)
        ]
        if not free:
            taken = ", ".join(f"{other.name}@{at}" for other, at in placed) or "nothing"
            raise MigModelError(f"{name} does not fit next to {taken} on a {model.product_name}")
        placed.append((profile, free[0]))
    return placed


def gpu_instance_id(start: int, size: int) -> int:
    """The GPU instance id the driver gives a placement (A100/H100 numbering by memory span)."""
    return {8: 0, 4: 1 + start // 4, 2: 3 + start // 2, 1: 7 + start}[size]


def checked_mig_cards(gpus: Sequence[Gpu]) -> list[Gpu]:
    """``gpus`` as published: a card in MIG mode keeps only its MIG devices (logged when it has
    none), and NVLink links to such cards are dropped from the other GPUs' peers, since no whole-card
    placement can use them."""
    mig_cards = [gpu for gpu in gpus if gpu.mig_enabled]
    if not mig_cards:
        return list(gpus)
    for gpu in mig_cards:
        if not gpu.mig_devices:
            log.warning(
                "GPU %s (index %d, %s) is in MIG mode but has no MIG devices: nothing of it is "
                "published (create GPU and compute instances, e.g. nvidia-smi mig -cgi 1g.10gb -C, "
                "then restart the plugin; or mark it for MIG on demand, --mig-on-demand)",
                gpu.uuid, gpu.index, gpu.product_name,
            )  # fmt: skip
        else:
            log.info(
                "GPU %s (index %d) is in MIG mode: publishing its %d MIG device(s) (%s), not the card",
                gpu.uuid, gpu.index, len(gpu.mig_devices), ", ".join(m.profile for m in gpu.mig_devices),
            )  # fmt: skip
    gone = {gpu.index for gpu in mig_cards}
    return [
        gpu
        if gpu.mig_enabled
        else replace(gpu, nvlink_peers=tuple(p for p in gpu.nvlink_peers if p[0] not in gone))
        for gpu in gpus
    ]
