"""``hami-dra explain`` through a kubeconfig against a real kube-apiserver: the command lists what
the controller's informers list (nodes, pods, quotas included) and decides with its allocator.

The server is shared by the run (tests/apiserver_fixtures.py): each test has its own namespace,
driver name (slices, class) and node names, and explain is told the driver (``--driver-name``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Kube,
    Obj,
)
from dra_driver.quantity import MIB
from dra_driver.quota import crd
from dra_driver.resource.slice_builder import build_resource_slices
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.api_objects import allocated_claim
from tests.apiserver_fixtures import create_ready_node, install_crd
from tests.controller.harness import claim, device_class, pod, request


def node(name: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }


@dataclass(frozen=True)
class World:
    """One test's part of the shared server."""

    kube: Kube
    team: str
    driver: str

    def node(self, number: int) -> str:
        return f"{self.team}-node-{number}"


@pytest.fixture
def world(api_kube: Kube, api_namespace: str, api_driver: str) -> World:
    """node 1 (one T4, 4000Mi of it held by ``held``), node 2 tainted (one T4, free), our class,
    a 6000Mi GpuQuota in the team namespace."""
    kube, team, driver = api_kube, api_namespace, api_driver
    install_crd(kube, crd.manifest())
    world = World(kube, team, driver)
    create_ready_node(kube, node(world.node(1)))
    create_ready_node(kube, node(world.node(2), taints=[{"key": "maintenance", "effect": "NoSchedule"}]))
    for name in (world.node(1), world.node(2)):
        for item in build_resource_slices(
            profile_gpus("t4", node_name=name, gpus=1), node_name=name, driver_name=driver
        ):
            kube.create(RESOURCE_SLICES, None, item)
    kube.create(DEVICE_CLASSES, None, device_class(driver, selectors=[f'device.driver == "{driver}"']))
    held = allocated_claim(team, "held", world.node(1), [(0, 4000 * MIB, 0)], klass=driver, driver=driver)
    status = held.pop("status")
    created = kube.create(RESOURCE_CLAIMS, team, held)
    created["status"] = status
    kube.update(RESOURCE_CLAIMS, created, status=True)
    kube.create(GPU_QUOTAS, team, {
        "apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuQuota",
        "metadata": {"name": "team", "namespace": team}, "spec": {"hard": {"memory": "6000Mi"}},
    })  # fmt: skip
    return world


def gated_pod(world: World, name: str, memory: str) -> None:
    body = claim(name, request(klass=world.driver, memory=memory))
    body["metadata"]["namespace"] = world.team
    world.kube.create(RESOURCE_CLAIMS, world.team, body)
    spec = pod(name, {"gpu": f"claim:{name}"})
    spec["metadata"]["namespace"] = world.team
    world.kube.create(PODS, world.team, spec)


def explained(
    apiserver: ControlPlane, world: World, capsys: pytest.CaptureFixture[str], name: str
) -> dict[str, Any]:
    kubeconfig = ["--kubeconfig", str(apiserver.kubeconfig_path), "--driver-name", world.driver]
    capsys.readouterr()
    assert main(["explain", f"pod/{name}", "-n", world.team, *kubeconfig, "-o", "json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_a_pod_past_the_namespaces_quota_is_refused_for_the_quota(
    apiserver: ControlPlane, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    gated_pod(world, "over", "4000Mi")
    document = explained(apiserver, world, capsys, "over")
    assert document["state"] == "pending"
    assert document["now"]["reason"] == "GpuQuotaExceeded"
    assert "used 4000Mi + requested 4000Mi > hard 6000Mi" in document["now"]["message"]
    # node 2 is tainted: the placement the quota refused is on node 1, whose node fit says nothing.
    assert document["nodesRefused"] == [{"node": world.node(2), "reason": "TaintToleration"}]
    assert [request["node"] for request in document["requests"]] == [world.node(1)]


def test_a_pod_within_the_quota_fits_now(
    apiserver: ControlPlane, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    gated_pod(world, "small", "1000Mi")
    document = explained(apiserver, world, capsys, "small")
    assert document["now"] is None and document["note"].startswith("it fits now")
    (decision,) = document["requests"]
    assert decision["node"] == world.node(1) and decision["devices"] == ["gpu-0"]
