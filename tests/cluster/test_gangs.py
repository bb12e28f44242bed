"""Gangs on the real cluster (issue 38): two 4-GPU training gangs on 6 free GPUs.

Three simulated nodes of 2 GPUs each (dev/hami_dra_dev/cluster/fakenodes.py, publishing our
driver's devices, so our controller places pods there; nothing runs the pods, so a member counts
as running once kube-scheduler bound it with its claim allocated) and scheduler-plugins'
``PodGroup`` CRD (a minimal copy: only its group, kind and the two spec fields we read). Two
gangs of 4 workers, each worker one whole GPU, each gang a PodGroup with minMember 4, created
together: one gang is placed whole, the other holds no device and every member says why, and it
is placed when the first one ends. Then the controller is killed mid-gang (between a gang's
allocation writes and its gates, a window tests/cluster/refusal.py holds open): its successor
releases a gang that can no longer reach its minimum and completes one that still fits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.contract import ALLOCATED_CONDITION
from dra_driver.controller.gang_refs import POD_GROUP_LABEL
from hami_dra_dev.cluster.fakenodes import SIMULATED_LABEL, FakeNodes, FakeNodeSpec
from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest, HostDriver
from tests.cluster.refusal import AllocationRefusal, half_committed, refused_template
from tests.cluster.test_e2e import recipe_classes
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
NS = "gang-team"
RECIPE = "binpack"
TEMPLATE = "one-whole-gpu"
REFUSED = "one-whole-gpu-refused"
SPEC = FakeNodeSpec(count=3, gpus=2, prefix="gangtest", driver_name=manifests.DRIVER, profile="t4")
GANGS = ("train-a", "train-b")
WAIT = 150.0  # the controller looks for a newly installed CRD every 30 s, then the gang timeout

POD_GROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "names": {
            "kind": "PodGroup",
            "listKind": "PodGroupList",
            "plural": "podgroups",
            "singular": "podgroup",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "minMember": {"type": "integer"},
                                    "scheduleTimeoutSeconds": {"type": "integer"},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def apply(cluster: RealCluster, *objects: dict[str, Any]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


def pod_group(name: str, members: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"minMember": members, "scheduleTimeoutSeconds": 5},
    }


def worker(group: str, index: int, template: str = TEMPLATE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{group}-{index}", "namespace": NS, "labels": {POD_GROUP_LABEL: group}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {SIMULATED_LABEL: "true"},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def whole_gpu_request() -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": manifests.class_name(RECIPE), "count": 1}}


def whole_gpu_template() -> dict[str, Any]:
    request = whole_gpu_request()
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


@pytest.fixture
def six_gpus(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[RealCluster]:
    apply(real_cluster, POD_GROUP_CRD)
    real_cluster.kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io")
    nodes = FakeNodes(real_cluster.api_client, SPEC)
    nodes.create()
    real_cluster.kubectl("create", "namespace", NS)
    try:
        apply(real_cluster, *recipe_classes(driver, RECIPE), whole_gpu_template())
        yield real_cluster
    finally:
        # Nothing runs the pods of simulated nodes: delete them at once; the controller then
        # releases their claims, which go with their pods.
        real_cluster.kubectl(
            "delete", "pods", "--all", "-n", NS, "--grace-period=0", "--force", "--wait=true"
        )
        wait_for(lambda: not real_cluster.get("resourceclaims", "-n", NS)["items"], 90, "the claims released")
        real_cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")
        nodes.delete()
        real_cluster.kubectl("delete", "crd", "podgroups.scheduling.x-k8s.io", "--wait=true")


def pods(cluster: RealCluster, group: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("pods", "-n", NS, "-l", f"{POD_GROUP_LABEL}={group}")["items"]
    return items


def allocated_claims(cluster: RealCluster, group: str) -> list[str]:
    """The member pods of ``group`` whose claim is allocated."""
    claims = cluster.get("resourceclaims", "-n", NS)["items"]
    owners = {
        ref["name"]
        for claim in claims
        if (claim.get("status") or {}).get("allocation")
        for ref in claim["metadata"].get("ownerReferences") or ()
        if ref.get("kind") == "Pod"
    }
    return sorted(name for name in owners if name.startswith(f"{group}-"))


def placed(cluster: RealCluster, group: str, size: int = 4) -> bool:
    """Every member bound to a simulated node with its claim allocated."""
    members = pods(cluster, group)
    bound = [p for p in members if str(p["spec"].get("nodeName", "")).startswith(f"{SPEC.prefix}-")]
    return len(members) == size and len(bound) == size and len(allocated_claims(cluster, group)) == size


def released(cluster: RealCluster, group: str, size: int) -> bool:
    """``size`` members, every one gated, none with an allocated claim."""
    members = pods(cluster, group)
    gated = [p for p in members if p["spec"].get("schedulingGates")]
    return len(members) == size == len(gated) and not allocated_claims(cluster, group)


def says_why(cluster: RealCluster, group: str) -> list[str] | None:
    """Each member's condition message, once every member is gated with our condition False."""
    messages = []
    for member in pods(cluster, group):
        gates = member["spec"].get("schedulingGates") or []
        conditions = (member.get("status") or {}).get("conditions") or ()
        condition = next((c for c in conditions if c["type"] == ALLOCATED_CONDITION), None)
        if not gates or condition is None or condition["status"] != "False":
            return None
        messages.append(condition["message"])
    return messages if len(messages) == 4 else None


