"""A node of H200 cards in MIG mode for the controller tests: its slices and the MIG class."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.config.classes import mig_selector
from dra_driver.devices.mig import checked_mig_cards
from dra_driver.devices.simulated import parse_devices
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.harness import DRIVER, device_class

MIG_CLASS = f"mig.{DRIVER}"
MIG_SELECTOR = mig_selector(DRIVER)
SEVEN_1G = ["1g.18gb"] * 7


def mig_class(policy: str = "binpack") -> dict[str, Any]:
    """The chart's MIG class: our driver, ``type == "mig"``, a policy."""
    return device_class(MIG_CLASS, {"policy": policy}, [f'device.driver == "{DRIVER}"', MIG_SELECTOR])


def mig_slices(cards: Sequence[Sequence[str] | None], node: str = "n1") -> list[dict[str, Any]]:
    """Slices of ``node`` with one H200 per entry: its MIG devices, or None for a card not in MIG mode."""
    entries: list[dict[str, Any]] = []
    for index, profiles in enumerate(cards):
        entry: dict[str, Any] = {"index": index, "profile": "h200"}
        if profiles is not None:
            entry["migDevices"] = list(profiles)
        entries.append(entry)
    gpus = checked_mig_cards(parse_devices({"gpus": entries}, node_name=node))
    return build_resource_slices(gpus, node_name=node, driver_name=DRIVER, policy_taint=True)


def profile_selector(profile: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}]
