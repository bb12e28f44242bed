"""The chart on an NVIDIA GPU node as the real toolkit leaves it, on the real cluster.

The node is this machine, given a mock driver root (``tests/nvidia_layouts.py``: the mock NVML as
``libnvidia-ml.so.<version>``, a stub ``libcuda``, ``nvidia-smi``, real ``/dev/nvidia*`` character
nodes, and ``nvidia-drm``'s ``/dev/dri`` nodes 0660 in groups video and render as on most real
nodes) and the spec the real ``nvidia-ctk`` (built from its Go module) writes for each toolkit
layout into the CDI dir containerd reads: with ``additionalGids`` for the DRM nodes, and without
``nvidia-uvm``, which is loaded only after the spec was generated (issue 33); the plugin completes
it from the host, or withholds the GPUs naming the fix while the host has none either. The chart
runs the plugin with ``source=nvml`` and ``nvidiaDriverRoot`` at that root, on a node labelled
``nvidia.com/gpu.present`` (its default node affinity). In every layout a pod with a claim either
starts, containerd having resolved our CDI IDs and applied the toolkit's edits and hooks, or never
reaches the node, with the reason in ``kubectl describe``; an XID 79 injected through the mock's
event file taints that one GPU, an ignored XID leaves its GPU alone, and a GPU recovers once NVML
reaches it with no reset pending.

HAMi-core's image is pointed at a registry that cannot exist, as an air-gapped node sees
docker.io: its installer stays in ImagePullBackOff while the plugin publishes every GPU with
``isolation: none``. A driver root that is empty when the plugin starts and is mounted later, as
the GPU Operator's driver container does, is waited for and published once NVML loads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from hami_dra_dev.cluster.layout import CDI_DIR, NODE_NAME
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DRIVER, ChartDriver, DriverUnderTest, reset_workloads
from tests.cluster.test_e2e import POD_TIMEOUT
from tests.cluster.test_gpu_tenants import manifest
from tests.nvidia_layouts import (
    PROFILES,
    RENDER_GID,
    SPEC_FILES,
    VIDEO_GID,
    DriverRoot,
    Layout,
    generate_spec,
    mock_driver_root,
    require_toolkit,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

PROFILE = PROFILES / "t4-4x-node-1.json"
GPU_LABEL = "nvidia.com/gpu.present"
CLASS = f"binpack.{DRIVER}"
#: Where the plugin pod sees the driver root (the chart's mount) and the mock's files in it.
IN_POD = Path("/driver-root")
EVENTS = "mock-nvml-events"
#: kubeletPlugin.health.recoverySeconds here: how long a marked GPU waits before it is probed.
RECOVERY_SECONDS = 2
PLUGIN = "kubelet-plugin"
INSTALLER = "hami-core"


@dataclass
class GpuNode:
    cluster: RealCluster
    chart: ChartDriver
    driver: DriverRoot

    def values(self, driver_root: Path | None = None) -> list[str]:
        """The chart on this GPU node, with the driver root at ``driver_root`` (default the mock's)."""
        return [
            "kubeletPlugin.source=nvml",
            # HAMi-core from a registry no node reaches: its installer never runs, GPUs are isolation=none.
            "kubeletPlugin.hamiCore.install=image",
            "kubeletPlugin.hamiCore.image.repository=registry.invalid/projecthami/hami",
            "kubeletPlugin.hamiCore.image.pullPolicy=Always",
            f"kubeletPlugin.hamiCore.hostDir={self.cluster.state_dir / 'hami-core-unreachable'}",
            # ... so the recipe classes hand out shares there only because they opt in (NVIDIA's model).
            "recipeClasses.allowUnenforcedShares=true",
            f"kubeletPlugin.nvidiaDriverRoot={driver_root or self.driver.root}",
            "kubeletPlugin.extraEnv[0].name=MOCK_NVML_PROFILE",
            f"kubeletPlugin.extraEnv[0].value={IN_POD / self.driver.profile.relative_to(self.driver.root)}",
            "kubeletPlugin.extraEnv[1].name=MOCK_NVML_EVENTS",
            f"kubeletPlugin.extraEnv[1].value={IN_POD / EVENTS}",
            # The chart's health knobs: a short recovery window, and one XID ignored.
            f"kubeletPlugin.health.recoverySeconds={RECOVERY_SECONDS}",
            "kubeletPlugin.health.additionalXidsToIgnore={63}",
        ]

    def plugin(self, driver_root: Path, *, ready: bool) -> dict[str, Any]:
        """The plugin pod running with ``driver_root`` (and ready, if asked), once there is one."""

        def found() -> dict[str, Any] | None:
            pods = self.chart.pods(PLUGIN)
            if len(pods) != 1 or pods[0]["status"].get("phase") != "Running":
                return None
            volumes = {v["name"]: v.get("hostPath", {}) for v in pods[0]["spec"]["volumes"]}
            statuses = pods[0]["status"].get("containerStatuses") or [{}]
            if volumes.get("driver-root", {}).get("path") != str(driver_root):
                return None
            return pods[0] if not ready or all(c.get("ready") for c in statuses) else None

        pod: dict[str, Any] = wait_for(found, 180, f"the plugin pod on driver root {driver_root}", interval=1)
        return pod

    def upgrade(self, driver_root: Path | None = None) -> None:
        """``helm upgrade`` without ``--wait`` (the installer never becomes ready), then the plugin."""
        self.chart.upgrade(*self.values(driver_root), wait=False)
        self.plugin(driver_root or self.driver.root, ready=driver_root is None)

    @property
    def events(self) -> Path:
        return self.driver.root / EVENTS

    def use_layout(self, layout: Layout) -> None:
        """Leave exactly ``layout``'s toolkit spec in the CDI dir containerd and the plugin read,
        generated while nvidia-uvm was not loaded (it is, afterwards)."""
        for name in set(SPEC_FILES.values()):
            (CDI_DIR / name).unlink(missing_ok=True)
        generate_spec(layout, self.driver, CDI_DIR)
        self.driver.load_uvm()

    def devices(self) -> list[dict[str, Any]]:
        slices = self.cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
        return [
            d
            for s in slices
            if s["spec"].get("nodeName") == NODE_NAME
            for d in s["spec"].get("devices") or []
        ]

    def wait_devices(self, count: int) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.devices()) == count, 90, f"{count} devices in the node's ResourceSlice")
        return self.devices()

    def run(self, name: str, selectors: list[dict[str, Any]] | None = None) -> None:
        exactly: dict[str, Any] = {"deviceClassName": CLASS, "capacity": {"requests": {"memory": "1Gi"}}}
        if selectors:
            exactly["selectors"] = selectors
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        container = {
            "name": "app",
            "image": "busybox:1.36",
            "command": ["sleep", "86400"],
            "resources": {"claims": [{"name": "gpu"}]},
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
        }
        self.cluster.kubectl("apply", "-f", "-", stdin=manifest(claim, pod))

    def exec(self, pod: str, script: str) -> str:
        return self.cluster.kubectl("exec", "-n", "default", pod, "--", "sh", "-c", script)

    def wait_running(self, pod: str) -> None:
        waited = self.cluster.kubectl(
            "wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={POD_TIMEOUT:.0f}s", check=False
        )
        if "condition met" not in waited:
            described = self.cluster.kubectl("describe", "pod", pod, check=False)
            raise AssertionError(
                f"{pod} not running: {waited}\n{described}\n{self.chart.log('kubelet-plugin')[-4000:]}"
            )

    def allocated_device(self, claim: str) -> str:
        allocation = self.cluster.get("resourceclaim", claim)["status"]["allocation"]
        device: str = allocation["devices"]["results"][0]["device"]
        return device

    def described(self, kind: str, name: str, text: str) -> str:
        def found() -> str | None:
            out = self.cluster.kubectl("describe", kind, name)
            return out if text in out else None

        result: str = wait_for(found, 90, f"{text!r} in kubectl describe {kind} {name}")
        return result


