"""MIG on demand against the mock NVML, process by process (issue 37 item 2): prepare creates the
GPU and compute instance at the chosen placement after a durable intent record, unprepare destroys
it, and a plugin killed between create and record leaves no orphan once it starts again.

Each step is its own Python process loading hack/mock-nvml with ``MOCK_NVML_MIG_STATE``, so the
instances outlive a process as the kernel driver's do, and the kill is a real SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mock_profiles import nvml_env, profile_from_gpus, with_mig

from dra_driver.devices.simulated import profile_gpus

NODE = "node-1"

_PRELUDE = """
import dataclasses, json, sys
from pathlib import Path
import pynvml as n
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.nvml_mig_create import NvmlMigDriver
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.mig_on_demand import Journal, MigOnDemand
n.nvmlInit()
found = profile_gpus("h100-80gb", node_name="node-1", gpus=2)
gpus = [dataclasses.replace(g, mig_enabled=True) for g in found]
driver = NvmlMigDriver(n)
mig = MigOnDemand(mark_on_demand(gpus, parse_selection("all")), driver, Journal(Path(sys.argv[1])))
def live(card=0):
    return sorted((i.start, i.size, i.profile_id) for i in driver.instances(gpus[card].uuid))
out = {}
"""


def profile() -> dict:
    gpus = profile_gpus("h100-80gb", node_name=NODE, gpus=2)
    nvml = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    nvml["devices"] = [with_mig(device) for device in nvml["devices"]]
    return nvml


def step(run_nvml_script, tmp_path: Path, body: str, **options) -> dict:
    proc = run_nvml_script(
        _PRELUDE + body + "\nprint(json.dumps(out))\n",
        profile(),
        str(tmp_path / "mig-on-demand.json"),
        mig_state=tmp_path / "nvml-mig-state",
        **options,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_prepare_creates_and_unprepare_destroys(run_nvml_script, tmp_path: Path) -> None:
    made = step(
        run_nvml_script,
        tmp_path,
        """
gpu = mig.ensure("claim-a", "gpu-0-mig-1g10gb-at-3")
again = mig.ensure("claim-a", "gpu-0-mig-1g10gb-at-3")   # a retried prepare: the same instance
out["gpu"] = [gpu.name, gpu.uuid, gpu.minor, list(gpu.mig_caps), gpu.memory_bytes, gpu.slots]
out["same"] = again.uuid == gpu.uuid
out["live"] = live()
try:
    mig.ensure("claim-b", "gpu-0-mig-1g10gb-at-3")
except Exception as err:
    out["held"] = str(err)
try:
    mig.ensure("claim-b", "gpu-0-mig-3g40gb-at-0")      # overlaps slice 3: NVML refuses
except Exception as err:
    out["overlap"] = str(err)
out["journal"] = json.loads(Path(sys.argv[1]).read_text())
""",
    )
    name, uuid, minor, caps, memory, slots = made["gpu"]
    assert name == "gpu-0-mig-1g10gb-at-3" and uuid.startswith("MIG-") and slots == 1
    assert caps == [3 + 10 * 9, 3 + 10 * 9 + 1]  # gpu0/gi10/access, gpu0/gi10/ci0/access (mig-minors)
    assert memory == 9984 << 20 and minor == 0
    assert made["same"] and made["live"] == [[3, 1, 19]]
    assert "held by claim claim-a" in made["held"]
    assert "could not be created" in made["overlap"] and "overlaps an instance" in made["overlap"]
    record = made["journal"]["instances"]["gpu-0-mig-1g10gb-at-3"]
    assert record["state"] == "created" and record["uuid"] == uuid and record["gpu_instance"] == 10
    assert list(made["journal"]["instances"]) == ["gpu-0-mig-1g10gb-at-3"]  # the refused one left nothing

    later = step(
        run_nvml_script,
        tmp_path,
        """
