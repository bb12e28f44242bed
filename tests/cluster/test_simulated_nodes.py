"""The benchmark's simulated nodes (dev/hami_dra_dev/cluster/fakenodes.py) on the real control plane.

``make bench-cluster`` measures kube-scheduler and our controller on 100 of them; this checks on
the real cluster that they are what the figures assume: Ready nodes with renewed Leases and the
slices our kubelet plugin publishes, onto which the real kube-scheduler binds a pod whose claim it
allocates with consumable capacity. The nodes use a driver name of their own, so the driver under
test (if one runs) leaves them alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.contract import policy_taint_key
from hami_dra_dev.cluster.fakenodes import LEASE_NAMESPACE, FakeNodes, FakeNodeSpec
from tests.cluster.conftest import RealCluster
from tests.kube_validate import validate_strict
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = "sim.example.com"
SPEC = FakeNodeSpec(count=3, gpus=2, prefix="simtest", driver_name=DRIVER)
#: What lets kube-scheduler's first fit use the devices (the plugin keeps it off them otherwise).
TOLERATE_POLICY_TAINT = {"key": policy_taint_key(DRIVER), "operator": "Exists", "effect": "NoSchedule"}


def claim_and_pod(cluster: RealCluster) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "simtest"},
             "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}},
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "simtest", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "simtest", "capacity": {"requests": {"memory": "10Gi"}},
                 "tolerations": [TOLERATE_POLICY_TAINT],
             }}]}}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "simtest", "namespace": "default"},
             "spec": {"terminationGracePeriodSeconds": 0,
                      "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                      "resources": {"claims": [{"name": "gpu"}]}}],
                      "resourceClaims": [{"name": "gpu", "resourceClaimName": "simtest"}]}},
        ]}))  # fmt: skip


def test_simulated_nodes_are_ready_renew_leases_and_take_pods_from_kube_scheduler(
    real_cluster: RealCluster,
) -> None:
    nodes = FakeNodes(real_cluster.api_client, SPEC)
    nodes.create()
    try:
        for name in nodes.names:
            node = real_cluster.get("node", name)
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert ready and ready[0]["status"] == "True", node["status"]
        slices = real_cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
        assert sorted(s["spec"]["nodeName"] for s in slices) == nodes.names
        for item in slices:
            validate_strict(item)
            assert [d["name"] for d in item["spec"]["devices"]] == ["gpu-0", "gpu-1"]
            assert item["metadata"]["ownerReferences"][0]["name"] == item["spec"]["nodeName"]

        def renewed() -> str:
            return str(real_cluster.get("lease", "-n", LEASE_NAMESPACE, nodes.names[0])["spec"]["renewTime"])

        first = renewed()
        wait_for(lambda: renewed() != first, 40, "the simulated node's Lease renewed")
        claim_and_pod(real_cluster)
        bound = wait_for(lambda: real_cluster.get("pod", "simtest")["spec"].get("nodeName"), 60, "pod bound")
        assert bound in nodes.names
        allocation: Any = real_cluster.get("resourceclaim", "simtest")["status"]["allocation"]
        (result,) = allocation["devices"]["results"]
        assert result["pool"] == bound and result["driver"] == DRIVER
        assert result["consumedCapacity"]["memory"] == "10Gi"
    finally:
        # No kubelet confirms a graceful deletion on a simulated node: delete at once (kubectl
        # turns --grace-period=0 into 1 s unless --force is given).
        real_cluster.kubectl(
            "delete", "pod", "simtest", "--ignore-not-found", "--grace-period=0", "--force", "--wait=true"
        )
        real_cluster.kubectl("delete", "resourceclaim", "simtest", "--ignore-not-found", "--wait=true")
        real_cluster.kubectl("delete", "deviceclass", "simtest", "--ignore-not-found")
        nodes.delete()
    assert not real_cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
    assert not [n for n in real_cluster.get("nodes")["items"] if n["metadata"]["name"].startswith("simtest-")]
