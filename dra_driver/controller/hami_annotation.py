"""``hami.io/vgpu-devices-allocated``: the chosen cards on the pod, in HAMi's own encoding.

HAMi users verify placement with
``kubectl get pod <pod> -o jsonpath='{.metadata.annotations.hami\\.io/vgpu-devices-allocated}'``.
HAMi encodes, for each container in ``spec.containers`` order, its devices as
``UUID,Type,UsedMem,UsedCores`` each followed by ``:``, and each container's list followed by
``;`` (containers without devices keep their empty place). Memory is in MiB, cores in percent;
the type is the vendor, ``NVIDIA``. The amounts are what each result takes of its card, by the
consumable-capacity rule (``dra_driver/resource/capacity.py``: the whole card without a
``shareID``, nothing for ``adminAccess``). The controller writes it with the same pod update that lifts
the scheduling gate, so it costs no extra API write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.engine import MIB, GpuCard
from dra_driver.resource.capacity import Capacity, result_consumption

ANNOTATION = "hami.io/vgpu-devices-allocated"
VENDOR = "NVIDIA"
#: What a whole card of an unpublished device counts: no memory known, all of its compute.
UNKNOWN_CARD = Capacity(memory=0, cores=100, slots=1)

Obj = Mapping[str, Any]


def _results(claim: Obj, request: str | None, driver: str) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") != driver:
            continue
        name = str(result.get("request", ""))
        if request is None or name == request or name.split("/", 1)[0] == request:
            out.append(result)
    return out


def _device(result: Obj, card_of: Callable[[DeviceId], GpuCard | None]) -> str:
    device = str(result.get("device", ""))
    card = card_of(DeviceId(str(result.get("driver", "")), str(result.get("pool", "")), device))
    capacity = Capacity(card.memory, card.cores, card.slots) if card else UNKNOWN_CARD
    taken = result_consumption(result).of(capacity)
    return f"{(card.uuid if card else '') or device},{VENDOR},{taken.memory // MIB},{taken.cores}:"


def encode_devices_allocated(
    pod: Obj,
    claims: Mapping[str, Obj],
    driver: str,
    card_of: Callable[[DeviceId], GpuCard | None],
) -> str | None:
    """The annotation value; None when no container consumes a device of ``driver``.

    ``claims`` maps the pod's claim names (``spec.resourceClaims[].name``) to the claims with
    their allocation; ``card_of`` gives a published device's card (UUID, total memory), if known.
    """
    parts = []
    any_device = False
    for container in (pod.get("spec") or {}).get("containers") or ():
        devices = []
        for ref in (container.get("resources") or {}).get("claims") or ():
            claim = claims.get(str(ref.get("name", "")))
            if claim is None:
                continue
            for result in _results(claim, ref.get("request"), driver):
                devices.append(_device(result, card_of))
        any_device = any_device or bool(devices)
        parts.append("".join(devices) + ";")
    return "".join(parts) if any_device else None
