"""Builders of MIG cards for the engine tests: instances placed as NVML would place them."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.devices.mig import gpu_instance_id, place
from dra_driver.devices.mig_profiles import MIG_MODELS
from dra_driver.engine.mig import MigInstance
from dra_driver.quantity import MIB

H200 = "NVIDIA H200"


def mig_card(
    parent: int,
    profiles: Sequence[str],
    node: str = "node-1",
    numa: int | None = 0,
    product: str = H200,
    healthy: bool = True,
) -> list[MigInstance]:
    """The instances of one card in MIG mode: ``profiles`` as ``name`` or ``name@start``."""
    model = MIG_MODELS[product]
    wanted = [(p.split("@")[0], int(p.split("@")[1]) if "@" in p else None) for p in profiles]
    instances = []
    for profile, start in place(model, wanted):
        gi = gpu_instance_id(start, profile.placement_size)
        instances.append(
            MigInstance(
                node=node,
                name=f"gpu-{parent}-mig-{gi}-0",
                parent=parent,
                parent_name=f"gpu-{parent}",
                gpu_instance=gi,
                compute_instance=0,
                profile=profile.name,
                memory=profile.memory_mib * MIB,
                slices=profile.slices,
                placement_start=start,
                placement_size=profile.placement_size,
                product_name=product,
                uuid=f"MIG-{node}-{parent}-{gi}",
                parent_uuid=f"GPU-{node}-{parent}",
                numa_node=numa,
                healthy=healthy,
            )
        )
    return instances


SEVEN_1G = ["1g.18gb"] * 7
