"""MIG on demand without a GPU: the instances of simulated cards, kept in a file as NVML would keep them.

For ``--source simulated`` nodes (kind, demos) whose devices file marks a card ``migEnabled: true``
and the plugin runs with ``--mig-on-demand``: :class:`SimulatedMigDriver` answers the
:class:`~dra_driver.devices.nvml_mig_create.MigDriver` calls by NVML's rules (a placement must be
one of the profile's start slots and overlap no instance; GPU instance ids by placement; the lowest
free compute instance id) and keeps the instances in a JSON file, so they outlive the plugin as the
kernel driver's do and a restarted plugin reconciles against them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from dra_driver.devices.mig import gpu_instance_id
from dra_driver.devices.mig_profiles import mig_model
from dra_driver.devices.model import Gpu
from dra_driver.devices.nvml_mig_create import LiveInstance, MigCreateError


class SimulatedMigDriver:
    """:class:`~dra_driver.devices.nvml_mig_create.MigDriver` over a JSON file (one per node)."""

    def __init__(self, path: Path, cards: Iterable[Gpu]) -> None:
        self.path = path
        self.products = {gpu.uuid: gpu.product_name for gpu in cards}

    def _load(self) -> dict[str, list[dict[str, int | str]]]:
        try:
            data: dict[str, list[dict[str, int | str]]] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return data

    def _save(self, data: dict[str, list[dict[str, int | str]]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(temporary, self.path)

    def create(self, parent_uuid: str, profile_id: int, slices: int, start: int, size: int) -> LiveInstance:
        model = mig_model(self.products.get(parent_uuid, ""))
        if model is None:
            raise MigCreateError(f"GPU {parent_uuid} is not a simulated MIG card")
        profile = model.by_id(profile_id)
        if profile is None or start not in profile.placements or size != profile.placement_size:
            raise MigCreateError(
                f"GPU {parent_uuid}: Invalid Argument (profile {profile_id} at {start}+{size})"
            )
        data = self._load()
        existing = data.setdefault(parent_uuid, [])
        wanted = set(range(start, start + size))
        for other in existing:
            taken = range(int(other["start"]), int(other["start"]) + int(other["size"]))
            if wanted & set(taken):
                raise MigCreateError(
                    f"GPU {parent_uuid}: Insufficient Resources "
                    "(the placement overlaps an instance that exists)"
                )
        gi = gpu_instance_id(start, size)
        uuid = "MIG-" + hashlib.sha256(f"{parent_uuid}/gi{gi}/ci0".encode()).hexdigest()[:32]
        existing.append(
            {"gpuInstance": gi, "profileId": profile_id, "start": start, "size": size, "uuid": uuid}
        )
        self._save(data)
        return LiveInstance(gi, profile_id, start, size, ((0, uuid),))

    def destroy(self, parent_uuid: str, gpu_instance: int) -> None:
        data = self._load()
        data[parent_uuid] = [i for i in data.get(parent_uuid, []) if i["gpuInstance"] != gpu_instance]
        self._save(data)

    def instances(self, parent_uuid: str) -> list[LiveInstance]:
        return [
            LiveInstance(
                int(i["gpuInstance"]),
                int(i["profileId"]),
                int(i["start"]),
                int(i["size"]),
                ((0, str(i["uuid"])),),
            )
            for i in self._load().get(parent_uuid, [])
        ]
