"""MIG on demand on the real cluster (issue 37 item 2): a mock H200 node whose GPUs 1 and 2 are in
MIG mode with no instance and marked ``kubeletPlugin.migOnDemand``.

The node is this machine with a mock driver root (``tests/nvidia_layouts.py``): the mock NVML
answers NVML's MIG calls and keeps the instances the plugin creates in a file in the plugin's
directory (``MOCK_NVML_MIG_STATE``), as the kernel driver keeps them; the root holds the
capability nodes of every GPU instance id of the two cards. The cluster (1.37) serves
partitionable devices, so each marked card publishes its 18 possible placements with their
counters. Pods of the chart's ``mig.gpu.hami.io`` class are placed by our controller (binpack):
three 1g.18gb pods get slices 0, 1 and 2 of GPU 1, created by the plugin at prepare and each
running with exactly its instance's nodes; a 7g.141gb pod then gets the untouched GPU 2; deleting
the pods destroys the instances. A plugin killed between NVML's create and the instance's record
(the ``mig-after-create`` failpoint) leaves no orphan once it is back: the retried prepare gets
the placement, which an orphan would hold.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devices.mig import mig_caps_minors
from dra_driver.devices.mig_on_demand import parse_placement_device_name
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.kubeletplugin.failpoint import FAILPOINT_ENV, KILLED_STATUS
from dra_driver.kubeletplugin.mig_on_demand import CREATED, CREATING, JOURNAL_NAME
from hami_dra_dev.cluster.layout import CDI_DIR, NODE_NAME, Layout
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, DRIVER, ChartDriver, DriverUnderTest, reset_workloads
from tests.cluster.test_e2e import POD_TIMEOUT
from tests.cluster.test_gpu_mig import caps_of, delete, placed_by_our_controller, run_mig_pod
from tests.cluster.test_gpu_nodes import GPU_LABEL, PLUGIN, GpuNode
from tests.devices.mock_profiles import profile_from_gpus
from tests.nvidia_layouts import SPEC_FILES, mock_driver_root, require_toolkit
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

#: GPU 0 whole, GPUs 1 and 2 as their 18 placements each.
PUBLISHED = 1 + 2 * 18


@dataclass
class OnDemandNode(GpuNode):
    """The GPU node with GPUs 1 and 2 marked for MIG on demand and the mock's state in a file."""

    state: Path = Path()

    def values(self, driver_root: Path | None = None) -> list[str]:
        return [
            *super().values(driver_root),
            "kubeletPlugin.migOnDemand=1\\,2",
            "kubeletPlugin.extraEnv[2].name=MOCK_NVML_MIG_STATE",
            f"kubeletPlugin.extraEnv[2].value={self.state}",
        ]

    def instances(self) -> list[tuple[int, int, int]]:
        """``(GPU index, start, profile id)`` of the GPU instances the mock driver holds."""
        if not self.state.exists():
            return []
        found = []
        for line in self.state.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "gi":
                found.append((int(parts[1]), int(parts[4]), int(parts[3])))
        return sorted(found)

    def gpu_instance_ids(self) -> dict[tuple[int, int, int], int]:
        """The GPU instance id of each instance of :meth:`instances`."""
        if not self.state.exists():
            return {}
        rows = [line.split() for line in self.state.read_text().splitlines()]
        return {(int(r[1]), int(r[4]), int(r[3])): int(r[2]) for r in rows if r and r[0] == "gi"}

    def journal(self) -> dict[str, dict[str, Any]]:
        """The plugin's MIG on demand records by placement device name (``mig-on-demand.json``)."""
        path = self.state.parent / JOURNAL_NAME
        if not path.exists():
            return {}
        records: dict[str, dict[str, Any]] = json.loads(path.read_text()).get("instances") or {}
        return records

    def unowned(self) -> list[tuple[int, int, int]]:
        """Instances no record of the journal stands for: orphans. NVML's state is read first: the
        plugin writes a record before it creates the instance, so one seen then has its record."""
        live = self.instances()
        owned = set()
        for device, record in self.journal().items():
            parsed = parse_placement_device_name(device)
            assert parsed is not None, f"journal record for {device}, no placement device"
            owned.add((int(parsed[0].removeprefix("gpu-")), record["start"], record["profile_id"]))
        return [instance for instance in live if instance not in owned]


