"""Static MIG (issue 37): a card in MIG mode publishes its MIG devices, from NVML and simulated alike."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml
from kube_validate import assert_valid
from mock_profiles import profile_from_gpus

from dra_driver.devices.mig import (
    MigDevice,
    MigModelError,
    checked_mig_cards,
    gpu_instance_id,
    mig_caps_minors,
    place,
)
from dra_driver.devices.mig_profiles import MIG_MODELS
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.devices.source import DeviceSourceError
from dra_driver.resource.slice_builder import build_resource_slices

H100 = MIG_MODELS["NVIDIA H100 80GB HBM3"]


def mig_node(tmp_path: Path, mig_devices: list[str] | None = None, *, gpus: int = 2) -> list:
    entries: list[dict] = [{"index": i, "profile": "h100-80gb", "numaNode": i % 2} for i in range(gpus)]
    if mig_devices is not None:
        entries[1]["migDevices"] = mig_devices
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump({"gpus": entries}))
    return DevicesFileSource(path, node_name="node-1").discover()


def test_simulated_mig_card_takes_a_pinned_start_slot(tmp_path: Path) -> None:
    card = mig_node(tmp_path, ["1g.10gb@6", "3g.40gb"])[1]
    assert card.mig_enabled
    # listed by instance id: the 3g at 0 is GPU instance 1, the 1g at 6 is 7 + 6
    layout = [(m.profile, m.placement_start, m.gpu_instance) for m in card.mig_devices]
    assert layout == [("3g.40gb", 0, 1), ("1g.10gb", 6, 13)]


def test_simulated_layout_and_errors(tmp_path: Path) -> None:
    card = mig_node(tmp_path, ["3g.40gb", "2g.20gb", "1g.10gb"])[1]
    assert [(m.profile, m.placement_start, m.placement_size, m.gpu_instance) for m in card.mig_devices] == [
        ("3g.40gb", 0, 4, 1),
        ("2g.20gb", 4, 2, 5),
        ("1g.10gb", 6, 1, 13),
    ]
    three = card.mig_devices[0]
    assert three.memory_bytes == 40448 << 20 and three.multiprocessors == 60 and three.slices == 3
    assert three.uuid.startswith("MIG-") and len({m.uuid for m in card.mig_devices}) == 3
    assert mig_node(tmp_path, ["3g.40gb", "2g.20gb", "1g.10gb"])[1] == card  # same UUIDs after a restart
    for layout, message in (
        (["7g.80gb", "1g.10gb"], "1g.10gb does not fit next to 7g.80gb@0"),
        (["2g.20gb@1"], "2g.20gb cannot start at memory slice 1; its start slots are 0, 2, 4"),
        (["5g.50gb"], "has no MIG profile '5g.50gb'"),
        (["1g.10gb@x"], "the start slot after @ must be a number"),
        (["4g.40gb", "4g.40gb"], "4g.40gb does not fit next to 4g.40gb@0"),
    ):
        with pytest.raises(DeviceSourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
            mig_node(tmp_path, layout)


def test_a_t4_has_no_mig_profiles(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"profile": "t4", "migDevices": ["1g.5gb"]}]}))
    with pytest.raises(DeviceSourceError, match=r"gpus\[0\]\.migDevices: 'Tesla T4' has no MIG profiles"):
        DevicesFileSource(path, node_name="n").discover()


def test_place_follows_the_placement_table() -> None:
    assert [(p.name, at) for p, at in place(H100, [("4g.40gb", None), ("3g.40gb", None)])] == [
        ("4g.40gb", 0),
        ("3g.40gb", 4),
    ]
    seven = place(H100, [("1g.10gb", None)] * 7)
    assert [at for _, at in seven] == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(MigModelError, match="does not fit"):
        place(H100, [("1g.10gb", None)] * 8)
    # the +me variant takes the card's only media engines: one at most
    with pytest.raises(MigModelError, match=r"1g.10gb\+me does not fit"):
        place(H100, [("1g.10gb+me", None), ("1g.10gb+me", None)])
    assert gpu_instance_id(0, 8) == 0 and gpu_instance_id(4, 4) == 2 and gpu_instance_id(6, 1) == 13


def test_caps_minors_follow_the_drivers_mig_minors_numbering() -> None:
    # Values from NVIDIA's documentation of /proc/driver/nvidia-caps/mig-minors.
    assert mig_caps_minors(0, 0, 0) == (3, 4)
    assert mig_caps_minors(3, 3, 3)[1] == 439
    assert mig_caps_minors(6, 11, 7)[1] == 920
    assert mig_caps_minors(31, 14, 7)[1] == 4322


def test_nvml_discovers_the_same_mig_devices_as_the_devices_file(run_nvml, tmp_path: Path) -> None:
    simulated = mig_node(tmp_path, ["3g.40gb", "2g.20gb", "1g.10gb"])
    profile = profile_from_gpus(simulated, driver_version="550.54.15", cuda_driver_version=12040)
    run = run_nvml(profile, sysfs=simulated)
    assert run.error is None, run.stderr
    card = run.gpus[1]
    assert card.mig_enabled and card.mig_devices == simulated[1].mig_devices
    assert "ERROR" not in run.stderr


def test_nvml_reads_compute_instances_smaller_than_their_gpu_instance(run_nvml, tmp_path: Path) -> None:
    simulated = mig_node(tmp_path, ["3g.40gb"])
    profile = profile_from_gpus(simulated, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][1]["gpuInstances"] = [
        {"profileId": 9, "start": 4, "computeInstances": [{"profileId": 1}, {"profileId": 0}]}
    ]
    run = run_nvml(profile, sysfs=simulated)
    migs = run.gpus[1].mig_devices
    ids = [(m.profile, m.gpu_instance, m.compute_instance, m.slices, m.gpu_instance_slices) for m in migs]
    assert ids == [
        ("2c.3g.40gb", 2, 0, 2, 3),
        ("1c.3g.40gb", 2, 1, 1, 3),
    ]
    assert [m.multiprocessors for m in migs] == [40, 20]
    assert all(m.memory_bytes == 40448 << 20 and m.placement_start == 4 for m in migs)


def test_a_mig_card_publishes_its_mig_devices_whole_and_never_itself(tmp_path: Path) -> None:
    gpus = mig_node(tmp_path, ["3g.40gb", "2g.20gb", "1g.10gb"])
    sick = [gpus[0], dataclasses.replace(gpus[1], healthy=False)]
    (slice_,) = build_resource_slices(sick, node_name="node-1", policy_taint=True, taint_unhealthy=True)
    assert_valid(slice_)
    devices = {d["name"]: d for d in slice_["spec"]["devices"]}
    assert list(devices) == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-5-0", "gpu-1-mig-13-0"]
    one = devices["gpu-1-mig-13-0"]
    attributes = {key: next(iter(value.values())) for key, value in one["attributes"].items()}
    card = gpus[1]
    assert attributes["type"] == "mig" and attributes["profile"] == "1g.10gb"
    assert attributes["uuid"] == card.mig_devices[2].uuid
    parent = (attributes["parentUUID"], attributes["parentIndex"], attributes["parentMinor"])
    assert parent == (card.uuid, 1, 1)
    assert attributes["parentPciBusID"] == card.pci_bus_id
    assert attributes["resource.kubernetes.io/numaNode"] == 1
    assert (attributes["gpuInstance"], attributes["computeInstance"], attributes["slices"]) == (13, 0, 1)
    placement = (attributes["placementStart"], attributes["memorySlices"], attributes["multiprocessors"])
    assert placement == (6, 1, 16)
    assert attributes["healthy"] is False
    assert "index" not in attributes  # the controller's inventory places cards by index: not this one
    assert one["capacity"] == {"memory": {"value": "9984Mi"}}  # whole: no request policy, no shares
    assert "allowMultipleAllocations" not in one
    # kube-scheduler allocates MIG devices: never the policy taint; the unhealthy taint when asked.
    assert one["taints"] == [{"key": "gpu.hami.io/unhealthy", "effect": "NoSchedule"}]
    assert [t["key"] for t in devices["gpu-0"]["taints"]] == ["gpu.hami.io/policy-managed"]


def test_mig_cards_links_are_dropped_and_an_empty_mig_card_is_logged(caplog) -> None:
    from dra_driver.devices.simulated import profile_gpus

    gpus = profile_gpus("h100-80gb", node_name="n", gpus=3)
    mig = MigDevice("MIG-x", "7g.80gb", 0, 0, 81152 << 20, 7, 7)
    gpus[1] = dataclasses.replace(gpus[1], mig_enabled=True, mig_devices=(mig,))
    gpus[2] = dataclasses.replace(gpus[2], mig_enabled=True)
    with caplog.at_level(logging.INFO):
        checked = checked_mig_cards(gpus)
    assert dict(checked[0].nvlink_peers) == {}
    assert checked[1].mig_devices == (mig,)
    assert "in MIG mode but has no MIG devices" in caplog.text and gpus[2].uuid in caplog.text
    assert "publishing its 1 MIG device(s) (7g.80gb)" in caplog.text


def test_the_controllers_inventory_never_offers_a_mig_card_nor_its_mig_devices(tmp_path: Path) -> None:
    """The controller places whole cards and shares by index: a MIG device has none (it is
    kube-scheduler's, through the mig class), and its card is not published at all."""
    from dra_driver.controller.inventory import build_inventory

    gpus = mig_node(tmp_path, ["3g.40gb", "2g.20gb", "1g.10gb"])
    slices = build_resource_slices(gpus, node_name="node-1")
    inventory = build_inventory(slices, "gpu.hami.io")
    assert [card.index for card in inventory["node-1"].cards] == [0]
