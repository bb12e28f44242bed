"""HAMi-core enforcement in real containers: the chart installs the library, our CDI specs preload it.

No GPU here, so HAMi-core itself cannot limit anything; what the driver controls up to the point
where it would can all be observed. hack/hami-core-standin/ builds a stand-in ``libvgpu.so`` that,
when the dynamic loader preloads it, writes down what HAMi-core would read (the limits, the cache
file, the library's path, /etc/ld.so.preload) next to the cache file it creates, and an image laid
out like HAMi's (``/k8s-vgpu/lib/nvidia/libvgpu.so.<version>``). The chart is upgraded to
``kubeletPlugin.hamiCore.install=image`` with that image, on the simulated 4 x T4 of
values-local.yaml, so its installer (a DaemonSet of its own, ``<release>-hami-core``) installs the
library exactly as it would from ``projecthami/hami``. Pods run the driver's own image
(``localhost/hami-dra``: Debian, dynamically linked, so /etc/ld.so.preload applies; busybox is
static and would never load it).

The host directory is kept below the cluster's state directory rather than the node's real
/usr/local/vgpu, because the node is this machine. At the end the chart goes back to
values-local.yaml and what the tests created is removed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver import __version__
from dra_driver.contract import HAMI_CORE_VERSION_ATTRIBUTE, ISOLATION_ATTRIBUTE
from dra_driver.quantity import MIB, parse_bytes
from hami_dra_dev.cluster.images import DRIVER_IMAGE_REPOSITORY
from hami_dra_dev.cluster.layout import NODE_NAME
from tests.chart.helpers import REPO
from tests.cluster.conftest import NAMESPACE, RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, DRIVER, ChartDriver, DriverUnderTest, reset_workloads
from tests.cluster.test_e2e import POD_TIMEOUT, apply
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.parametrize("driver", ["chart"], indirect=True),
    # The first test also starts the cluster, installs the chart and builds the stand-in image.
    pytest.mark.timeout(900),
]

BUILD = REPO / "hack" / "hami-core-standin" / "build.sh"
#: The HAMi version the stand-in claims to be (the chart's pinned tag), and one the plugin refuses.
VERSION = "v2.10.0"
TOO_OLD = "v2.8.0"
CONTAINER_LIB = "/usr/local/vgpu/libvgpu.so"
RECORD_OF_PID_1 = "hami-core-standin.1.env"
POD_IMAGE = f"{DRIVER_IMAGE_REPOSITORY}:{__version__}"
SHARES = f"binpack.{DRIVER}"
WHOLE = f"mutex.{DRIVER}"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PLUGIN = "kubelet-plugin"
INSTALLER = "hami-core"
#: A registry that cannot exist (RFC 6761 ``.invalid``): what an air-gapped node sees of docker.io.
UNREACHABLE = "registry.invalid/projecthami/hami"

#: Run in a pod's container by ``kubectl exec``: what HAMi-core would find there, one fact a line.
INSPECT = r"""
cache="$CUDA_DEVICE_MEMORY_SHARED_CACHE"
echo "cache=$cache"
if [ -n "$cache" ]; then
  dir="${cache%/*}"
  for f in "$dir"/*; do [ -e "$f" ] && echo "file=${f##*/} $(stat -c '%a %d:%i' "$f")"; done
  if [ -f "$dir/hami-core-standin.1.env" ]; then sed 's/^/record:/' "$dir/hami-core-standin.1.env"; fi
