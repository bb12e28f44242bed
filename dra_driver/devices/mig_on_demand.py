"""MIG on demand (issue 37 item 2): a card's possible placements, published before any instance exists.

A card the admin marks for MIG on demand (``--mig-on-demand``, chart value ``migOnDemand``; the
card must already be in MIG mode, which only the admin can switch, see docs/isolation.md) does not
publish existing instances: it publishes every *possible placement* of its profiles (NVML's
``nvmlDeviceGetGpuInstancePossiblePlacements``: a profile of ``n`` memory slices starts at fixed
slots, :mod:`dra_driver.devices.mig_profiles`). Each placement is a device that consumes the
card's shared counters (one per memory slice, and the card's seven compute slices), so two
overlapping placements can never both be allocated, whoever allocates. The controller chooses a
placement with the policy chain; the kubelet plugin creates the GPU and compute instance there at
prepare and destroys them at unprepare (:mod:`dra_driver.kubeletplugin.mig_on_demand`).

Left out: the ``+me`` media-extension profiles (one per card, and which placement holds the media
engines is the driver's choice), and placements that overlap an instance this driver did not
create (an admin's static instance on a card switched to on-demand: its slices are not ours to
give; the plugin logs it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from dra_driver.devices.mig import MigDevice, gpu_instance_id
from dra_driver.devices.mig_profiles import COMPUTE_SLICES, MEMORY_SLICES, MigModel, MigProfile, mig_model
from dra_driver.devices.model import Gpu

log = logging.getLogger(__name__)

#: ``--mig-on-demand all``: every card in MIG mode.
ALL_CARDS = "all"
_NAME = re.compile(r"^(?P<parent>.+)-mig-(?P<g>\d+)g(?P<mem>\d+)gb-at-(?P<start>\d)$")


class MigOnDemandError(ValueError):
    """A bad ``--mig-on-demand`` value or placement name."""


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """One possible GPU instance of a card: a profile at one of its start slots."""

    profile: MigProfile
    start: int

    @property
    def size(self) -> int:
        return self.profile.placement_size

    @property
    def span(self) -> range:
        return self.profile.spans(self.start)

    @property
    def gpu_instance(self) -> int:
        """The GPU instance id the driver gives an instance at this placement."""
        return gpu_instance_id(self.start, self.size)

    @property
    def memory_bytes(self) -> int:
        return self.profile.memory_mib << 20


def possible_placements(model: MigModel, taken: Iterable[range] = ()) -> list[MigPlacement]:
    """Every placement of ``model``'s plain profiles (no ``+me``) that overlaps none of ``taken``,
    largest profile first, then by start (NVML's order within a profile)."""
    blocked = {slice_ for span in taken for slice_ in span}
    found = [
        MigPlacement(profile, start)
        for profile in model.profiles
        if not profile.name.endswith("+me")
        for start in profile.placements
        if not blocked & set(profile.spans(start))
    ]
    return sorted(found, key=lambda p: (-p.profile.slices, -p.size, p.start))


def placement_device_name(parent_name: str, placement: MigPlacement) -> str:
    """``gpu-0-mig-1g10gb-at-3``: the card, the profile without its dot, and the start slot (a DNS
    label, unique per card: two profiles never share both compute and memory size)."""
    compact = placement.profile.name.replace(".", "")
    return f"{parent_name}-mig-{compact}-at-{placement.start}"


def parse_placement_device_name(name: str) -> tuple[str, int, int, int] | None:
    """``(parent name, compute slices, memory GB, start)`` of a placement device name, or None."""
    match = _NAME.match(name)
    if match is None:
        return None
    return match["parent"], int(match["g"]), int(match["mem"]), int(match["start"])


def placement_by_name(gpu: Gpu, name: str) -> MigPlacement:
    """The placement of ``gpu`` a published device name stands for (raises :class:`MigOnDemandError`)."""
    parsed = parse_placement_device_name(name)
    model = mig_model(gpu.product_name)
    if parsed is None or parsed[0] != gpu.name or model is None:
        raise MigOnDemandError(f"{name} is no MIG placement of {gpu.name} ({gpu.product_name})")
    _, slices, memory_gb, start = parsed
    for profile in model.profiles:
        if profile.name == f"{slices}g.{memory_gb}gb" and start in profile.placements:
            return MigPlacement(profile, start)
    raise MigOnDemandError(f"{name}: {gpu.product_name} has no such profile and start slot")


def parse_selection(value: str) -> frozenset[str]:
    """``--mig-on-demand``: empty (none), ``all``, or a comma list of card indexes and UUIDs."""
    tokens = frozenset(token.strip() for token in value.split(",") if token.strip())
    if ALL_CARDS in tokens and len(tokens) > 1:
        raise MigOnDemandError(f"--mig-on-demand: 'all' cannot be combined with card names, got {value!r}")
    for token in tokens:
        if token != ALL_CARDS and not token.isdigit() and not token.startswith("GPU-"):
            raise MigOnDemandError(
                f"--mig-on-demand: {token!r} is neither 'all', a card index (0, 1, ...) "
                "nor a GPU UUID (GPU-...)"
            )
    return tokens


def _selected(gpu: Gpu, selection: frozenset[str]) -> bool:
    return ALL_CARDS in selection or str(gpu.index) in selection or gpu.uuid in selection


def mark_on_demand(gpus: Sequence[Gpu], selection: frozenset[str]) -> list[Gpu]:
    """``gpus`` with ``mig_on_demand`` set on the selected cards that can do it.

    A selected card not in MIG mode stays a whole card (switching MIG mode resets the GPU: the
    admin's step, logged here with the command); one whose model's profile table is unknown is
    left as static MIG. Both are logged as warnings, so a typo in the selection is seen.
    """
    marked = []
    for gpu in gpus:
        if not selection or not _selected(gpu, selection):
            marked.append(gpu)
            continue
        if not gpu.mig_enabled:
            log.warning(
                "GPU %s (index %d) is marked for MIG on demand but MIG mode is off: published as a "
                "whole card (enable MIG mode first: nvidia-smi -i %d -mig 1, see docs/isolation.md)",
                gpu.uuid, gpu.index, gpu.index,
            )  # fmt: skip
            marked.append(gpu)
            continue
        if mig_model(gpu.product_name) is None:
            log.warning(
                "GPU %s (index %d, %s): no MIG profile table for this model, so no MIG on demand; its "
                "existing MIG devices are published as static MIG",
                gpu.uuid, gpu.index, gpu.product_name,
            )  # fmt: skip
            marked.append(gpu)
            continue
        marked.append(replace(gpu, mig_on_demand=True))
    return marked


def foreign_instances(gpu: Gpu, ours: Iterable[str]) -> tuple[MigDevice, ...]:
    """The MIG devices of ``gpu`` whose UUIDs are not in ``ours`` (what this driver created)."""
    own = set(ours)
    return tuple(mig for mig in gpu.mig_devices if mig.uuid not in own)


def spans_of(instances: Iterable[MigDevice]) -> list[range]:
    """The memory slices existing instances cover (all of the card where one's placement is unknown)."""
    spans = []
    for mig in instances:
        if mig.placement_start is None or mig.placement_size is None:
            spans.append(range(MEMORY_SLICES))
        else:
            spans.append(range(mig.placement_start, mig.placement_start + mig.placement_size))
    return spans


#: The counters of one card: each memory slice once, and its compute slices.
COMPUTE_COUNTER = "compute-slices"


def memory_counter(slice_: int) -> str:
    return f"memory-slice-{slice_}"


def card_counters() -> dict[str, int]:
    """What one card offers: ``memory-slice-0..7`` (1 each) and ``compute-slices`` (7)."""
    counters = {memory_counter(i): 1 for i in range(MEMORY_SLICES)}
    counters[COMPUTE_COUNTER] = COMPUTE_SLICES
    return counters


def placement_counters(placement: MigPlacement) -> dict[str, int]:
    """What one placement consumes of its card's counters."""
    counters = {memory_counter(i): 1 for i in placement.span}
    counters[COMPUTE_COUNTER] = placement.profile.slices
    return counters
