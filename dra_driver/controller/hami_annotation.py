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

from collections.abc import Callable, Mapping, Sequence

from dra_driver.contract import DeviceId
from dra_driver.engine import MIB, GpuCard
from dra_driver.resource.capacity import Capacity, result_consumption
from dra_driver.resource.objects import PodView
from dra_driver.resource.refs import AllocationResult

ANNOTATION = "hami.io/vgpu-devices-allocated"
VENDOR = "NVIDIA"
#: What a whole card of an unpublished device counts: no memory known, all of its compute.
UNKNOWN_CARD = Capacity(memory=0, cores=100, slots=1)


def _device(result: AllocationResult, card_of: Callable[[DeviceId], GpuCard | None]) -> str:
    card = card_of(result.device)
    capacity = Capacity(card.memory, card.cores, card.slots) if card else UNKNOWN_CARD
    taken = result_consumption(result.raw).of(capacity)
    name = (card.uuid if card else "") or result.device.device
    return f"{name},{VENDOR},{taken.memory // MIB},{taken.cores}:"


def encode_devices_allocated(
    pod: PodView,
    results: Mapping[str, Sequence[AllocationResult]],
    driver: str,
    card_of: Callable[[DeviceId], GpuCard | None],
) -> str | None:
    """The annotation value; None when no container consumes a device of ``driver``.

    ``results`` maps the pod's claim names (``spec.resourceClaims[].name``) to their claims'
    allocation results; ``card_of`` gives a published device's card (UUID, total memory), if known.
    """
    parts = []
    any_device = False
    for container in pod.containers:
        devices = [
            _device(result, card_of)
            for ref in container.claims
            for result in results.get(ref.name, ())
            if result.device.driver == driver and result.for_request(ref.request)
        ]
        any_device = any_device or bool(devices)
        parts.append("".join(devices) + ";")
    return "".join(parts) if any_device else None