out["report"] = dataclasses.asdict(mig.reconcile())   # a restart: nothing to do
out["released"] = mig.release("claim-a")
out["live"] = live()
out["journal"] = json.loads(Path(sys.argv[1]).read_text())
""",
    )
    assert later["report"] == {"destroyed": [], "recreated": [], "lost": []}
    assert later["released"] == ["gpu-0-mig-1g10gb-at-3"]
    assert later["live"] == [] and later["journal"] == {"instances": {}}


def test_a_plugin_killed_between_create_and_record_leaves_no_orphan(
    run_nvml_script, mock_nvml: dict[str, Path], tmp_path: Path
) -> None:
    body = """
mig.ensure("claim-a", "gpu-1-mig-3g40gb-at-4")
out["not reached"] = True
"""
    script = _PRELUDE + body + "\nprint(json.dumps(out))\n"
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile()))
    env = nvml_env(mock_nvml["current"], profile_path, mig_state=tmp_path / "nvml-mig-state")
    env["HAMI_DRA_FAILPOINT"] = "mig-after-create"
    killed = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "mig-on-demand.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr  # SIGKILL at the failpoint
    assert "not reached" not in killed.stdout
    journal = json.loads((tmp_path / "mig-on-demand.json").read_text())
    assert journal["instances"]["gpu-1-mig-3g40gb-at-4"]["state"] == "creating"  # the intent was durable

    after = step(
        run_nvml_script,
        tmp_path,
        """
out["before"] = live(1)
out["report"] = dataclasses.asdict(mig.reconcile())
out["after"] = live(1)
out["journal"] = json.loads(Path(sys.argv[1]).read_text())
gpu = mig.ensure("claim-a", "gpu-1-mig-3g40gb-at-4")   # kubelet's retry of the prepare
out["retry"] = [gpu.name, live(1)]
""",
    )
    assert after["before"] == [[4, 4, 9]]  # the instance the killed plugin made
    assert after["report"] == {"destroyed": ["gpu-1-mig-3g40gb-at-4"], "recreated": [], "lost": []}
    assert after["after"] == [] and after["journal"] == {"instances": {}}
    assert after["retry"] == ["gpu-1-mig-3g40gb-at-4", [[4, 4, 9]]]


def test_a_recorded_instance_that_vanished_is_created_again(run_nvml_script, tmp_path: Path) -> None:
    step(run_nvml_script, tmp_path, 'mig.ensure("claim-a", "gpu-0-mig-2g20gb-at-2")')
    (tmp_path / "nvml-mig-state").write_text("")  # a GPU reset: the driver has no instances
    after = step(
        run_nvml_script,
        tmp_path,
        """
out["report"] = dataclasses.asdict(mig.reconcile())
out["live"] = live()
out["state"] = mig.records()["gpu-0-mig-2g20gb-at-2"].state
""",
    )
    assert after["report"] == {"destroyed": [], "recreated": ["gpu-0-mig-2g20gb-at-2"], "lost": []}
    assert after["live"] == [[2, 2, 14]] and after["state"] == "created"


def test_nvml_discovery_of_an_empty_mig_card_marked_on_demand_publishes_its_placements(
    run_nvml, tmp_path: Path
) -> None:
    """What the plugin does at start on a real node: NVML finds the card in MIG mode with no
    instance, ``--mig-on-demand`` marks it, and the slice offers its 18 placements."""
    from dataclasses import replace

    from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
    from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE
    from dra_driver.resource.slice_builder import build_resource_slices

    simulated = profile_gpus("h100-80gb", node_name=NODE, gpus=2)
    simulated[1] = replace(simulated[1], mig_enabled=True)
    nvml_profile = profile_from_gpus(simulated, driver_version="550.54.15", cuda_driver_version=12040)
    run = run_nvml(nvml_profile, sysfs=simulated)
    assert run.error is None, run.stderr
    marked = mark_on_demand(run.gpus, parse_selection(simulated[1].uuid))
    assert [g.mig_on_demand for g in marked] == [False, True]
    slices = build_resource_slices(marked, node_name=NODE, mig_on_demand_layout=LAYOUT_OWN_SLICE)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert names[0] == marked[0].name and len(names) == 1 + 18
    assert f"{marked[1].name}-mig-1g10gb-at-6" in names
