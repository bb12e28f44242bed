"""Static MIG devices prepared against the NVIDIA Container Toolkit's real CDI specs (issue 37).

A mock H100 node whose second card is in MIG mode (a 3g.40gb and a 1g.10gb instance): the real
``nvidia-ctk cdi generate`` walks its MIG devices through the mock NVML library and reads the
capability minors from the mock root's ``mig-minors`` (tests/nvidia_layouts.py). What it writes
is a fact to compose with: no whole-card device for a card in MIG mode, one device per MIG device
(``1:0``, ``MIG-<uuid>``) holding the card's node and its two ``/dev/nvidia-caps`` capabilities
(the GPU Operator's ``all`` holds them all). A claim for one MIG device must get exactly its own
card node and capabilities, from every layout; the real CDI library must accept our IDs. Without
composition (no toolkit) or on a simulated node, the same nodes are named by path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devices.mig import mig_caps_minors
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.kubeletplugin.control_nodes import HostView
from dra_driver.kubeletplugin.inventory import Inventory, node_devices
from dra_driver.kubeletplugin.toolkit import ToolkitRegistry
from tests.devices.mock_profiles import profile_from_gpus
from tests.kubeletplugin.helpers import claim, result
from tests.kubeletplugin.test_preparer_units import FakeClaims, make, prepared_spec
from tests.nvidia_layouts import (
    NVIDIA_CAPS_MAJOR,
    DeviceFiles,
    DriverRoot,
    Layout,
    cdi_list,
    generate_spec,
    mock_driver_root,
    require_toolkit,
)
from tests.podman import CDI_DIR, busybox_podman

#: gpu-1's MIG devices: name -> (GPU instance id, compute instance id).
MIG_DEVICES = {"gpu-1-mig-1-0": (1, 0), "gpu-1-mig-13-0": (13, 0)}


def mig_gpus(directory: Path) -> list:
    path = directory / "devices.yaml"
    entries = [{"index": 0, "profile": "h100-80gb"}, {"index": 1, "profile": "h100-80gb"}]
    entries[1]["migDevices"] = ["3g.40gb", "1g.10gb@6"]
    path.write_text(yaml.safe_dump({"gpus": entries}))
    return DevicesFileSource(path, node_name="node-1").discover()


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> list:
    return mig_gpus(tmp_path_factory.mktemp("mig-gpus"))


@pytest.fixture(scope="module")
def driver(gpus: list, tmp_path_factory: pytest.TempPathFactory) -> DriverRoot:
    base = tmp_path_factory.mktemp("mig-root")
    profile = base / "profile.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040))
    )
    return mock_driver_root(base / "root", profile)


def own_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    (device,) = spec["devices"]
    return [*spec.get("containerEdits", {}).get("deviceNodes", []), *device["containerEdits"]["deviceNodes"]]


@pytest.mark.parametrize("layout", ["host", "index-only", "operator"])
def test_a_mig_device_gets_its_card_node_and_its_own_two_capabilities(
    layout: Layout, gpus: list, driver: DriverRoot, tmp_path: Path
) -> None:
    toolkit_bin = require_toolkit()
    registry = tmp_path / "registry"
    spec_path = generate_spec(layout, driver, registry)
    assert spec_path is not None
    toolkit_spec = yaml.safe_load(spec_path.read_text())
    names = [device["name"] for device in toolkit_spec["devices"]]
    if layout != "operator":
        assert "1" not in names and {"1:0", "1:1"} <= set(names)  # no whole card in MIG mode
    if layout == "host":
        assert {m.uuid for m in gpus[1].mig_devices} <= set(names)
    preparer = make(
        tmp_path, FakeClaims(), simulated=False, toolkit=ToolkitRegistry((registry,), host=HostView())
    )
    preparer.inventory = Inventory(node_devices(gpus))
    preparer.start()
    ids = []
    for name, (gi, ci) in MIG_DEVICES.items():
        obj = claim(name, [result(name, share=False)])
        preparer.claims = FakeClaims(obj)
        answer, spec = prepared_spec(preparer, obj)
        assert not answer.error, answer.error
        ids += [cdi_id for device in answer.devices for cdi_id in device.cdi_ids]
        nodes = own_nodes(spec)
        paths = [node["path"] for node in nodes]
        caps = [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in mig_caps_minors(1, gi, ci)]
        assert [p for p in paths if p.startswith("/dev/nvidia-caps/")] == caps, "its own capabilities only"
        assert [p for p in paths if p[len("/dev/nvidia") :].isdigit()] == ["/dev/nvidia1"]
        for node in nodes:
            if node["path"] in caps:  # as the toolkit describes them: major and mode included
                assert (node["major"], node["minor"]) == (
                    NVIDIA_CAPS_MAJOR,
                    int(node["path"].rsplit("cap", 1)[1]),
                )
    whole = claim("whole", [result("gpu-0", share=False)])
    preparer.claims = FakeClaims(whole)
    answer, spec = prepared_spec(preparer, whole)
    assert not answer.error and not any(n["path"].startswith("/dev/nvidia-caps") for n in own_nodes(spec))
    ids += [cdi_id for device in answer.devices for cdi_id in device.cdi_ids]
    card = claim("card", [result("gpu-1", share=False)])
    preparer.claims = FakeClaims(card)
    answer, _ = prepared_spec(preparer, card)
    assert answer.error and "gpu-1 does not exist on this node" in answer.error  # never the card whole
    listed, errors = cdi_list(tmp_path / "cdi", toolkit_bin)
    assert errors == [] and sorted(listed) == sorted(ids)


@pytest.mark.parametrize("simulated", [True, False])
def test_without_composition_the_mig_nodes_are_named_by_path(simulated: bool, tmp_path: Path) -> None:
    gpus = mig_gpus(tmp_path)
    preparer = make(tmp_path, FakeClaims(), simulated=simulated)
    preparer.inventory = Inventory(node_devices(gpus))
    preparer.start()
    obj = claim("mig", [result("gpu-1-mig-13-0", share=False)])
    preparer.claims = FakeClaims(obj)
    answer, spec = prepared_spec(preparer, obj)
    assert not answer.error, answer.error
    (device,) = spec["devices"]
    stand_in = {"hostPath": "/dev/null"} if simulated else {}
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", **stand_in},
        {"path": "/dev/nvidia-caps/nvidia-cap255", **stand_in},
        {"path": "/dev/nvidia-caps/nvidia-cap256", **stand_in},
    ]


def test_the_hosts_mig_minors_file_wins_over_the_documented_numbering(tmp_path: Path) -> None:
    from dra_driver.kubeletplugin.inventory import read_mig_minors

    table = tmp_path / "mig-minors"
    table.write_text("config 1\nmonitor 2\ngpu1/gi13/access 900\ngpu1/gi13/ci0/access 901\nbroken\n")
    devices = {d.name: d for d in node_devices(mig_gpus(tmp_path), read_mig_minors(table))}
    assert devices["gpu-1-mig-13-0"].mig_caps == (900, 901)
    assert devices["gpu-1-mig-1-0"].mig_caps == mig_caps_minors(1, 1, 0)
    assert devices["gpu-1-mig-13-0"].slots == 1 and devices["gpu-1-mig-13-0"].minor == 1
    assert "gpu-1" not in devices and read_mig_minors(tmp_path / "absent") == {}


# ---------------------------------------------------------------- a real runtime applies our spec
IMAGE = "localhost/hami-dra-toolkit-busybox:test"


def test_podman_runs_a_container_with_exactly_its_mig_device(
    gpus: list, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Our claim spec for one MIG device, composed from the host layout's spec, applied by podman
    (the real CDI library and runc): the container has its card's node and its two capability nodes
    with the driver's numbers, and neither the other card nor the other instance."""
    toolkit_bin = require_toolkit()
    podman = busybox_podman(tmp_path_factory.mktemp("podman"), IMAGE)  # runroot paths stay short
    # No nvidia-drm: podman 4.3 reads CDI specs up to 0.5.0 (the DRM nodes' additionalGids need 0.7.0).
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040))
    )
    driver = mock_driver_root(tmp_path / "root", profile, DeviceFiles(drm=False))
    registry = tmp_path / "registry"
    generate_spec("host", driver, registry, toolkit_bin, uvm_loaded=True)
    preparer = make(
        tmp_path, FakeClaims(), simulated=False, toolkit=ToolkitRegistry((registry,), host=HostView())
    )
    preparer.inventory = Inventory(node_devices(gpus))
    preparer.start()
    obj = claim("mig", [result("gpu-1-mig-13-0", share=False)])
    preparer.claims = FakeClaims(obj)
    answer, spec = prepared_spec(preparer, obj)
    assert not answer.error, answer.error
    ((cdi_id,),) = [device.cdi_ids for device in answer.devices]
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    installed = CDI_DIR / f"hami-dra-test-mig-{os.getpid()}.json"
    installed.write_text(json.dumps(spec))
    try:
        run = podman(
            "run",
            "--rm",
            "--network=none",
            f"--device={cdi_id}",
            IMAGE,
            "sh",
            "-c",
            "ls -l /dev/ /dev/nvidia-caps/",
        )
    finally:
        installed.unlink(missing_ok=True)
    assert run.returncode == 0, run.stderr
    nodes = {line.split()[-1]: line for line in run.stdout.splitlines() if line.startswith("c")}
    gi_cap, ci_cap = mig_caps_minors(1, 13, 0)
    assert f"{NVIDIA_CAPS_MAJOR}, {gi_cap:>3}" in nodes[f"nvidia-cap{gi_cap}"]
    assert f"{NVIDIA_CAPS_MAJOR}, {ci_cap:>3}" in nodes[f"nvidia-cap{ci_cap}"]
    assert sorted(n for n in nodes if n.startswith("nvidia-cap")) == [
        f"nvidia-cap{gi_cap}",
        f"nvidia-cap{ci_cap}",
    ]
    assert "nvidia1" in nodes and "nvidia0" not in nodes, run.stdout


