"""The controller's node filter: where a pod may run, so that our node choice is one
kube-scheduler will accept.

Checked, as kube-scheduler's default plugins do: ``spec.nodeName``, ``nodeSelector``, required
node affinity (``matchExpressions`` and ``matchFields`` on ``metadata.name``), node taints with
effect NoSchedule/NoExecute against the pod's tolerations, unschedulable nodes, and the pod's
CPU/memory requests against allocatable minus the requests of pods already bound to the node.
Preferred affinity, pod (anti-)affinity and topology spread are not evaluated (the scheduler may
still reject the node; then PostFilter clears the allocation and we place again elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.resource.nodes import (
    BLOCKING_EFFECTS,
    NodeView,
    node_selector_matches,
    taints_tolerated,
    tolerates,
)
from dra_driver.resource.objects import PodView

#: The taint kube-scheduler treats an unschedulable node as having.
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def node_fit_problem(pod: PodView, node: NodeView, bound_requests: Mapping[str, float]) -> str | None:
    """Why ``pod`` cannot run on ``node`` (a short reason, kube-scheduler's plugin name), or None."""
    if pod.node_name and pod.node_name != node.name:
        return "NodeName"
    labels = node.labels
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return "NodeSelectorMismatch"
    if pod.required_affinity is not None and not node_selector_matches(pod.required_affinity, node):
        return "NodeAffinityMismatch"
    if node.unschedulable and not tolerates(pod.tolerations, UNSCHEDULABLE_TAINT):
        return "NodeUnschedulable"
    if not taints_tolerated(node.taints, pod.tolerations, BLOCKING_EFFECTS):
        return "TaintToleration"
    allocatable = node.allocatable
    for resource, amount in pod.requests.items():
        if amount <= 0 or resource not in allocatable:
            continue
        if bound_requests.get(resource, 0.0) + amount > allocatable[resource]:
            return "InsufficientMemory" if resource == "memory" else "InsufficientCPU"
    return None
