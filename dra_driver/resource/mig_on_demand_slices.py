"""ResourceSlice entries of cards in MIG on demand: counter sets and placement devices.

A card in MIG on demand (:mod:`dra_driver.devices.mig_on_demand`) publishes one counter set
``<card>-mig`` (``memory-slice-0`` .. ``memory-slice-7`` of 1 each, ``compute-slices`` of 7) and one
device per possible placement, ``<card>-mig-<profile>-at-<start>``, that consumes the memory slices
it covers and its compute slices: whoever allocates (our controller, or kube-scheduler's counter
check) can never hand out two overlapping placements. Each placement device has the attributes of
a static MIG device (:func:`~dra_driver.resource.mig_slices.parent_attributes`, ``profile``,
``slices``, ``multiprocessors``, ``placementStart``, ``memorySlices``, the ``gpuInstance`` id the
driver will give it) plus ``onDemand: true``, and no ``uuid`` (the instance does not exist yet).

Where counters may sit depends on the API server (docs in ``shared/reference/dra-interfaces.md``):

* :data:`LAYOUT_SAME_SLICE` (Kubernetes 1.34): the counter sets are in the slice whose devices
  consume them, at most 32 counters per slice: three cards (27 counters, 54 devices) per slice.
* :data:`LAYOUT_OWN_SLICE` (1.35 and later): "only one of devices and sharedCounters" per slice;
  counter sets (at most 8 per slice) in slices of their own, names unique in the pool; devices
  that consume counters at most 64 per slice: three cards per slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.contract import MEMORY, unhealthy_taint_key
from dra_driver.devices.mig_on_demand import (
    MigPlacement,
    card_counters,
    placement_counters,
    placement_device_name,
    possible_placements,
    spans_of,
)
from dra_driver.devices.mig_profiles import mig_model
from dra_driver.devices.model import Gpu
from dra_driver.quantity import MIB, format_bytes
from dra_driver.resource.mig_slices import parent_attributes
from dra_driver.resource.slices import (
    MIG_COMPUTE_INSTANCE_ATTRIBUTE,
    MIG_GPU_INSTANCE_ATTRIBUTE,
    MIG_MEMORY_SLICES_ATTRIBUTE,
    MIG_MULTIPROCESSORS_ATTRIBUTE,
    MIG_ON_DEMAND_ATTRIBUTE,
    MIG_PLACEMENT_START_ATTRIBUTE,
    MIG_PROFILE_ATTRIBUTE,
    MIG_SLICES_ATTRIBUTE,
)

LAYOUT_SAME_SLICE = "same-slice"
LAYOUT_OWN_SLICE = "own-slice"
LAYOUTS = (LAYOUT_SAME_SLICE, LAYOUT_OWN_SLICE)
#: Cards per slice of placement devices: 3 x 18 placements <= 64 devices, 3 x 9 counters <= 32.
CARDS_PER_DEVICE_SLICE = 3
#: Counter sets per counters-only slice (1.35+).
SETS_PER_COUNTER_SLICE = 8


def layout_for(minor_version: int) -> str:
    """The counter layout an API server of ``1.<minor_version>`` accepts."""
    return LAYOUT_SAME_SLICE if minor_version <= 34 else LAYOUT_OWN_SLICE


def counter_set_name(gpu: Gpu) -> str:
    return f"{gpu.name}-mig"


def counter_set(gpu: Gpu) -> dict[str, Any]:
    """The card's ``sharedCounters[]`` entry."""
    counters = {name: {"value": str(value)} for name, value in card_counters().items()}
    return {"name": counter_set_name(gpu), "counters": counters}


def card_placements(gpu: Gpu) -> list[MigPlacement]:
    """The placements ``gpu`` offers: all but those overlapping instances this driver did not
    create (``gpu.mig_devices`` of an on-demand card lists only those)."""
    model = mig_model(gpu.product_name)
    if model is None:
        return []
    return possible_placements(model, spans_of(gpu.mig_devices))


def placement_entries(gpu: Gpu, *, driver_name: str, taint_unhealthy: bool = False) -> list[dict[str, Any]]:
    """The ``spec.devices[]`` entries of an on-demand card: one per possible placement."""
    return [_entry(gpu, p, driver_name, taint_unhealthy) for p in card_placements(gpu)]


def _entry(gpu: Gpu, placement: MigPlacement, driver_name: str, taint_unhealthy: bool) -> dict[str, Any]:
    attributes = parent_attributes(gpu, healthy=gpu.healthy)
    attributes.update(
        {
            MIG_PROFILE_ATTRIBUTE: {"string": placement.profile.name},
            MIG_SLICES_ATTRIBUTE: {"int": placement.profile.slices},
            MIG_MULTIPROCESSORS_ATTRIBUTE: {"int": placement.profile.multiprocessors},
            MIG_PLACEMENT_START_ATTRIBUTE: {"int": placement.start},
            MIG_MEMORY_SLICES_ATTRIBUTE: {"int": placement.size},
            MIG_GPU_INSTANCE_ATTRIBUTE: {"int": placement.gpu_instance},
            MIG_COMPUTE_INSTANCE_ATTRIBUTE: {"int": 0},
            MIG_ON_DEMAND_ATTRIBUTE: {"bool": True},
        }
    )
    counters = {name: {"value": str(value)} for name, value in placement_counters(placement).items()}
    device: dict[str, Any] = {
        "name": placement_device_name(gpu.name, placement),
        "attributes": attributes,
        "capacity": {MEMORY: {"value": format_bytes((placement.memory_bytes // MIB) * MIB)}},
        "consumesCounters": [{"counterSet": counter_set_name(gpu), "counters": counters}],
    }
    if taint_unhealthy and not gpu.healthy:
        device["taints"] = [{"key": unhealthy_taint_key(driver_name), "effect": "NoSchedule"}]
    return device


def on_demand_slice_specs(
    cards: Sequence[Gpu], *, layout: str, driver_name: str, taint_unhealthy: bool = False
) -> list[dict[str, Any]]:
    """The ``spec`` parts (``devices`` and/or ``sharedCounters``) of the slices ``cards`` need, in
    ``layout``; the caller adds driver, node and pool."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown counter layout {layout!r}; one of {', '.join(LAYOUTS)}")
    ordered = sorted(cards, key=lambda gpu: gpu.index)
    groups = [ordered[i : i + CARDS_PER_DEVICE_SLICE] for i in range(0, len(ordered), CARDS_PER_DEVICE_SLICE)]
    specs: list[dict[str, Any]] = []
    if layout == LAYOUT_OWN_SLICE:
        for i in range(0, len(ordered), SETS_PER_COUNTER_SLICE):
            specs.append(
                {"sharedCounters": [counter_set(g) for g in ordered[i : i + SETS_PER_COUNTER_SLICE]]}
            )
    for group in groups:
        devices = [
            entry
            for gpu in group
            for entry in placement_entries(gpu, driver_name=driver_name, taint_unhealthy=taint_unhealthy)
        ]
        spec: dict[str, Any] = {"devices": devices}
        if layout == LAYOUT_SAME_SLICE:
            spec["sharedCounters"] = [counter_set(gpu) for gpu in group]
        specs.append(spec)
    return specs