fi
if [ -e /etc/ld.so.preload ]; then echo "preload=$(cat /etc/ld.so.preload)"; fi
if [ -e /usr/local/vgpu/libvgpu.so ]; then echo "library=present"; fi
if grep -q ' /tmp/vgpulock ' /proc/self/mountinfo; then echo "vgpulock=mounted"; fi
tr '\0' '\n' < /proc/1/environ | grep -E '^(CUDA_|GPU_CORE_|LD_PRELOAD)' | sed 's/^/env:/'
true
"""


@dataclass
class StandIn:
    """The stand-in image as ``build.sh`` made it and the chart values that install it."""

    image: str
    archive: Path
    host_dir: Path

    def values(self, host_dir: Path | None = None, repository: str | None = None) -> list[str]:
        """The chart values that install the stand-in (into ``host_dir``; from ``repository``, which
        then has to be pulled, instead of the imported image)."""
        image, tag = self.image.rsplit(":", 1)
        return [
            "kubeletPlugin.hamiCore.install=image",
            f"kubeletPlugin.hamiCore.image.repository={repository or image}",
            f"kubeletPlugin.hamiCore.image.tag={tag}",
            f"kubeletPlugin.hamiCore.image.pullPolicy={'IfNotPresent' if repository else 'Never'}",
            f"kubeletPlugin.hamiCore.hostDir={host_dir or self.host_dir}",
        ]


@dataclass
class ContainerView:
    """What one container holds of HAMi-core (see :data:`INSPECT`)."""

    cache: str
    #: name -> (octal mode, "device:inode") of every file in the cache file's directory
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: the stand-in's record of the container's first process (empty: never preloaded there)
    record: dict[str, str] = field(default_factory=dict)
    preload: str | None = None
    library: bool = False
    vgpulock: bool = False
    #: HAMi-core's variables in the environment of the container's first process
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ContainerView:
        view = cls(cache="")
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key == "cache":
                view.cache = value
            elif key == "file":
                name, mode, ident = value.rsplit(" ", 2)
                view.files[name] = (mode, ident)
            elif key.startswith("record:"):
                view.record[key.removeprefix("record:")] = value
            elif key == "preload":
                view.preload = value
            elif key == "library":
                view.library = True
            elif key == "vgpulock":
                view.vgpulock = True
            elif key.startswith("env:"):
                view.env[key.removeprefix("env:")] = value
        return view

    def limits(self) -> dict[str, str]:
        """The record's per-ordinal and index-less memory/SM limits, as HAMi-core would read them."""
        return {
            k: v
            for k, v in self.record.items()
            if k.startswith(("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"))
        }

    def cache_files(self) -> list[str]:
        return sorted(name for name in self.files if name.endswith(".cache"))


# --- the stand-in and the chart ------------------------------------------------------------------


