"""Static MIG on the real cluster (issue 37): a mock H100 node with two cards in MIG mode.

The node is this machine with a mock driver root (``tests/nvidia_layouts.py``) whose profile puts
GPU 1 in MIG mode with seven 1g.10gb instances and GPU 2 with one 7g.80gb instance: the mock NVML
library answers NVML's MIG calls, the root holds ``proc/driver/nvidia-caps/mig-minors`` and the
instances' ``/dev/nvidia-caps`` nodes, and the real ``nvidia-ctk`` writes the host layout's spec
with its MIG devices. The chart runs the plugin with ``source=nvml`` (as in test_gpu_nodes.py).
The node publishes GPU 0 whole and the MIG cards only as their instances. Pods whose claims ask
the chart's ``mig.gpu.hami.io`` class for a profile are gated by our webhook and placed by our
controller with the class's policy (binpack), never by kube-scheduler (the class's scheduler
fence), prepared by our plugin, and run with exactly their instance's nodes: its card's
``/dev/nvidia<minor>`` and the instance's two capabilities, no other card's and no other
instance's. Three 1g pods land on GPU 1 at slices 0, 1 and 2 (slices 4-7 stay whole), and a 7g
pod then on GPU 2.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
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

#: The chart's class of MIG instances (``migClass``), placed by our controller.
MIG_CLASS = f"mig.{DRIVER}"
#: What the node publishes: GPU 0 whole, GPUs 1 and 2 as their MIG devices (gpu-<minor>-mig-<gi>-<ci>).
PUBLISHED = ["gpu-0", *(f"gpu-1-mig-{gi}-0" for gi in range(7, 14)), "gpu-2-mig-0-0"]


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
                    {"index": 1, "profile": "h100-80gb", "migDevices": ["1g.10gb"] * 7},
                    {"index": 2, "profile": "h100-80gb", "migDevices": ["7g.80gb"]},
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
                            "deviceClassName": MIG_CLASS,
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


def caps_of(node: GpuNode, pod: str) -> list[str]:
    return node.exec(pod, "ls /dev/nvidia-caps").split()


def placed_by_our_controller(node: GpuNode, name: str) -> dict[str, Any]:
    """The claim's allocation, checked to be our controller's: whole (no shareID), with the
    class's config, and the pod's decision record naming the instance."""
    claim = node.cluster.get("resourceclaim", name)
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    (result,) = results
    assert "shareID" not in result, "a MIG instance is given out whole"
    assert f"{DRIVER}/allocation" in claim["metadata"].get("finalizers", []), "our controller's finalizer"
    pod = node.cluster.get("pod", name)
    record = json.loads(pod["metadata"]["annotations"][f"{DRIVER}/decision"])
    (request,) = record["requests"]
    assert request["devices"] == [result["device"]] and request["config"].startswith("policy=binpack")
    return result


def delete(node: GpuNode, *names: str) -> None:
    for name in names:
        node.cluster.kubectl("delete", "pod", name, "--wait=true")
        node.cluster.kubectl("delete", "resourceclaim", name, "--wait=true")


def test_mig_cards_publish_their_instances_and_a_1g_pod_gets_exactly_its_instance(mig_node: GpuNode) -> None:
    devices = mig_node.wait_devices(len(PUBLISHED))
    assert sorted(d["name"] for d in devices) == sorted(PUBLISHED), "a MIG card is never published whole"
    by_name = {d["name"]: d for d in devices}
    assert by_name["gpu-1-mig-13-0"]["attributes"]["type"] == {"string": "mig"}
    assert by_name["gpu-1-mig-13-0"]["attributes"]["profile"] == {"string": "1g.10gb"}
    run_mig_pod(mig_node, "mig-1g", "1g.")
    mig_node.wait_running("mig-1g")
    result = placed_by_our_controller(mig_node, "mig-1g")
    # binpack on an untouched card keeps its largest free placement: the 1g at slice 0 (GI 7).
    assert result["device"] == "gpu-1-mig-7-0"
    cards = mig_node.exec("mig-1g", "ls /dev | grep -E '^nvidia[0-9]+$' || true").split()
    assert cards == ["nvidia1"], f"the container sees its MIG device's card only, got {cards}"
    assert caps_of(mig_node, "mig-1g") == sorted(f"nvidia-cap{m}" for m in mig_caps_minors(1, 7, 0))
    delete(mig_node, "mig-1g")


def test_three_1g_pods_binpack_on_one_card_and_a_7g_pod_takes_the_untouched_card(mig_node: GpuNode) -> None:
    mig_node.wait_devices(len(PUBLISHED))
    names = ["mig-a", "mig-b", "mig-c"]
    for name in names:  # one after another: each placement sees the one before it
        run_mig_pod(mig_node, name, "1g.")
        mig_node.wait_running(name)
    # Slices 0, 1 and 2 of GPU 1 (GPU instances 7, 8, 9): slices 4-7 stay free for a 3g or 4g.
    assert [placed_by_our_controller(mig_node, n)["device"] for n in names] == [
        "gpu-1-mig-7-0",
        "gpu-1-mig-8-0",
        "gpu-1-mig-9-0",
    ]
    run_mig_pod(mig_node, "mig-7g", "7g.")
    mig_node.wait_running("mig-7g")
    assert placed_by_our_controller(mig_node, "mig-7g")["device"] == "gpu-2-mig-0-0"
    cards = mig_node.exec("mig-7g", "ls /dev | grep -E '^nvidia[0-9]+$' || true").split()
    assert cards == ["nvidia2"], cards
    assert caps_of(mig_node, "mig-7g") == sorted(f"nvidia-cap{m}" for m in mig_caps_minors(2, 0, 0))
    delete(mig_node, *names, "mig-7g")
