"""MIG GPU-instance profiles per GPU model, as NVML reports them: the one table for every MIG user.

A GPU in MIG mode is cut into GPU instances of fixed *profiles* (``1g.10gb``, ``3g.40gb``, ...).
Each profile has NVML's numbers (``nvmlGpuInstanceProfileInfo_v2_t``: the profile's NVML index
``NVML_GPU_INSTANCE_PROFILE_*``, its id, compute slices, SMs, memory in MiB, how many instances
fit) and its *placements*: the memory-slice start positions (of 8) where an instance of it may
begin, each covering ``placement_size`` slices (``nvidia-smi mig -lgipp``). Two instances conflict
exactly when their placements overlap; that is the whole packing rule of NVIDIA's MIG.

Sources (facts, not code): NVIDIA's MIG User Guide (supported profiles per GPU, ``-lgip`` /
``-lgipp`` listings) and ``nvidia-smi mig -lgip`` output published for real cards: the A100
and H100 tables carry those figures; the H200 memory figures are NVIDIA's profile sizes with the
H100's proportions of usable memory per slice (flagged ``approximate``), since no listing was at
hand. SM counts are those of the SXM boards.

Users: the mock NVML library's profiles (``tests/devices/mock_profiles.py`` writes these tables
into the JSON the C mock reads, so the mock answers NVML's MIG calls with them), the simulated
source (``--mig`` cards with instances), and, later, on-demand MIG (placements become devices
that consume a card's slice counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: NVML's ``NVML_GPU_INSTANCE_PROFILE_*`` indexes (nvml.h): what ``nvmlDeviceGetGpuInstanceProfileInfo``
#: takes. The profile *id* in the answer (19, 15, 14, ...) is another number, which the create,
#: list and placement calls take.
PROFILE_1_SLICE, PROFILE_2_SLICE, PROFILE_3_SLICE, PROFILE_4_SLICE, PROFILE_7_SLICE = 0, 1, 2, 3, 4
PROFILE_1_SLICE_REV1, PROFILE_1_SLICE_REV2 = 7, 9
#: Memory slices of a MIG-capable card (A100, H100, H200): every placement lies within 0..7.
MEMORY_SLICES = 8
#: Compute slices of such a card: ``7g`` is the whole card.
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model."""

    #: ``1g.10gb``: compute slices ``g`` and memory; ``+me`` marks the media-extension variant.
    name: str
    #: NVML's profile index (``NVML_GPU_INSTANCE_PROFILE_*``).
    nvml_index: int
    #: NVML's profile id (``nvmlGpuInstanceProfileInfo_t.id``).
    profile_id: int
    slices: int
    multiprocessors: int
    memory_mib: int
    #: Start positions (memory slices) an instance may take, in NVML's order.
    placements: tuple[int, ...]
    #: Memory slices one instance covers.
    placement_size: int
    copy_engines: int = 1
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0

    @property
    def instance_count(self) -> int:
        """How many instances of this profile fit on an empty card (NVML's ``instanceCount``).

        For the plain profiles that is one per placement; a ``+me`` profile takes the card's only
        media engines, so one at most.
        """
        return 1 if self.name.endswith("+me") else len(self.placements)

    def spans(self, start: int) -> range:
        """The memory slices an instance placed at ``start`` covers."""
        return range(start, start + self.placement_size)


@dataclass(frozen=True, slots=True)
class MigModel:
    """The MIG profiles of one GPU model, keyed by the product name NVML reports."""

    product_name: str
    profiles: tuple[MigProfile, ...]
    approximate: bool = False

    def by_name(self, name: str) -> MigProfile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(
            f"{self.product_name} has no MIG profile {name!r}; it has "
            f"{', '.join(p.name for p in self.profiles)}"
        )

    def by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)


def _table(
    product: str,
    sizes: Sequence[tuple[str, int, int, int, int, tuple[int, ...], int]],
    *,
    decoders: Mapping[int, int],
    approximate: bool = False,
) -> MigModel:
    """Rows of (name, NVML index, id, SMs, MiB, placements, placement size)."""
    profiles = []
    for name, nvml_index, profile_id, sms, mib, placements, size in sizes:
        slices = int(name.split("g.", 1)[0])
        media = name.endswith("+me")
        profiles.append(
            MigProfile(
                name=name,
                nvml_index=nvml_index,
                profile_id=profile_id,
                slices=slices,
                multiprocessors=sms,
                memory_mib=mib,
                placements=placements,
                placement_size=size,
                copy_engines=8 if slices == COMPUTE_SLICES else slices,
                decoders=decoders[slices],
                encoders=0,
                jpegs=1 if media or slices == COMPUTE_SLICES else 0,
                ofas=1 if media or slices == COMPUTE_SLICES else 0,
            )
        )
    return MigModel(product, tuple(profiles), approximate)


