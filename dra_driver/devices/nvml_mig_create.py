"""Create, list and destroy MIG instances through NVML (``pynvml``): MIG on demand's hands.

NVML's calls, in the order the driver needs them (facts from nvml.h, not code):

* ``nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement)``: the GPU instance at
  exactly that start slot; ``INSUFFICIENT_RESOURCES`` when it overlaps one that exists,
  ``INVALID_ARGUMENT`` for a start the profile does not have, ``NOT_SUPPORTED`` while MIG is off.
* ``nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, engine)`` then
  ``nvmlGpuInstanceCreateComputeInstance(gi, id)``: one compute instance spanning the GPU instance
  (what CUDA then sees as one MIG device).
* The MIG device's UUID: the MIG device handle whose GPU and compute instance ids are these.
* Destroy: every compute instance first (a GPU instance that still has one answers ``IN_USE``),
  then the GPU instance.

Errors are raised as :class:`MigCreateError` naming the card, the placement and NVML's answer, so
the prepare that needed it fails with a message an operator can act on.
"""

from __future__ import annotations

import logging
from ctypes import byref
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.devices.mig_profiles import COMPUTE_SLICES

log = logging.getLogger(__name__)

#: ``NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE``: the compute instance profile spanning a GPU
#: instance of that many compute slices.
_WHOLE_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, COMPUTE_SLICES: 4}
_GPU_INSTANCE_IDS = range(15)
_COMPUTE_INSTANCE_IDS = range(8)


class MigCreateError(RuntimeError):
    """NVML refused to create or destroy an instance."""


@dataclass(frozen=True, slots=True)
class LiveInstance:
    """A GPU instance NVML has, with the compute instance(s) in it."""

    gpu_instance: int
    profile_id: int
    start: int
    size: int
    #: ``(compute instance id, MIG device UUID or "")`` of each compute instance.
    compute_instances: tuple[tuple[int, str], ...] = ()


class MigDriver(Protocol):
    """What MIG on demand needs of the GPU driver (NVML on a node; a fake in unit tests)."""

    def create(
        self, parent_uuid: str, profile_id: int, slices: int, start: int, size: int
    ) -> LiveInstance: ...

    def destroy(self, parent_uuid: str, gpu_instance: int) -> None: ...

    def instances(self, parent_uuid: str) -> list[LiveInstance]: ...


class NvmlMigDriver:
    """:class:`MigDriver` through ``pynvml``; the caller holds an NVML session for its lifetime."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _card(self, parent_uuid: str) -> Any:
        try:
            return self.nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
        except self.nvml.NVMLError as err:
            raise MigCreateError(f"GPU {parent_uuid} is not there: {err}") from err

    def create(self, parent_uuid: str, profile_id: int, slices: int, start: int, size: int) -> LiveInstance:
        nvml = self.nvml
        card = self._card(parent_uuid)
        where = f"GPU {parent_uuid}: GPU instance profile {profile_id} at memory slice {start}"
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        try:
            # pynvml hands the placement to C as given, and C takes a pointer to it.
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(card, profile_id, byref(placement))
        except nvml.NVMLError as err:
            raise MigCreateError(f"{where}: {_explain(nvml, err)}") from err
        gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
        try:
            ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, _WHOLE_CI_PROFILE[slices], nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        except (nvml.NVMLError, KeyError) as err:
            with _logged(f"{where}: removing the GPU instance whose compute instance failed"):
                nvml.nvmlGpuInstanceDestroy(gi)
            raise MigCreateError(f"{where}: no compute instance: {err}") from err
        uuid = self._mig_uuid(card, gi_id, ci_id)
        return LiveInstance(gi_id, profile_id, start, size, ((ci_id, uuid),))

    def _mig_uuid(self, card: Any, gi_id: int, ci_id: int) -> str:
        nvml = self.nvml
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(card))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(card, slot)
            except nvml.NVMLError:
                continue
            ids = (int(nvml.nvmlDeviceGetGpuInstanceId(mig)), int(nvml.nvmlDeviceGetComputeInstanceId(mig)))
            if ids == (gi_id, ci_id):
                uuid = nvml.nvmlDeviceGetUUID(mig)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return ""

    def destroy(self, parent_uuid: str, gpu_instance: int) -> None:
        nvml = self.nvml
        card = self._card(parent_uuid)
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(card, gpu_instance)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_NOT_FOUND:
                return  # already gone: destroying is idempotent
            raise MigCreateError(f"GPU {parent_uuid}: GPU instance {gpu_instance}: {err}") from err
        try:
            for ci_id in _COMPUTE_INSTANCE_IDS:
                try:
                    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                except nvml.NVMLError:
                    continue
                nvml.nvmlComputeInstanceDestroy(ci)
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as err:
            raise MigCreateError(
                f"GPU {parent_uuid}: GPU instance {gpu_instance} cannot be destroyed: {_explain(nvml, err)}"
            ) from err

    def instances(self, parent_uuid: str) -> list[LiveInstance]:
        nvml = self.nvml
        card = self._card(parent_uuid)
        found = []
        for gi_id in _GPU_INSTANCE_IDS:
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(card, gi_id)
            except nvml.NVMLError:
                continue
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            cis = []
            for ci_id in _COMPUTE_INSTANCE_IDS:
                try:
                    nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                except nvml.NVMLError:
                    continue
                cis.append((ci_id, self._mig_uuid(card, gi_id, ci_id)))
            found.append(
                LiveInstance(
                    gi_id,
                    int(info.profileId),
                    int(info.placement.start),
                    int(info.placement.size),
                    tuple(cis),
                )
            )
        return found


def _explain(nvml: Any, err: Any) -> str:
    value = getattr(err, "value", None)
    if value == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
        return f"{err} (the placement overlaps an instance that exists)"
    if value == nvml.NVML_ERROR_NOT_SUPPORTED:
        return f"{err} (is MIG mode enabled on the card?)"
    if value == nvml.NVML_ERROR_NO_PERMISSION:
        return f"{err} (creating MIG instances needs root and the card's /dev/nvidia-caps)"
    return str(err)


class _logged:
    """Run a clean-up whose failure is logged, never raised over the error that caused it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        if value is not None:
            log.error("%s failed: %s", self.what, value)
        return True
