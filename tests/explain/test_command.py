"""``hami-dra explain`` through a kubeconfig against the sandbox API server: the command lists what
the controller's informers list (nodes, pods, quotas included) and decides with its allocator."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Kube,
    Obj,
)
from dra_driver.quantity import MIB
from dra_driver.resource.slice_builder import build_resource_slices
from hami_dra_dev.sandbox import SandboxServer
from tests.api_objects import allocated_claim
from tests.controller.harness import DRIVER, claim, device_class, pod, request

TEAM = "team"


def node(name: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }


@pytest.fixture
def kube(sandbox_client: Any) -> Kube:
    """node-1 (one T4, 4000Mi of it held by ``held``), node-2 tainted (one T4, free), our class,
    a 6000Mi GpuQuota in the team namespace."""
    kube = Kube(sandbox_client)
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": TEAM}})
    kube.create(NODES, None, node("node-1"))
    kube.create(NODES, None, node("node-2", taints=[{"key": "maintenance", "effect": "NoSchedule"}]))
    for name in ("node-1", "node-2"):
        for item in build_resource_slices(
            profile_gpus("t4", node_name=name, gpus=1), node_name=name, driver_name=DRIVER
        ):
            kube.create(RESOURCE_SLICES, None, item)
    kube.create(DEVICE_CLASSES, None, device_class(DRIVER))
    held = allocated_claim(TEAM, "held", "node-1", [(0, 4000 * MIB, 0)])
    status = held.pop("status")
    created = kube.create(RESOURCE_CLAIMS, TEAM, held)
    created["status"] = status
    kube.update(RESOURCE_CLAIMS, created, status=True)
    kube.create(GPU_QUOTAS, TEAM, {
        "apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuQuota",
        "metadata": {"name": "team", "namespace": TEAM}, "spec": {"hard": {"memory": "6000Mi"}},
    })  # fmt: skip
    return kube


def gated_pod(kube: Kube, name: str, memory: str) -> None:
    body = claim(name, request(memory=memory))
    body["metadata"]["namespace"] = TEAM
    kube.create(RESOURCE_CLAIMS, TEAM, body)
    spec = pod(name, {"gpu": f"claim:{name}"})
    spec["metadata"]["namespace"] = TEAM
    kube.create(PODS, TEAM, spec)


def explained(sandbox: SandboxServer, capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    kubeconfig = ["--kubeconfig", str(sandbox.kubeconfig_path), "--context", "sandbox"]
    capsys.readouterr()
    assert main(["explain", f"pod/{name}", "-n", TEAM, *kubeconfig, "-o", "json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_a_pod_past_the_namespaces_quota_is_refused_for_the_quota(
    sandbox: SandboxServer, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    gated_pod(kube, "over", "4000Mi")
    document = explained(sandbox, capsys, "over")
    assert document["state"] == "pending"
    assert document["now"]["reason"] == "GpuQuotaExceeded"
    assert "used 4000Mi + requested 4000Mi > hard 6000Mi" in document["now"]["message"]
    # node-2 is tainted: the placement the quota refused is on node-1, whose node fit says nothing.
    assert document["nodesRefused"] == [{"node": "node-2", "reason": "TaintToleration"}]
    assert [request["node"] for request in document["requests"]] == ["node-1"]


def test_a_pod_within_the_quota_fits_now(
    sandbox: SandboxServer, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    gated_pod(kube, "small", "1000Mi")
    document = explained(sandbox, capsys, "small")
    assert document["now"] is None and document["note"].startswith("it fits now")
    (decision,) = document["requests"]
    assert decision["node"] == "node-1" and decision["devices"] == ["gpu-0"]
