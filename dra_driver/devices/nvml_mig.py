"""The MIG devices of a card in MIG mode, read through NVML (``pynvml``).

Each MIG device is a compute instance inside a GPU instance; NVML hands them out by slot
(``nvmlDeviceGetMigDeviceHandleByIndex``, ``NOT_FOUND`` for an empty slot). Of each we need what
CUDA and the container need: its UUID (``MIG-...``), its GPU and compute instance ids (they name
its ``/dev/nvidia-caps`` capabilities), its memory, and its profile. The profile comes from the
MIG device's name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``, as nvidia-smi shows it), the slice
counts and SMs from ``nvmlDeviceGetAttributes_v2``, the placement from the GPU instance
(``nvmlGpuInstanceGetInfo``), which needs more privilege on some drivers and is therefore optional.

One MIG device that cannot be read is left out with an error; the others are still published.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from dra_driver.devices.mig import MigDevice, MigModelError, mig_profile_name

log = logging.getLogger(__name__)

_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(?:(?P<c>\d+)c\.)?(?P<profile>(?P<g>\d+)g\.\S+)\s*$")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_mig_devices(
    nvml: Any, handle: Any, label: str, note: Callable[[str, str], None]
) -> tuple[MigDevice, ...]:
    """The MIG devices of the card behind ``handle`` (in MIG mode), sorted by instance ids.

    ``note(key, message)`` logs a warning once per key (the NVML source's de-duplicating logger).
    """
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError as err:
        note(f"mig-count:{label}", f"{label}: MIG devices cannot be listed ({err}); none published")
        return ()
    found = []
    for slot in range(slots):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_NOT_FOUND:
                continue  # an empty slot
            log.error("%s: MIG device slot %d left out: %s", label, slot, err)
            continue
        try:
            found.append(_mig_device(nvml, handle, mig, label, note))
        except (nvml.NVMLError, MigModelError, ValueError) as err:
            log.error("%s: MIG device in slot %d left out: NVML could not describe it: %s", label, slot, err)
    return tuple(sorted(found, key=lambda m: (m.gpu_instance, m.compute_instance)))


def _mig_device(nvml: Any, parent: Any, mig: Any, label: str, note: Callable[[str, str], None]) -> MigDevice:
    uuid = _text(nvml.nvmlDeviceGetUUID(mig))
    gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    compute_instance = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total)
    name = _text(nvml.nvmlDeviceGetName(mig))
    match = _PROFILE_IN_NAME.search(name)
    if match is None:
        raise ValueError(f"its name {name!r} names no MIG profile")
    gi_slices = int(match["g"])
    slices = int(match["c"]) if match["c"] else gi_slices
    multiprocessors = None
    try:
        attributes = nvml.nvmlDeviceGetAttributes_v2(mig)
    except nvml.NVMLError as err:
        note(f"mig-attributes:{label}", f"{label}: MIG device attributes unavailable ({err}); SMs omitted")
    else:
        multiprocessors = int(attributes.multiprocessorCount) or None
        slices = int(attributes.computeInstanceSliceCount) or slices
        gi_slices = int(attributes.gpuInstanceSliceCount) or gi_slices
    start = size = None
    try:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance))
    except nvml.NVMLError as err:
        note(f"mig-placement:{label}", f"{label}: MIG placements unavailable ({err}); attribute omitted")
    else:
        start, size = int(info.placement.start), int(info.placement.size)
    return MigDevice(
        uuid=uuid,
        profile=mig_profile_name(match["profile"], slices, gi_slices),
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        memory_bytes=memory,
        slices=slices,
        gpu_instance_slices=gi_slices,
        multiprocessors=multiprocessors,
        placement_start=start,
        placement_size=size,
    )