@pytest.fixture(scope="module")
def gpu_node(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[GpuNode]:
    assert isinstance(driver, ChartDriver)
    require_toolkit(required=True)
    cluster = real_cluster
    reset_workloads(cluster)
    root = mock_driver_root(real_cluster.state_dir / "nvidia-driver-root", PROFILE, required=True)
    # The chart mounts the driver root HostToContainer, which needs a shared mount there, as / is on
    # a systemd host; this machine's / is private, so the root becomes a shared mount of its own.
    subprocess.run(["mount", "--bind", str(root.root), str(root.root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root.root)], check=True)
    node = GpuNode(cluster, driver, root)
    node.events.write_text("")
    node.use_layout("none")
    cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}=true", "--overwrite")
    try:
        node.upgrade()
        yield node
    finally:
        # The tests' claims are their own (not from templates), so they go with their pods here.
        cluster.kubectl(
            "delete", "pods,resourceclaims", "--all", "-n", "default", "--wait=true", "--timeout=90s"
        )
        reset_workloads(cluster)
        for name in set(SPEC_FILES.values()):
            (CDI_DIR / name).unlink(missing_ok=True)
        driver.upgrade()  # back to values-local.yaml: the simulated lab the other modules use
        cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}-")
        subprocess.run(["umount", str(root.root)], check=False)
        shutil.rmtree(cluster.state_dir / "hami-core-unreachable", ignore_errors=True)


