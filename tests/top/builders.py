"""Realistic objects for ``top``'s tests, made by the components that make them in a cluster.

Slices come from the kubelet plugin's ``build_resource_slices`` over simulated T4s, allocations
from the controller's ``build_allocation`` (tests/api_objects.py), so a change to either writer
shows up here as a test failure rather than as a ``top`` that silently reads an old shape. Pods
carry the webhook's gate and the controller's condition type.
"""

from __future__ import annotations

from dataclasses import replace

from dra_driver.contract import (
    ALLOCATED_CONDITION,
    GATE_NAME,
    ISOLATION_HAMI_CORE,
    ISOLATION_NONE,
    ISOLATION_SIMULATED,
)
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import Obj
from dra_driver.quantity import GIB, MIB
from dra_driver.resource.slice_builder import build_resource_slices
from tests.api_objects import DRIVER, allocated_claim

#: What a simulated T4 publishes: nvidia-smi's total minus the driver's reserved memory.
T4_MEMORY = (15360 - 393) * MIB


def lab_slices() -> list[Obj]:
    """node-1: four T4s (hami-core, hami-core but not health-monitored, unhealthy and tainted,
    isolation none); node-2: two T4s whose plugin predates the ``isolation`` attribute."""
    gpus = profile_gpus("t4", node_name="node-1", gpus=4)
    gpus = [
        replace(gpus[0], isolation=ISOLATION_HAMI_CORE),
        replace(gpus[1], isolation=ISOLATION_HAMI_CORE, health_monitored=False),
        replace(gpus[2], healthy=False),
        replace(gpus[3], isolation=ISOLATION_NONE),
    ]
    node1 = build_resource_slices(gpus, driver_name=DRIVER, node_name="node-1", taint_unhealthy=True)
    node2 = build_resource_slices(profile_gpus("t4", node_name="node-2", gpus=2), node_name="node-2")
    for device in node2[0]["spec"]["devices"]:
        assert device["attributes"].pop("isolation") == {"string": ISOLATION_SIMULATED}
    return node1 + node2


def pod(
    namespace: str,
    name: str,
    *,
    claims: tuple[str, ...] = (),
    phase: str = "Pending",
    node: str | None = None,
    gated: bool = False,
    condition: tuple[str, str, str] | None = None,
) -> Obj:
    """A pod using ``claims`` (by name); ``condition`` is the controller's (status, reason, message)."""
    spec: Obj = {"containers": [{"name": "main", "image": "busybox"}]}
    if claims:
        spec["resourceClaims"] = [{"name": f"gpu{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": GATE_NAME}]
    status: Obj = {"phase": phase}
    if condition is not None:
        status["conditions"] = [
            {
                "type": ALLOCATED_CONDITION,
                "status": condition[0],
                "reason": condition[1],
                "message": condition[2],
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": status,
    }


UNSCHEDULABLE_MESSAGE = "0/6 CardInsufficientMemory"


def lab_claims() -> list[Obj]:
    """Two tenants on node-1/gpu-0, a whole card on gpu-1, one share on node-2/gpu-0."""
    train, whole, small = (("train-0", "u-train"),), (("whole-0", "u-whole"),), (("small-0", "u-small"),)
    return [
        allocated_claim("team-a", "train", "node-1", [(0, 5 * GIB, 30)], reserved_for=train),
        # Allocated by the controller while the pod is still gated: not reserved yet, owned by it.
        allocated_claim(
            "team-b", "infer", "node-1", [(0, 2 * GIB + 512 * MIB, 10)], owner=("infer-0", "u-infer")
        ),
        allocated_claim("team-a", "whole", "node-1", [(1, None, 0)], reserved_for=whole),
        allocated_claim("team-b", "small", "node-2", [(0, 1 * GIB, 0)], reserved_for=small),
    ]


def lab_pods() -> list[Obj]:
    return [
        pod("team-a", "train-0", claims=("train",), phase="Running", node="node-1"),
        pod("team-b", "infer-0", claims=("infer",), gated=True, condition=("True", "Allocated", "")),
        pod("team-a", "whole-0", claims=("whole",), phase="Running", node="node-1"),
        pod("team-b", "small-0", claims=("small",), phase="Running", node="node-2"),
        pod("team-a", "big-0", gated=True, condition=("False", "Unschedulable", UNSCHEDULABLE_MESSAGE)),
        pod("team-a", "big-1", gated=True, condition=("False", "Unschedulable", UNSCHEDULABLE_MESSAGE)),
        pod("team-b", "over", gated=True, condition=("False", "GpuQuotaExceeded", "quota team-b/gpus")),
        pod("team-b", "fresh", gated=True),
        # Finished pods are not pending, whatever their last condition said.
        pod("team-a", "done", phase="Succeeded", condition=("False", "Unschedulable", "old")),
        pod("team-a", "plain", phase="Running", node="node-1"),
    ]