def build_standin(cluster: RealCluster, version: str) -> StandIn:
    """Build (cached by content) and import the stand-in image of ``version``."""
    proc = subprocess.run(["bash", str(BUILD), version], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"{BUILD} {version} failed:\n{proc.stderr[-3000:]}")
    built = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    archive = Path(built["archive"])
    socket = cluster.state_dir / "containerd" / "containerd.sock"
    subprocess.run(
        [str(cluster.toolchain.path("ctr")), "--address", str(socket), "-n", "k8s.io", "images", "import",
         str(archive)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return StandIn(built["image"], archive, cluster.state_dir / "hami-core")


def gpu_devices(cluster: RealCluster) -> list[dict[str, Any]]:
    slices = cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
    ours = [s for s in slices if s["spec"].get("nodeName") == NODE_NAME]
    return [device for s in ours for device in s["spec"].get("devices") or ()]


def attribute(device: dict[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    return next(iter(value.values())) if value else None


def plugin_pod(chart: ChartDriver) -> dict[str, Any]:
    (pod,) = chart.pods(PLUGIN)
    return pod


def install_log(cluster: RealCluster, chart: ChartDriver) -> str:
    (pod,) = chart.pods(INSTALLER)
    return cluster.kubectl("logs", "-n", CHART_NAMESPACE, pod["metadata"]["name"])


def ready(pod: dict[str, Any]) -> bool:
    return all(c.get("ready") for c in pod["status"].get("containerStatuses") or [{}])


def waiting_reason(pod: dict[str, Any]) -> str | None:
    """Why the pod's container has not started (ErrImagePull, ImagePullBackOff, ...), if it has not."""
    for status in pod["status"].get("containerStatuses") or ():
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason"))
    return None


def isolation(cluster: RealCluster) -> set[Any]:
    return {attribute(d, ISOLATION_ATTRIBUTE) for d in gpu_devices(cluster)}


def upgraded(
    cluster: RealCluster, chart: ChartDriver, expected: str, *values: str, wait: bool = True
) -> None:
    """``helm upgrade`` (waits for the rollout unless ``wait`` is False), then for the plugin pod to
    be ready and its slice to say that every GPU's isolation is ``expected`` (it is something else
    before each upgrade here). The plugin pod is replaced only when its own values change: the
    HAMi-core image is the installer's alone, and the plugin picks a new library up as it runs."""
    chart.upgrade(*values, wait=wait)

    def plugin_ready() -> bool:
        pods = chart.pods(PLUGIN)
        return len(pods) == 1 and ready(pods[0])

    wait_for(plugin_ready, 120, "the upgraded kubelet plugin pod ready", interval=1)
    try:
        wait_for(
            lambda: isolation(cluster) == {expected}, 90, f"isolation={expected} on every GPU", interval=1
        )
    except AssertionError as err:
        raise AssertionError(
            f"{err}: {isolation(cluster)}; plugin log:\n{chart.log(PLUGIN)[-3000:]}"
        ) from None
    assert len(gpu_devices(cluster)) == 4


# --- workloads ------------------------------------------------------------------------------------


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": list(requests)}},
    }


def request(
    name: str,
    device_class: str,
    count: int = 1,
    index: int | None = None,
    **capacity: str,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if index is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {index}'}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def pod(name: str, claim_name: str) -> dict[str, Any]:
    """A dynamically linked container that only sleeps: its first process is what gets preloaded."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "app",
                    "image": POD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "exec sleep infinity"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def running(cluster: RealCluster, name: str) -> None:
    waited = cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", NAMESPACE,
                             f"--timeout={POD_TIMEOUT:.0f}s", check=False)  # fmt: skip
    if "condition met" not in waited:
        described = cluster.kubectl("describe", "pod", name, "-n", NAMESPACE, check=False)
        controller = cluster.driver_log("controller")[-3000:]
        raise AssertionError(f"{name} not running: {waited}\n{described}\n{controller}")


def inspect(cluster: RealCluster, name: str) -> ContainerView:
    return ContainerView.parse(cluster.kubectl("exec", "-n", NAMESPACE, name, "--", "/bin/sh", "-c", INSPECT))


def preloaded(cluster: RealCluster, name: str) -> ContainerView:
    """The container's view once its first process has written the stand-in's record."""
    seen: list[ContainerView] = []

    def recorded() -> ContainerView | None:
        seen.append(inspect(cluster, name))
        return seen[-1] if seen[-1].record else None

    try:
        view: ContainerView = wait_for(recorded, 30, f"the stand-in's record of {name}", interval=1)
    except AssertionError as err:
        raise AssertionError(f"{err}; the container holds: {seen[-1]}") from None
    return view


def clean(cluster: RealCluster) -> None:
    """Delete the test's pods, then its claims (they outlive pods), and see every claim go."""
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=90s")
    cluster.kubectl("delete", "resourceclaims", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=90s")
    reset_workloads(cluster)


def expected_limits(cluster: RealCluster, claim_name: str) -> dict[str, str]:
    """HAMi-core's variables for the claim's allocation: its GPUs in PCI order, each GPU's consumed
    memory in whole MiB and its cores when a real limit (0 and 100 mean none to HAMi-core)."""
    allocated = cluster.get("resourceclaim", claim_name, "-n", NAMESPACE)["status"]["allocation"]
    bus = {d["name"]: attribute(d, PCI_BUS_ID) for d in gpu_devices(cluster)}
    used: dict[str, tuple[int, int]] = {}
    for result in allocated["devices"]["results"]:
        consumed = result["consumedCapacity"]
        memory, cores = used.get(result["device"], (0, 0))
        used[result["device"]] = (memory + parse_bytes(consumed["memory"]), cores + int(consumed["cores"]))
    limits: dict[str, str] = {}
    for ordinal, device in enumerate(sorted(used, key=lambda name: bus[name])):
        memory, cores = used[device]
        limits[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = f"{memory // MIB}m"
        if 0 < cores < 100:
            limits[f"CUDA_DEVICE_SM_LIMIT_{ordinal}"] = str(cores)
    return limits


def devices_of(cluster: RealCluster, claim_name: str) -> list[tuple[str, str]]:
    """(request, device) of each allocation result, sorted."""
    allocated = cluster.get("resourceclaim", claim_name, "-n", NAMESPACE)["status"]["allocation"]
    return sorted((r["request"], r["device"]) for r in allocated["devices"]["results"])


def assert_preloaded_by_our_spec(view: ContainerView, pod_name: str) -> None:
    """The loader, not the environment, preloaded the library from the path HAMi-core expects."""
    assert view.preload == CONTAINER_LIB, view
    assert view.record["library"] == CONTAINER_LIB
    assert view.record["ld.so.preload"] == CONTAINER_LIB
    assert "LD_PRELOAD" not in view.record, "preloaded through /etc/ld.so.preload, not LD_PRELOAD"
    assert view.record["hostname"] == pod_name
    assert view.record["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == view.cache
    assert view.record.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", "CUDA must number GPUs as the limits do"
    assert "CUDA_VISIBLE_DEVICES" not in view.record, "it breaks HAMi-core's index mapping"


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[ChartDriver]:
    """The chart with HAMi-core installed from the stand-in image; values-local.yaml again after."""
    assert isinstance(driver, ChartDriver)
    for tool in ("gcc", "podman"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed to build the HAMi-core stand-in (make test installs it)")
    standin = build_standin(real_cluster, VERSION)
    lock = Path("/tmp/vgpulock")
    lock_existed = lock.exists()
    try:
        upgraded(real_cluster, driver, "hami-core", *standin.values())
        yield driver
    finally:
        clean(real_cluster)
        upgraded(real_cluster, driver, "simulated")
        shutil.rmtree(standin.host_dir, ignore_errors=True)
        if not lock_existed and lock.is_dir() and not any(lock.iterdir()):
            lock.rmdir()


@pytest.fixture
def workloads(real_cluster: RealCluster, chart: ChartDriver) -> Iterator[RealCluster]:
    """Each test's pods and claims are gone (and unprepared) before the next test."""
    try:
        yield real_cluster
    finally:
        clean(real_cluster)


# --- tests ----------------------------------------------------------------------------------------


def test_the_installer_puts_the_library_and_its_version_on_the_node(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    host_dir = real_cluster.state_dir / "hami-core"
    assert (host_dir / "libvgpu.so").read_bytes()[:4] == b"\x7fELF"
    assert (host_dir / "libvgpu.so.version").read_text() == f"{VERSION}\n"
    assert not [p.name for p in host_dir.iterdir() if p.name.startswith(".")], "no temporary file left"
    assert f"installed HAMi-core {VERSION}" in install_log(real_cluster, chart) or (
        f"already HAMi-core {VERSION}" in install_log(real_cluster, chart)
    )
    assert Path("/tmp/vgpulock").is_dir(), "the CDI specs of shares mount it"
    assert Path("/tmp/vgpulock").stat().st_mode & 0o777 == 0o777


def test_slices_say_hami_core_enforces_shares_and_its_version(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    assert isolation(real_cluster) == {"hami-core"}
    devices = gpu_devices(real_cluster)
    assert {attribute(d, HAMI_CORE_VERSION_ATTRIBUTE) for d in devices} == {VERSION.removeprefix("v")}


def test_a_share_is_preloaded_with_its_limits_and_one_cache_file(workloads: RealCluster) -> None:
    cluster = workloads
    apply(cluster, claim("share", request("gpu", SHARES, memory="3Gi", cores="30")), pod("share", "share"))
    running(cluster, "share")
    view = preloaded(cluster, "share")
    assert_preloaded_by_our_spec(view, "share")
    assert (
        view.limits()
        == expected_limits(cluster, "share")
        == {
            "CUDA_DEVICE_MEMORY_LIMIT_0": "3072m",
            "CUDA_DEVICE_SM_LIMIT_0": "30",
        }
    )
    assert {k: v for k, v in view.env.items() if k.startswith("CUDA_DEVICE_")} == {
        k: v for k, v in view.record.items() if k.startswith("CUDA_DEVICE_")
    }, "the record is the container's own environment"
    assert view.cache_files() == [view.cache.rsplit("/", 1)[1]], "one cache file, the one the env names"
    assert view.files[view.cache_files()[0]][0] == "666", "any UID of the container opens it"
    assert view.vgpulock, "/tmp/vgpulock is mounted for old libraries"
    assert view.library


def test_a_two_gpu_claim_gets_each_gpus_limits_in_pci_order(workloads: RealCluster) -> None:
    """count 2 on the binpack class, then two requests pinned so that request order is not PCI order."""
    cluster = workloads
    pair = claim("pair", request("gpu", SHARES, count=2, memory="2Gi", cores="20"))
    apply(cluster, pair, pod("pair", "pair"))
    running(cluster, "pair")
    view = preloaded(cluster, "pair")
    assert_preloaded_by_our_spec(view, "pair")
    assert len({device for _, device in devices_of(cluster, "pair")}) == 2
    assert (
        view.limits()
        == expected_limits(cluster, "pair")
        == {
            "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m",
            "CUDA_DEVICE_SM_LIMIT_0": "20",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
            "CUDA_DEVICE_SM_LIMIT_1": "20",
        }
    )

    # The larger share on the GPU with the higher PCI bus id, and asked for first.
    apply(
        cluster,
        claim("ordered", request("big", SHARES, index=3, memory="5Gi", cores="50"),
              request("small", SHARES, index=2, memory="1Gi", cores="10")),
        pod("ordered", "ordered"),
    )  # fmt: skip
    running(cluster, "ordered")
    view = preloaded(cluster, "ordered")
    assert devices_of(cluster, "ordered") == [("big", "gpu-3"), ("small", "gpu-2")]
    assert (
        view.limits()
        == expected_limits(cluster, "ordered")
        == {
            "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m",  # gpu-2: the lower bus id is CUDA device 0
            "CUDA_DEVICE_SM_LIMIT_0": "10",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "5120m",
            "CUDA_DEVICE_SM_LIMIT_1": "50",
        }
    )


def test_two_pods_on_one_card_each_have_their_own_limits_and_cache(workloads: RealCluster) -> None:
    cluster = workloads
    apply(
        cluster,
        claim("tenant-a", request("gpu", SHARES, index=0, memory="2Gi", cores="25")),
        claim("tenant-b", request("gpu", SHARES, index=0, memory="4Gi", cores="40")),
        pod("tenant-a", "tenant-a"),
        pod("tenant-b", "tenant-b"),
    )
    running(cluster, "tenant-a")
    running(cluster, "tenant-b")
    a, b = preloaded(cluster, "tenant-a"), preloaded(cluster, "tenant-b")
    assert devices_of(cluster, "tenant-a") == devices_of(cluster, "tenant-b") == [("gpu", "gpu-0")]
    assert a.limits() == {"CUDA_DEVICE_MEMORY_LIMIT_0": "2048m", "CUDA_DEVICE_SM_LIMIT_0": "25"}
    assert b.limits() == {"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT_0": "40"}
    assert len(a.cache_files()) == len(b.cache_files()) == 1
    a_cache, b_cache = a.files[a.cache_files()[0]][1], b.files[b.cache_files()[0]][1]
    assert a_cache != b_cache, "each container has its own cache file (HAMi-core freezes limits in it)"
    for view, name in ((a, "tenant-a"), (b, "tenant-b")):
        records = [f for f in view.files if f.startswith("hami-core-standin.")]
        hosts = {
            cluster.kubectl("exec", "-n", NAMESPACE, name, "--", "sed", "-n", "s/^hostname=//p",
                            f"{view.cache.rsplit('/', 1)[0]}/{record}").strip()
            for record in records
        }  # fmt: skip
        assert hosts == {name}, f"only {name}'s processes use its cache directory: {hosts}"


def test_a_whole_card_gets_no_preload_limits_or_cache(workloads: RealCluster) -> None:
    cluster = workloads
    apply(cluster, claim("whole", request("gpu", WHOLE, cores="100")), pod("whole", "whole"))
    running(cluster, "whole")
    view = inspect(cluster, "whole")
    assert view.cache == "" and not view.files and not view.record, view
    assert view.preload is None, "no /etc/ld.so.preload: the library is not loaded at all"
    assert not view.library and not view.vgpulock
    assert not [k for k in view.env if k.startswith(("CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM"))], view.env
    log = cluster.kubectl("logs", "-n", NAMESPACE, "whole")
    assert "standin=1" not in log, "a preloaded stand-in without a cache file reports on stderr"


def test_an_unreachable_image_never_blocks_the_plugin_and_the_library_is_picked_up_later(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    """HAMi's image from a registry the node cannot reach (an air-gapped node): only the installer
    waits in ImagePullBackOff, the plugin runs and publishes every GPU unenforced (``simulated``
    here; ``none`` on real GPUs, tests/cluster/test_gpu_nodes.py). Pointing the installer at an
    image it can have (the mirror, here the imported stand-in) then switches the node to HAMi-core
    without restarting the plugin."""
    standin = build_standin(real_cluster, VERSION)
    late = real_cluster.state_dir / "hami-core-late"
    shutil.rmtree(late, ignore_errors=True)
    try:
        upgraded(real_cluster, chart, "simulated", *standin.values(late, UNREACHABLE), wait=False)
        assert len(gpu_devices(real_cluster)) == 4, "every GPU published"
        reason: str = wait_for(
            lambda: waiting_reason(chart.pods(INSTALLER)[0]) if chart.pods(INSTALLER) else None,
            60, "the installer's pull failing", interval=1,
        )  # fmt: skip
        assert reason in ("ErrImagePull", "ImagePullBackOff"), reason

        def new_plugin() -> dict[str, Any] | None:
            pods = chart.pods(PLUGIN)
            args = pods[0]["spec"]["containers"][0]["args"] if len(pods) == 1 else []
            return pods[0] if f"--hami-core-lib={late}/libvgpu.so" in args and ready(pods[0]) else None

        plugin: dict[str, Any] = wait_for(new_plugin, 120, "the new values' plugin pod ready", interval=1)
        assert plugin["status"]["phase"] == "Running"
        assert isolation(real_cluster) == {"simulated"}, "published by this pod, unenforced"
        assert "initContainerStatuses" not in plugin["status"], "the plugin's pod never pulls HAMi's image"
        assert not (late / "libvgpu.so").exists()
        print(json.dumps({"installer": reason, "plugin": plugin["status"]["phase"],
                          "isolation": sorted(isolation(real_cluster))}))  # fmt: skip

        upgraded(real_cluster, chart, "hami-core", *standin.values(late))
        (same,) = chart.pods(PLUGIN)
        assert same["metadata"]["uid"] == plugin["metadata"]["uid"], "picked up without a restart"
        assert {attribute(d, HAMI_CORE_VERSION_ATTRIBUTE) for d in gpu_devices(real_cluster)} == {
            VERSION.removeprefix("v")
        }
        assert "HAMi-core changed: isolation simulated -> hami-core" in chart.log(PLUGIN)
        assert (late / "libvgpu.so.version").read_text() == f"{VERSION}\n"
    finally:
        upgraded(real_cluster, chart, "hami-core", *standin.values())
        shutil.rmtree(late, ignore_errors=True)


def test_a_library_older_than_v2_9_0_is_refused(real_cluster: RealCluster, chart: ChartDriver) -> None:
    """Last: the plugin keeps the library out of every spec and says why; the module restores after."""
    old = build_standin(real_cluster, TOO_OLD)
    upgraded(real_cluster, chart, "simulated", *old.values())  # no library in use
    assert (old.host_dir / "libvgpu.so.version").read_text() == f"{TOO_OLD}\n"
    assert {attribute(d, HAMI_CORE_VERSION_ATTRIBUTE) for d in gpu_devices(real_cluster)} == {None}

    def refusal() -> str | None:
        lines = [line for line in chart.log(PLUGIN).splitlines() if "older than v2.9.0" in line]
        return lines[-1] if lines else None

    line: str = wait_for(refusal, 30, "the plugin's line refusing the library", interval=1)
    assert TOO_OLD in line
    try:
        share = claim("share", request("gpu", SHARES, memory="1Gi", cores="10"))
        apply(real_cluster, share, pod("share", "share"))
        running(real_cluster, "share")
        view = inspect(real_cluster, "share")
        assert view.preload is None and not view.library and not view.record, view
    finally:
        clean(real_cluster)