# ---------------------------------------------------------------- MIG on demand (issue 37 item 2)
@pytest.mark.parametrize("layout", ["host", "operator"])
def test_an_on_demand_instance_gets_its_card_node_and_the_hosts_capability_nodes(
    layout: Layout, tmp_path: Path
) -> None:
    """A card in MIG mode without instances, marked for MIG on demand: the toolkit's spec (real
    nvidia-ctk) has no MIG device of it, since none existed when it was generated; the instance
    prepare creates still gets the card's node and its two capability nodes, described from the
    node's (mock root's) device files with the driver's numbers."""
    from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
    from dra_driver.devices.simulated_mig import SimulatedMigDriver
    from dra_driver.kubeletplugin.mig_on_demand import Journal, MigOnDemand

    require_toolkit()
    path = tmp_path / "devices.yaml"
    entries = [{"index": 0, "profile": "h100-80gb"}, {"index": 1, "profile": "h100-80gb", "migEnabled": True}]
    path.write_text(yaml.safe_dump({"gpus": entries}))
    gpus = mark_on_demand(DevicesFileSource(path, node_name="node-1").discover(), parse_selection("1"))
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040))
    )
    driver = mock_driver_root(tmp_path / "root", profile)
    registry = tmp_path / "registry"
    assert generate_spec(layout, driver, registry) is not None
    preparer = make(
        tmp_path, FakeClaims(), simulated=False, toolkit=ToolkitRegistry((registry,), host=HostView())
    )
    preparer.inventory = Inventory(node_devices(gpus))
    preparer.mig = MigOnDemand(
        gpus, SimulatedMigDriver(tmp_path / "instances.json", gpus[1:]), Journal(tmp_path / "journal.json")
    )
    preparer.start()
    obj = claim("slice", [result("gpu-1-mig-1g10gb-at-5", share=False)])
    preparer.claims = FakeClaims(obj)
    answer, spec = prepared_spec(preparer, obj)
    assert not answer.error, answer.error
    nodes = own_nodes(spec)
    caps = [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in mig_caps_minors(1, 12, 0)]  # 1g at 5: GI 12
    assert [n["path"] for n in nodes if n["path"].startswith("/dev/nvidia-caps/")] == caps
    assert [n["path"] for n in nodes if n["path"][len("/dev/nvidia") :].isdigit()] == ["/dev/nvidia1"]
    for node in nodes:
        if node["path"] in caps:
            assert (node["major"], node["minor"]) == (
                NVIDIA_CAPS_MAJOR,
                int(node["path"].rsplit("cap", 1)[1]),
            )
            assert node["hostPath"] == str(driver.dev_root) + node["path"]