def test_without_a_toolkit_spec_no_gpu_is_published_and_describe_says_why(gpu_node: GpuNode) -> None:
    gpu_node.use_layout("none")
    gpu_node.wait_devices(0)
    described = gpu_node.described("node", NODE_NAME, "NvidiaCdiSpecMissing")
    assert "nvidia-ctk cdi generate" in described
    gpu_node.run("no-spec")
    pending = gpu_node.described("pod", "no-spec", f"no device of class {CLASS}")
    assert "Pending" in pending
    gpu_node.cluster.kubectl("delete", "pod", "no-spec", "--wait=true")
    gpu_node.cluster.kubectl("delete", "resourceclaim", "no-spec", "--wait=true")


@pytest.mark.parametrize("layout", ["host", "operator", "index-only"])
def test_a_pod_starts_on_every_toolkit_layout_with_its_gpu_and_the_driver_files(
    gpu_node: GpuNode, layout: Layout
) -> None:
    gpu_node.use_layout(layout)
    devices = gpu_node.wait_devices(len(gpu_node.driver.gpus))
    assert sorted(d["name"] for d in devices) == sorted(f"gpu-{g.minor}" for g in gpu_node.driver.gpus)
    name = f"on-{layout}"
    gpu_node.run(name)
    gpu_node.wait_running(name)
    device = gpu_node.allocated_device(name)
    minor = int(device.removeprefix("gpu-"))
    nodes = gpu_node.exec(name, "ls /dev | grep -E '^nvidia[0-9]+$' || true").split()
    assert nodes == [f"nvidia{minor}"], f"the container sees exactly its own GPU, got {nodes}"
    libcuda = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{gpu_node.driver.driver_version}"
    listing = gpu_node.exec(name, f"ls {libcuda} /usr/lib/x86_64-linux-gnu/libcuda.so.1 /dev/nvidiactl")
    assert libcuda in listing and "libcuda.so.1" in listing, (
        "the toolkit's mounts and its create-symlinks hook"
    )
    # nvidia-uvm: not in the toolkit's spec (loaded after it was generated), added by the plugin.
    uvm = gpu_node.exec(name, "ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools")
    assert uvm.count("crw-rw-rw-") == 2, uvm
    if layout != "operator":  # the GPU's DRM nodes, and the groups that open them (additionalGids)
        gpu = next(g for g in gpu_node.driver.gpus if g.minor == minor)
        card, render = gpu_node.driver.drm_nodes(gpu)
        dri = gpu_node.exec(name, f"ls -ln /dev/dri/{card} /dev/dri/{render}")
        assert f" {VIDEO_GID} " in dri and f" {RENDER_GID} " in dri and dri.count("crw-rw----") == 2, dri
        groups = gpu_node.exec(name, "id -G").split()
        assert {str(VIDEO_GID), str(RENDER_GID)} <= set(groups), groups
    gpu_node.cluster.kubectl("delete", "pod", name, "--wait=true")
    gpu_node.cluster.kubectl("delete", "resourceclaim", name, "--wait=true")


def test_without_nvidia_uvm_on_the_node_no_gpu_is_published_and_describe_names_the_fix(
    gpu_node: GpuNode,
) -> None:
    gpu_node.use_layout("host")
    gpu_node.wait_devices(len(gpu_node.driver.gpus))
    gpu_node.driver.unload_uvm()  # nothing loaded nvidia-uvm: neither the spec nor the host has it
    try:
        gpu_node.wait_devices(0)
        described = gpu_node.described("node", NODE_NAME, "NvidiaControlNodesMissing")
        assert "nvidia-modprobe -u -c=0" in described
    finally:
        gpu_node.driver.load_uvm()
    gpu_node.wait_devices(len(gpu_node.driver.gpus))


