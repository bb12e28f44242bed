"""Static MIG on the real cluster (issue 37): a mock H100 node whose second card is in MIG mode.

The node is this machine with a mock driver root (``tests/nvidia_layouts.py``) whose profile puts
GPU 1 in MIG mode with a 3g.40gb and a 1g.10gb instance: the mock NVML library answers NVML's MIG
calls, the root holds ``proc/driver/nvidia-caps/mig-minors`` and the instances'
``/dev/nvidia-caps`` nodes, and the real ``nvidia-ctk`` writes the host layout's spec with its MIG
devices. The chart runs the plugin with ``source=nvml`` (as in test_gpu_nodes.py). The node
publishes GPU 0 whole and GPU 1 only as its two MIG devices; a pod whose claim asks the
``mig.gpu.hami.io`` class (examples/mig/deviceclass.yaml) for a 1g profile is allocated by
kube-scheduler, prepared by our plugin, and runs with exactly that MIG device's nodes: its card's
``/dev/nvidia1`` and the instance's two capabilities, no other card's node and no other instance's.

The module's name sorts before test_helm_install.py, whose last test uninstalls the chart.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devices.mig import mig_caps_minors
from dra_driver.devices.simulated import DevicesFileSource
from hami_dra_dev.cluster.layout import CDI_DIR, NODE_NAME
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DRIVER, ChartDriver, DriverUnderTest, reset_workloads
from tests.cluster.tenancy import manifest
from tests.cluster.test_gpu_nodes import GPU_LABEL, GpuNode
from tests.devices.mock_profiles import profile_from_gpus
from tests.nvidia_layouts import SPEC_FILES, mock_driver_root, require_toolkit

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

REPO = Path(__file__).resolve().parents[2]
MIG_CLASS = REPO / "examples" / "mig" / "deviceclass.yaml"
#: What the node publishes: GPU 0 whole, GPU 1 as its MIG devices (gpu-<minor>-mig-<gi>-<ci>).
PUBLISHED = ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-13-0"]


@pytest.fixture(scope="module")
def mig_node(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[GpuNode]:
    assert isinstance(driver, ChartDriver)
    require_toolkit(required=True)
    cluster = real_cluster
    reset_workloads(cluster)
    base = cluster.state_dir / "nvidia-mig-driver-root"
    base.mkdir(parents=True, exist_ok=True)
    devices = base / "devices.yaml"
    devices.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"index": 0, "profile": "h100-80gb"},
                    {"index": 1, "profile": "h100-80gb", "migDevices": ["3g.40gb", "1g.10gb@6"]},
                ]
            }
        )
    )
    gpus = DevicesFileSource(devices, node_name=NODE_NAME).discover()
    profile = base / "profile.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040))
    )
    root = mock_driver_root(base / "root", profile, required=True)
    subprocess.run(["mount", "--bind", str(root.root), str(root.root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root.root)], check=True)
    node = GpuNode(cluster, driver, root)
    node.events.write_text("")
    node.use_layout("host")
    cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}=true", "--overwrite")
    cluster.kubectl("apply", "-f", str(MIG_CLASS))
    try:
        node.upgrade()
        yield node
    finally:
        cluster.kubectl(
            "delete", "pods,resourceclaims", "--all", "-n", "default", "--wait=true", "--timeout=90s"
        )
        reset_workloads(cluster)
        cluster.kubectl("delete", "-f", str(MIG_CLASS), "--ignore-not-found", "--wait=true")
        for name in set(SPEC_FILES.values()):
            (CDI_DIR / name).unlink(missing_ok=True)
        driver.upgrade()
        cluster.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}-")
        subprocess.run(["umount", str(root.root)], check=False)


def run_mig_pod(node: GpuNode, name: str, profile_prefix: str) -> None:
    selector = f'device.attributes["{DRIVER}"].profile.startsWith("{profile_prefix}")'
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.gpu.hami.io",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "command": ["sleep", "86400"],
                    "resources": {"claims": [{"name": "mig"}]},
                }
            ],
            "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
        },
    }
    node.cluster.kubectl("apply", "-f", "-", stdin=manifest(claim, pod))


def test_a_mig_card_publishes_its_mig_devices_and_a_1g_pod_gets_exactly_its_instance(
    mig_node: GpuNode,
) -> None:
    devices = mig_node.wait_devices(len(PUBLISHED))
    assert sorted(d["name"] for d in devices) == sorted(PUBLISHED), "the MIG card is never published whole"
    by_name = {d["name"]: d for d in devices}
    assert by_name["gpu-1-mig-13-0"]["attributes"]["type"] == {"string": "mig"}
    assert by_name["gpu-1-mig-13-0"]["attributes"]["profile"] == {"string": "1g.10gb"}
    run_mig_pod(mig_node, "mig-1g", "1g.")
    mig_node.wait_running("mig-1g")
    assert mig_node.allocated_device("mig-1g") == "gpu-1-mig-13-0"
    cards = mig_node.exec("mig-1g", "ls /dev | grep -E '^nvidia[0-9]+$' || true").split()
    assert cards == ["nvidia1"], f"the container sees its MIG device's card only, got {cards}"
    caps = mig_node.exec("mig-1g", "ls /dev/nvidia-caps").split()
    assert caps == sorted(f"nvidia-cap{minor}" for minor in mig_caps_minors(1, 13, 0)), caps
    # The 3g instance is still free: a second pod gets it, with its own capabilities only.
    run_mig_pod(mig_node, "mig-3g", "3g.")
    mig_node.wait_running("mig-3g")
    assert mig_node.allocated_device("mig-3g") == "gpu-1-mig-1-0"
    caps = mig_node.exec("mig-3g", "ls /dev/nvidia-caps").split()
    assert caps == sorted(f"nvidia-cap{minor}" for minor in mig_caps_minors(1, 1, 0)), caps
    for name in ("mig-1g", "mig-3g"):
        mig_node.cluster.kubectl("delete", "pod", name, "--wait=true")
        mig_node.cluster.kubectl("delete", "resourceclaim", name, "--wait=true")
