"""HAMi workloads on the real cluster: the seed's Pod manifest unchanged, Deployments, no leaked claim.

The real kube-apiserver evaluates the chart's matchCondition (CEL over the containers' resources)
and namespaceSelector, the real kube-controller-manager stamps the claims from our templates,
owned by their pods, and garbage-collects them with the pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.hami_annotation import ANNOTATION as ALLOCATED
from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL, TRANSLATED_ANNOTATION
from hami_dra_dev.cluster.layout import CDI_DIR
from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, DRIVER, ChartDriver, DriverUnderTest
from tests.cluster.test_e2e import POD_TIMEOUT, device_of
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
TEAM = "hami-team"

#: The seed's example (../shared/seeds/composable-gpu-scheduling-policies.txt, step 2), verbatim.
SEED_POD = """apiVersion: v1
kind: Pod
metadata:
  name: inference-latency-tier
  annotations:
    hami.io/gpu-scheduler-policy: "mutex,binpack,numa"
spec:
  containers:
    - name: app
      image: ubuntu:22.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 1 # 1 vGPU
          nvidia.com/gpumem: 8000 # with an 8000 MiB memory slice
"""


@pytest.fixture
def team(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[RealCluster]:
    """A namespace that opted in to HAMi translation; deleted (with everything in it) afterwards."""
    if not driver.provides_recipe_classes:
        # The class translated claims use by default: the one named like the driver, which the
        # chart installs (deviceClasses[0]); the host-process driver has no chart.
        default = manifests.device_class("spread")
        default["metadata"]["name"] = DRIVER
        real_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(default))
    real_cluster.kubectl("create", "namespace", TEAM)
    real_cluster.kubectl("label", "namespace", TEAM, f"{NAMESPACE_LABEL}=enabled")
    try:
        yield real_cluster
    finally:
        real_cluster.kubectl("delete", "namespace", TEAM, "--wait=true", "--timeout=120s")


def claims(cluster: RealCluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("resourceclaims", "-n", TEAM)["items"]
    return items


def templates(cluster: RealCluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("resourceclaimtemplates", "-n", TEAM)["items"]
    return items


def claim_of(cluster: RealCluster, pod: str) -> dict[str, Any] | None:
    statuses = (cluster.get("pod", pod, "-n", TEAM).get("status") or {}).get("resourceClaimStatuses") or []
    name = statuses[0].get("resourceClaimName") if statuses else None
    return cluster.get("resourceclaim", name, "-n", TEAM) if name else None


def cdi_spec(uid: str) -> Path:
    return CDI_DIR / CdiNames(DRIVER).spec_file_name(uid)


def test_the_seed_pod_unchanged_is_placed_and_limited_as_hami_would(team: RealCluster) -> None:
    team.kubectl("apply", "-n", TEAM, "-f", "-", stdin=SEED_POD)
    pod = team.get("pod", "inference-latency-tier", "-n", TEAM)
    translated = json.loads(pod["metadata"]["annotations"][TRANSLATED_ANNOTATION])
    template = translated["app"]["template"]
    assert template.startswith("hami-1gpu-8000mi-0cores-"), "the pod's own template"
    claim = wait_for(
        lambda: (c := claim_of(team, "inference-latency-tier")) and device_of(c) and c,
        POD_TIMEOUT,
        "allocated",
    )
    assert device_of(claim) == "gpu-0", "an idle node: mutex keeps every card, binpack ties, numa, index"
    assert claim["metadata"]["ownerReferences"][0]["name"] == "inference-latency-tier"
    made = team.get("resourceclaimtemplate", template, "-n", TEAM)
    assert made["metadata"]["ownerReferences"][0]["name"] == "inference-latency-tier", (
        "made by the controller from the stored pod, owned by it"
    )
    # The kubelet prepares the claim before it pulls the image (ubuntu:22.04 is not on this
    # offline node, so the container itself never starts): HAMi-core's limit is in the CDI spec.
    path = cdi_spec(claim["metadata"]["uid"])
    text = wait_for(lambda: path.read_text() if path.is_file() else None, POD_TIMEOUT, "the CDI spec")
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8000m" in text
    annotation = wait_for(
        lambda: team.get("pod", "inference-latency-tier", "-n", TEAM)["metadata"]["annotations"].get(
            ALLOCATED
        ),
        30,
        "hami.io/vgpu-devices-allocated",
    )
    uuid, vendor, memory, cores = annotation.rstrip(":;").split(",")
    assert (vendor, memory, cores) == ("NVIDIA", "8000", "0") and uuid.startswith("GPU-")


def deployment(replicas: int) -> dict[str, Any]:
    labels = {"app": "hami-replicas"}
    container = {
        "name": "app",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "env | grep CUDA_DEVICE_MEMORY_LIMIT; sleep 86400"],
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hami-replicas", "namespace": TEAM},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
            },
        },
    }


def test_a_deployment_gets_one_claim_per_replica_and_none_after_scaling_to_zero(team: RealCluster) -> None:
    team.kubectl("apply", "-f", "-", stdin=json.dumps(deployment(3)))
    team.kubectl("rollout", "status", "deployment/hami-replicas", "-n", TEAM, f"--timeout={POD_TIMEOUT:.0f}s")
    allocated = [c for c in claims(team) if device_of(c)]
    assert len(allocated) == 3
    assert {c["metadata"]["ownerReferences"][0]["kind"] for c in allocated} == {"Pod"}
    pods = team.get("pods", "-n", TEAM, "-l", "app=hami-replicas")["items"]
    logs = team.kubectl("logs", "-n", TEAM, pods[0]["metadata"]["name"])
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=2000m" in logs
    assert len(templates(team)) == 3, "one template per replica, each owned by its pod"
    team.kubectl("scale", "deployment/hami-replicas", "-n", TEAM, "--replicas=0")
    wait_for(lambda: not claims(team), 90, "every replica's claim gone with its pod")
    wait_for(lambda: not templates(team), 90, "every replica's template gone with its pod")


@pytest.mark.parametrize("driver", ["chart"], indirect=True)
def test_a_pod_deleted_while_the_webhook_is_down_leaves_no_claim(
    team: RealCluster, driver: DriverUnderTest
) -> None:
    assert isinstance(driver, ChartDriver)
    team.kubectl("apply", "-f", "-", stdin=json.dumps(deployment(1)))
    team.kubectl("rollout", "status", "deployment/hami-replicas", "-n", TEAM, f"--timeout={POD_TIMEOUT:.0f}s")
    assert len(claims(team)) == 1
    webhook = "deployment/hami-dra-webhook"
    # Restored to what it was (the chart runs 2): a later module counts the chart's pods.
    current = json.loads(team.kubectl("get", webhook, "-n", CHART_NAMESPACE, "-o", "json"))
    replicas = current["spec"]["replicas"]
    team.kubectl("scale", webhook, "-n", CHART_NAMESPACE, "--replicas=0")
    try:
        wait_for(lambda: not driver.pods("webhook"), 60, "the webhook gone")
        team.kubectl("delete", "deployment", "hami-replicas", "-n", TEAM, "--wait=true")
        wait_for(lambda: not claims(team), 90, "the claim garbage-collected with its pod")
    finally:
        team.kubectl("scale", webhook, "-n", CHART_NAMESPACE, f"--replicas={replicas}")
        team.kubectl("rollout", "status", webhook, "-n", CHART_NAMESPACE, "--timeout=90s")


def hami_pod(name: str, limits: dict[str, Any], policy: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "command": ["sleep", "86400"],
                    "resources": {"limits": limits},
                }
            ],
        },
    }
    if policy:
        body["metadata"]["annotations"] = {"hami.io/gpu-scheduler-policy": policy}
    return body


def test_the_seed_lab_written_with_hami_resources_gives_gpu_2(team: RealCluster) -> None:
    placed = [
        ("tenant-a", "binpack", "gpu-0"),
        ("tenant-b", "binpack", "gpu-0"),
        ("tenant-c", "spread", "gpu-1"),
        ("latency-tier", "mutex,binpack", "gpu-2"),
    ]
    for name, policy, expected in placed:
        team.kubectl(
            "apply", "-f", "-", stdin=json.dumps(hami_pod(name, {"nvidia.com/gpumem": 1000}, policy))
        )
        team.kubectl(
            "wait", "--for=condition=Ready", f"pod/{name}", "-n", TEAM, f"--timeout={POD_TIMEOUT:.0f}s"
        )
        claim = claim_of(team, name)
        assert claim is not None and device_of(claim) == expected, (name, claim and device_of(claim))