@pytest.fixture(scope="module")
def on_demand_node(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[OnDemandNode]:
    assert isinstance(driver, ChartDriver)
    require_toolkit(required=True)
    cluster = real_cluster
    reset_workloads(cluster)
    base = cluster.state_dir / "nvidia-mig-on-demand-root"
    base.mkdir(parents=True, exist_ok=True)
    devices = base / "devices.yaml"
    devices.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"index": 0, "profile": "h200"},
                    {"index": 1, "profile": "h200", "migEnabled": True},
                    {"index": 2, "profile": "h200", "migEnabled": True},
                ]
            }
        )
    )
    gpus = DevicesFileSource(devices, node_name=NODE_NAME).discover()
    profile = base / "profile.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="570.124.06", cuda_driver_version=12080))
    )
    root = mock_driver_root(base / "root", profile, required=True)
    subprocess.run(["mount", "--bind", str(root.root), str(root.root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root.root)], check=True)
    plugin_dir = Layout(cluster.state_dir).kubelet_root / "plugins" / DRIVER
    state = plugin_dir / "mock-nvml-mig-state"
    state.unlink(missing_ok=True)
    (plugin_dir / "mig-on-demand.json").unlink(missing_ok=True)
    node = OnDemandNode(cluster, driver, root, state)
    node.events.write_text("")
    node.use_layout("host")
    cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}=true", "--overwrite")
    try:
        node.upgrade()
        yield node
    finally:
        cluster.kubectl(
            "delete", "pods,resourceclaims", "--all", "-n", "default", "--wait=true", "--timeout=90s"
        )
        reset_workloads(cluster)
        for name in set(SPEC_FILES.values()):
            (CDI_DIR / name).unlink(missing_ok=True)
        driver.upgrade()
        cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}-")
        subprocess.run(["umount", str(root.root)], check=False)


def placement_devices(node: OnDemandNode) -> dict[str, dict[str, Any]]:
    devices = node.wait_devices(PUBLISHED)
    return {d["name"]: d for d in devices}


def test_placements_are_published_with_their_counters(on_demand_node: OnDemandNode) -> None:
    by_name = placement_devices(on_demand_node)
    assert "gpu-0" in by_name and "gpu-1" not in by_name and "gpu-2" not in by_name
    one = by_name["gpu-1-mig-1g18gb-at-3"]
    assert one["attributes"]["onDemand"] == {"bool": True}
    assert one["consumesCounters"][0]["counterSet"] == "gpu-1-mig"
    slices = on_demand_node.cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")[
        "items"
    ]
    sets = sorted(cs["name"] for s in slices for cs in s["spec"].get("sharedCounters") or [])
    assert sets == ["gpu-1-mig", "gpu-2-mig"], "the server kept the counter sets (partitionable devices)"


def test_three_1g_pods_binpack_on_one_card_and_a_7g_takes_the_untouched_card(
    on_demand_node: OnDemandNode,
) -> None:
    node = on_demand_node
    placement_devices(node)
    names = ["od-a", "od-b", "od-c"]
    for name in names:  # one after another: each placement sees the one before it
        run_mig_pod(node, name, "1g.18gb")
        node.wait_running(name)
    devices = [placed_by_our_controller(node, n)["device"] for n in names]
    assert devices == ["gpu-1-mig-1g18gb-at-0", "gpu-1-mig-1g18gb-at-1", "gpu-1-mig-1g18gb-at-2"]
    # The plugin created them at prepare: GPU instances 7, 8, 9 of GPU 1; slices 4-7 stay free.
    assert node.instances() == [(1, 0, 19), (1, 1, 19), (1, 2, 19)]
    for name, gi in zip(names, (7, 8, 9), strict=True):
        cards = node.exec(name, "ls /dev | grep -E '^nvidia[0-9]+$' || true").split()
        assert cards == ["nvidia1"], f"{name} sees its instance's card only, got {cards}"
        assert caps_of(node, name) == sorted(f"nvidia-cap{m}" for m in mig_caps_minors(1, gi, 0))
    run_mig_pod(node, "od-7g", "7g.")
    node.wait_running("od-7g")
    assert placed_by_our_controller(node, "od-7g")["device"] == "gpu-2-mig-7g141gb-at-0"
    assert (2, 0, 0) in node.instances()
    delete(node, *names, "od-7g")
    wait_for(lambda: node.instances() == [], 90, "the instances destroyed at unprepare")


def plugin_armed(node: OnDemandNode, failpoint: str | None) -> dict[str, Any]:
    """``helm upgrade`` with the plugin's crash hook set to ``failpoint`` (None: unset), then the
    ready plugin pod of that template (the rollout replaces the other one)."""
    hook = [f"kubeletPlugin.extraEnv[3].name={FAILPOINT_ENV}", f"kubeletPlugin.extraEnv[3].value={failpoint}"]
    node.chart.upgrade(*node.values(), *(hook if failpoint else []), wait=False)

    def ready() -> dict[str, Any] | None:
        pods = node.chart.pods(PLUGIN)
        if len(pods) != 1:
            return None
        env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0].get("env") or []}
        statuses = pods[0]["status"].get("containerStatuses") or [{}]
        if env.get(FAILPOINT_ENV) != failpoint or not statuses[0].get("ready"):
            return None
        return pods[0]

    what = f"a ready plugin pod with {FAILPOINT_ENV}={failpoint}"
    pod: dict[str, Any] = wait_for(ready, 180, what, interval=1)
    return pod