def test_an_xid_79_taints_that_gpu_and_a_pod_that_needs_it_says_why(gpu_node: GpuNode) -> None:
    gpu_node.use_layout("host")
    gpu_node.wait_devices(len(gpu_node.driver.gpus))
    sick = gpu_node.driver.gpus[1]
    with gpu_node.events.open("a") as events:  # XID 79: the GPU fell off the bus, NVML loses it
        events.write(f"{sick.index} fallen\n{sick.index} xid 79\n")

    def sick_device() -> dict[str, Any] | None:
        for device in gpu_node.devices():
            if device["name"] == f"gpu-{sick.minor}" and device["attributes"]["healthy"]["bool"] is False:
                return device
        return None

    device = wait_for(sick_device, 60, f"gpu-{sick.minor} published unhealthy after XID 79")
    taints = [t["key"] for t in device.get("taints") or []]
    selector = [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{sick.uuid}"'}}]
    gpu_node.run("needs-sick", selectors=selector)
    if f"{DRIVER}/unhealthy" in taints:  # device taints on (1.35+ by default): the reason names it
        described = gpu_node.described("pod", "needs-sick", f"gpu-{sick.minor} ({DRIVER}/unhealthy)")
    else:  # the API server dropped device taints: the engine's own health check
        described = gpu_node.described("pod", "needs-sick", "CardNotHealth")
    assert "Pending" in described
    gpu_node.run("elsewhere")
    gpu_node.wait_running("elsewhere")
    assert gpu_node.allocated_device("elsewhere") != f"gpu-{sick.minor}"
    print(json.dumps({"taints": taints, "reason": described.splitlines()[-3:]}))


def test_ignored_xids_leave_a_gpu_alone_and_a_marked_gpu_recovers_when_it_can(gpu_node: GpuNode) -> None:
    gpu_node.use_layout("host")
    gpu_node.wait_devices(len(gpu_node.driver.gpus))
    ignored, transient, needs_reset = (gpu_node.driver.gpus[i] for i in (0, 3, 2))

    def healthy(gpu: Any) -> bool | None:
        for device in gpu_node.devices():
            if device["name"] == f"gpu-{gpu.minor}":
                tainted = any(t["key"] == f"{DRIVER}/unhealthy" for t in device.get("taints") or [])
                value: bool = device["attributes"]["healthy"]["bool"]
                assert device["attributes"]["healthMonitored"] == {"bool": True}
                return value and not tainted
        return None

    # Events are read in order: once the XID 94 after it is handled, the ignored XID 63 was too.
    with gpu_node.events.open("a") as events:
        events.write(f"{ignored.index} xid 63\n{transient.index} xid 94\n")
    wait_for(lambda: healthy(transient) is False, 60, f"gpu-{transient.minor} unhealthy after XID 94")
    assert healthy(ignored) is True, "XID 63 is in kubeletPlugin.health.additionalXidsToIgnore"
    # Contained (XID 94), reachable, no reset pending: healthy again after the recovery window.
    wait_for(lambda: healthy(transient) is True, 60, f"gpu-{transient.minor} recovered")

    # An uncorrectable error that awaits a reset (a T4 retires the page at the next reset).
    with gpu_node.events.open("a") as events:
        events.write(f"{needs_reset.index} remap-pending\n{needs_reset.index} xid 48\n")
    wait_for(lambda: healthy(needs_reset) is False, 60, f"gpu-{needs_reset.minor} unhealthy after XID 48")
    waiting = f"gpu-{needs_reset.minor} stays unhealthy: pages are pending retirement: reset the GPU"
    wait_for(lambda: waiting in gpu_node.chart.log("kubelet-plugin"), 60, "the plugin saying why it waits")
    assert healthy(needs_reset) is False
    with gpu_node.events.open("a") as events:
        events.write(f"{needs_reset.index} reset\n")
    wait_for(lambda: healthy(needs_reset) is True, 60, f"gpu-{needs_reset.minor} recovered after its reset")


def test_an_unreachable_hami_core_image_leaves_the_plugin_publishing_whole_gpus(gpu_node: GpuNode) -> None:
    """The air-gapped node: the installer cannot pull HAMi's image, the plugin runs regardless and
    publishes every GPU with isolation none (the chart's classes give them out whole unless a class
    opts in, as the recipe classes do here) and says why on the Node."""
    gpu_node.use_layout("host")
    devices = gpu_node.wait_devices(len(gpu_node.driver.gpus))
    assert {d["attributes"]["isolation"]["string"] for d in devices} == {"none"}
    assert len(gpu_node.chart.pods(INSTALLER)) == 1, "the installer runs on the GPU node"

    def pull_failed() -> str | None:
        for status in gpu_node.chart.pods(INSTALLER)[0]["status"].get("containerStatuses") or ():
            reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                return str(reason)
        return None

    reason: str = wait_for(pull_failed, 90, "the installer's pull failing", interval=1)
    (plugin,) = gpu_node.chart.pods(PLUGIN)
    assert plugin["status"]["phase"] == "Running"
    assert all(c["ready"] for c in plugin["status"]["containerStatuses"]), "the plugin is ready"
    assert "initContainers" not in plugin["spec"], "nothing in the plugin's pod pulls HAMi's image"
    gpu_node.described("node", NODE_NAME, "SharesNotEnforced")
    print(json.dumps({"installer": reason, "plugin": plugin["status"]["phase"], "isolation": "none"}))


def test_a_driver_root_mounted_after_the_plugin_started_is_waited_for_and_published(
    gpu_node: GpuNode,
) -> None:
    """The GPU Operator's order: the plugin starts on an empty /run/nvidia/driver (created by
    kubelet, ``DirectoryOrCreate``), waits with a log line naming what is missing, and publishes
    once the driver container mounts its root there (seen through ``HostToContainer``)."""
    cluster = gpu_node.cluster
    gpu_node.use_layout("host")
    parent = cluster.state_dir / "run-nvidia"
    late = parent / "driver"
    parent.mkdir(exist_ok=True)
    # /run/nvidia is a shared mount on a systemd host, where the driver container mounts its root.
    subprocess.run(["mount", "--bind", str(parent), str(parent)], check=True)
    subprocess.run(["mount", "--make-shared", str(parent)], check=True)
    try:
        subprocess.run(["umount", str(late)], check=False, capture_output=True)  # a failed run's
        if late.exists():
            late.rmdir()  # kubelet creates it: the pod must not fail to mount a missing directory
        gpu_node.upgrade(late)
        assert late.is_dir(), "kubelet created the driver root"

        def waiting_line() -> str | None:
            log = gpu_node.chart.log(PLUGIN).splitlines()
            lines = [line for line in log if "waiting for the NVIDIA driver" in line]
            return lines[-1] if lines else None

        line: str = wait_for(waiting_line, 60, "the plugin's line waiting for the driver", interval=1)
        assert "libnvidia-ml.so.1 not found under the NVIDIA driver root /driver-root" in line
        assert "kubeletPlugin.nvidiaDriverRoot" in line
        (plugin,) = gpu_node.chart.pods(PLUGIN)
        restarts = plugin["status"]["containerStatuses"][0]["restartCount"]
        # The previous plugin pod's slices outlive it (prepared claims survive restarts): a new node's
        # have never been there, so they go, and only the waiting plugin could bring them back.
        ours = f"spec.driver={DRIVER}"
        cluster.kubectl("delete", "resourceslices", "--field-selector", ours, "--wait=true")
        assert gpu_node.devices() == []

        subprocess.run(["mount", "--bind", str(gpu_node.driver.root), str(late)], check=True)
        # The Operator's toolkit writes its spec once its driver root is there, naming the host paths
        # below it, which the plugin sees through its driver-root mount (control nodes included).
        generate_spec("host", replace(gpu_node.driver, root=late), CDI_DIR)
        gpu_node.driver.load_uvm()
        devices = gpu_node.wait_devices(len(gpu_node.driver.gpus))
        assert sorted(d["name"] for d in devices) == sorted(f"gpu-{g.minor}" for g in gpu_node.driver.gpus)
        log = gpu_node.chart.log(PLUGIN)
        assert "NVIDIA driver ready after" in log
        (same,) = gpu_node.chart.pods(PLUGIN)
        assert same["metadata"]["uid"] == plugin["metadata"]["uid"], "the same pod, waiting, not restarted"
        assert same["status"]["containerStatuses"][0]["restartCount"] == restarts
        print(json.dumps({"waiting": line[-160:], "restarts": restarts}))
    finally:
        gpu_node.use_layout("host")  # the spec of the mock's own root again
        gpu_node.upgrade()  # back to the mock's root for the module's other tests
        subprocess.run(["umount", str(late)], check=False)
        subprocess.run(["umount", str(parent)], check=False)
