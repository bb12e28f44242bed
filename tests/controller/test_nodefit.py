"""The controller's node filter (dra_driver/controller/nodefit.py): why a pod cannot run on a node,
named as kube-scheduler's plugins name it, or None."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.nodefit import node_fit_problem
from dra_driver.resource.nodes import NodeView
from dra_driver.resource.objects import PodView

TAINT = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
GPU_A100 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
NAME_N1 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}


def node(name: str = "n1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"zone": "a", "gpu": "t4"}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": [], **spec}}


def required(term: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def requests(**amounts: str) -> list[dict[str, Any]]:
    return [{"name": "c", "resources": {"requests": amounts}}]


@pytest.mark.parametrize(
    ("pod_spec", "node_spec", "expected"),
    [
        ({}, {}, None),
        ({"nodeSelector": {"zone": "b"}}, {}, "NodeSelectorMismatch"),
        ({"nodeName": "n2"}, {}, "NodeName"),
        ({}, {"unschedulable": True}, "NodeUnschedulable"),
        ({"tolerations": [UNSCHEDULABLE]}, {"unschedulable": True}, None),
        ({}, {"taints": [TAINT]}, "TaintToleration"),
        ({"tolerations": [TAINT]}, {"taints": [TAINT]}, None),
        ({}, {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, None),
        ({"affinity": required(GPU_A100)}, {}, "NodeAffinityMismatch"),
        ({"affinity": required(NAME_N1)}, {}, None),
        ({"containers": requests(cpu="3")}, {}, "InsufficientCPU"),
        ({"containers": requests(memory="7Gi")}, {}, "InsufficientMemory"),
    ],
)
def test_why_a_pod_cannot_run_on_a_node(
    pod_spec: dict[str, Any], node_spec: dict[str, Any], expected: str | None
) -> None:
    """CPU and memory count against allocatable less what the pods bound there request."""
    bound = {"cpu": 2.0, "memory": float(2 * 2**30)}
    assert (
        node_fit_problem(PodView.parse(pod(**pod_spec)), NodeView.parse(node(**node_spec)), bound) == expected
    )