_ALL_1G = (0, 1, 2, 3, 4, 5, 6)
_HOPPER_DECODERS = {1: 1, 2: 2, 3: 3, 4: 4, 7: 7}
_AMPERE_DECODERS = {1: 0, 2: 1, 3: 2, 4: 2, 7: 5}

#: Product name (as NVML reports it) -> the card's MIG profiles.
MIG_MODELS: Mapping[str, MigModel] = {
    model.product_name: model
    for model in (
        _table(
            "NVIDIA A100-SXM4-40GB",
            [
                ("1g.5gb", PROFILE_1_SLICE, 19, 14, 4864, _ALL_1G, 1),
                ("1g.5gb+me", PROFILE_1_SLICE_REV1, 20, 14, 4864, _ALL_1G, 1),
                ("1g.10gb", PROFILE_1_SLICE_REV2, 15, 14, 9856, (0, 2, 4, 6), 2),
                ("2g.10gb", PROFILE_2_SLICE, 14, 28, 9856, (0, 2, 4), 2),
                ("3g.20gb", PROFILE_3_SLICE, 9, 42, 20096, (0, 4), 4),
                ("4g.20gb", PROFILE_4_SLICE, 5, 56, 20096, (0,), 4),
                ("7g.40gb", PROFILE_7_SLICE, 0, 98, 40192, (0,), 8),
            ],
            decoders=_AMPERE_DECODERS,
        ),
        _table(
            "NVIDIA A100-SXM4-80GB",
            [
                ("1g.10gb", PROFILE_1_SLICE, 19, 14, 9728, _ALL_1G, 1),
                ("1g.10gb+me", PROFILE_1_SLICE_REV1, 20, 14, 9728, _ALL_1G, 1),
                ("1g.20gb", PROFILE_1_SLICE_REV2, 15, 14, 19968, (0, 2, 4, 6), 2),
                ("2g.20gb", PROFILE_2_SLICE, 14, 28, 19968, (0, 2, 4), 2),
                ("3g.40gb", PROFILE_3_SLICE, 9, 42, 40192, (0, 4), 4),
                ("4g.40gb", PROFILE_4_SLICE, 5, 56, 40192, (0,), 4),
                ("7g.80gb", PROFILE_7_SLICE, 0, 98, 80896, (0,), 8),
            ],
            decoders=_AMPERE_DECODERS,
        ),
        _table(
            "NVIDIA H100 80GB HBM3",
            [
                ("1g.10gb", PROFILE_1_SLICE, 19, 16, 9984, _ALL_1G, 1),
                ("1g.10gb+me", PROFILE_1_SLICE_REV1, 20, 16, 9984, _ALL_1G, 1),
                ("1g.20gb", PROFILE_1_SLICE_REV2, 15, 26, 20096, (0, 2, 4, 6), 2),
                ("2g.20gb", PROFILE_2_SLICE, 14, 32, 20096, (0, 2, 4), 2),
                ("3g.40gb", PROFILE_3_SLICE, 9, 60, 40448, (0, 4), 4),
                ("4g.40gb", PROFILE_4_SLICE, 5, 64, 40448, (0,), 4),
                ("7g.80gb", PROFILE_7_SLICE, 0, 132, 81152, (0,), 8),
            ],
            decoders=_HOPPER_DECODERS,
        ),
        _table(
            "NVIDIA H200",
            [
                ("1g.18gb", PROFILE_1_SLICE, 19, 16, 16896, _ALL_1G, 1),
                ("1g.18gb+me", PROFILE_1_SLICE_REV1, 20, 16, 16896, _ALL_1G, 1),
                ("1g.35gb", PROFILE_1_SLICE_REV2, 15, 26, 33792, (0, 2, 4, 6), 2),
                ("2g.35gb", PROFILE_2_SLICE, 14, 32, 33792, (0, 2, 4), 2),
                ("3g.71gb", PROFILE_3_SLICE, 9, 60, 71424, (0, 4), 4),
                ("4g.71gb", PROFILE_4_SLICE, 5, 64, 71424, (0,), 4),
                ("7g.141gb", PROFILE_7_SLICE, 0, 132, 143360, (0,), 8),
            ],
            decoders=_HOPPER_DECODERS,
            approximate=True,
        ),
    )
}


def mig_model(product_name: str) -> MigModel | None:
    """The MIG profiles of a product, or None when the table does not know it (no MIG, or unknown)."""
    return MIG_MODELS.get(product_name)


def overlaps(a: MigProfile, a_start: int, b: MigProfile, b_start: int) -> bool:
    """Do two placed instances share a memory slice (and so cannot both exist)?"""
    return bool(set(a.spans(a_start)) & set(b.spans(b_start)))