def test_two_4_gpu_gangs_on_6_gpus_one_runs_the_other_holds_nothing_and_says_why(
    six_gpus: RealCluster,
) -> None:
    cluster = six_gpus
    apply(cluster, *(pod_group(group) for group in GANGS))
    apply(cluster, *(worker(group, index) for index in range(4) for group in GANGS))
    first = wait_for(lambda: next((g for g in GANGS if placed(cluster, g)), None), WAIT, "one gang placed")
    (second,) = [group for group in GANGS if group != first]
    messages = wait_for(lambda: says_why(cluster, second), WAIT, f"{second}'s members say why they wait")
    assert all("2 of 4 members placeable now, needs 4" in message for message in messages), messages
    assert allocated_claims(cluster, second) == []  # it holds no device
    described = cluster.kubectl("describe", "pod", f"{second}-0", "-n", NS)
    assert "FailedAllocation" in described and "needs 4" in described
    nodes = {p["spec"]["nodeName"] for p in pods(cluster, first)}
    assert len(nodes) == 2, nodes  # binpack: two nodes full, the third one free
    # The first gang ends: the second one is placed whole.
    cluster.kubectl(
        "delete",
        "pods",
        "-n",
        NS,
        "-l",
        f"{POD_GROUP_LABEL}={first}",
        "--grace-period=0",
        "--force",
        "--wait=true",
    )
    wait_for(lambda: placed(cluster, second), WAIT, f"{second} placed once {first} ended")


@pytest.fixture
def host_driver(driver: DriverUnderTest) -> HostDriver:
    """The driver as host processes (skipped for the chart before the nodes are made)."""
    if not isinstance(driver, HostDriver):
        pytest.skip("the controller is killed as a host process (the fault suite's way)")
    return driver


def test_a_controller_killed_mid_gang_releases_an_incomplete_gang_and_completes_one_that_fits(
    host_driver: HostDriver, six_gpus: RealCluster
) -> None:
    """Two gangs of 3 (one GPU each) on the 6 GPUs, each held half committed (its third member's
    allocation refused) when the controller is killed: the first loses its refused member
    meanwhile, so its successor releases the other two (no device held); the refusal of the
    second is lifted, so it is completed. The first's member comes back and it is placed whole:
    the released GPUs were not lost, and no GPU is given twice."""
    driver = host_driver
    cluster = six_gpus
    refusal = AllocationRefusal(cluster, NS)
    apply(cluster, refused_template(REFUSED, NS, whole_gpu_request()), *(pod_group(g, 3) for g in GANGS))
    first, second = GANGS
    refusal.install()
    try:
        for group in GANGS:
            members = [f"{group}-{index}" for index in range(3)]
            apply(cluster, *(worker(group, index, REFUSED if index == 2 else TEMPLATE) for index in range(3)))
            wait_for(
                lambda members=members: half_committed(cluster, NS, members, members[2]),
                WAIT,
                f"{group} half committed",
                0.3,
            )
            driver.kill("controller")
            if group == first:
                cluster.kubectl("delete", "pod", members[2], "-n", NS, "--grace-period=0", "--force")
                wait_for(lambda: released(cluster, first, 2), WAIT, f"{first}'s members released", 0.5)
        refusal.remove()
        wait_for(lambda: placed(cluster, second, 3), WAIT, f"{second} completed")
        assert released(cluster, first, 2)
    finally:
        refusal.remove()
    apply(cluster, worker(first, 2))
    wait_for(lambda: placed(cluster, first, 3), WAIT, f"{first} placed once its member came back")
    devices = [
        (result["pool"], result["device"])
        for claim in cluster.get("resourceclaims", "-n", NS)["items"]
        for result in claim["status"]["allocation"]["devices"]["results"]
    ]
    assert len(devices) == 6 and len(set(devices)) == 6, devices