def test_a_plugin_killed_between_create_and_record_leaves_no_orphan_after_restart(
    on_demand_node: OnDemandNode,
) -> None:
    node = on_demand_node
    placement_devices(node)
    assert node.instances() == [] and node.journal() == {}, "the tests before left nothing behind"
    armed = plugin_armed(node, "mig-after-create")
    try:
        run_mig_pod(node, "od-crash", "1g.18gb")

        def allocated() -> dict[str, Any] | None:
            found: dict[str, Any] = node.cluster.get("resourceclaim", "od-crash")
            return found if (found.get("status") or {}).get("allocation") else None

        claim = wait_for(allocated, POD_TIMEOUT, "od-crash's claim allocated", interval=0.5)
        uid = claim["metadata"]["uid"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        parsed = parse_placement_device_name(device)
        assert parsed is not None and parsed[0] == "gpu-1", device
        placement = (1, parsed[3], 19)  # 1g.18gb is profile 19 on an H200

        def killed_in_the_window() -> bool:
            """The armed plugin died at the failpoint (SIGKILL's status) with the instance made and
            only the intent on disk: the state a crash there leaves."""
            (pod,) = [p for p in node.chart.pods(PLUGIN) if p["metadata"]["uid"] == armed["metadata"]["uid"]]
            status = pod["status"]["containerStatuses"][0]
            terminated = (status.get("lastState") or {}).get("terminated") or {}
            if terminated.get("exitCode") != KILLED_STATUS:
                return False
            live = node.instances()
            record = node.journal().get(device) or {}
            return placement in live and record.get("claim") == uid and record.get("state") == CREATING

        wait_for(killed_in_the_window, POD_TIMEOUT, f"the plugin killed after creating {device}", 0.2)
        logs: list[str] = []

        def previous_logs() -> bool:
            """The killed container's log. kubelet restarts it at once, still armed, and the next
            start dies the same way: while the newer one is being replaced, ``--previous`` may
            answer "unable to retrieve container logs", so it is read again."""
            logs.append(
                node.cluster.kubectl(
                    "logs", "-n", CHART_NAMESPACE, armed["metadata"]["name"], "--previous", check=False
                )
            )
            return "failpoint mig-after-create: killing the process" in logs[-1]

        wait_for(previous_logs, 60, "the killed plugin's log names the failpoint", 1)
        phase = node.cluster.get("pod", "od-crash")["status"]["phase"]
        assert phase == "Pending", "the prepare was never answered"
        assert all(r["state"] == CREATING for r in node.journal().values()), "no record got past its intent"
    finally:
        restarts = [p["status"]["containerStatuses"][0]["restartCount"] for p in node.chart.pods(PLUGIN)]
        plugin_armed(node, None)  # the restart without the failpoint: the rollout's new pod
    # From here on every instance has its record (an intent at least): the restart's reconcile
    # destroyed the orphan, so kubelet's retried prepare could create the placement again, which
    # NVML refuses while an orphan holds it (the failed create would drop the record and leave
    # the orphan unowned, caught below, and the pod would never run).
    orphans: list[tuple[int, int, int]] = []

    def running() -> bool:
        orphans.extend(node.unowned())
        pod = node.cluster.get("pod", "od-crash")
        return bool(pod["status"].get("phase") == "Running")

    # Kubelet retries a failed prepare at its pod worker's back-off (seconds, not minutes).
    wait_for(running, 180, "od-crash running after the plugin's restart", interval=0.2)
    assert orphans == [], f"instances without a record after the restart: {orphans}"
    assert node.instances() == [placement], "exactly the claim's instance, at its placement"
    ((recorded, record),) = node.journal().items()
    gi = node.gpu_instance_ids()[placement]
    assert (recorded, record["claim"], record["state"], record["gpu_instance"]) == (device, uid, CREATED, gi)
    assert caps_of(node, "od-crash") == sorted(f"nvidia-cap{m}" for m in mig_caps_minors(1, gi, 0))
    # Which start destroyed the orphan is timing, so a figure: kubelet restarts the killed
    # container at once with the hook still armed (reconcile runs at every start), or the
    # rollout's unarmed pod finds it.
    destroyed_here = f"destroyed MIG instance at {device}" in node.chart.log(PLUGIN)
    print(json.dumps({"armed_plugin_restarts": restarts, "unarmed_start_destroyed_it": destroyed_here}))
    delete(node, "od-crash")
    gone = "the instance destroyed and its record dropped at unprepare"
    wait_for(lambda: node.instances() == [] and node.journal() == {}, 90, gone)
