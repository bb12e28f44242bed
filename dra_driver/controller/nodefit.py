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

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

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


def fit_key(pod: PodView) -> tuple[object, ...]:
    """What ``node_fit_problem`` reads of a pod: pods with equal keys fit on the same nodes."""
    return (
        pod.node_name,
        tuple(sorted(pod.node_selector.items())),
        repr(pod.required_affinity),
        repr(pod.tolerations),
        tuple(sorted((resource, amount) for resource, amount in pod.requests.items() if amount > 0)),
    )


class NodeFitIndex:
    """The nodes each kind of pod may run on (``fit_key``), kept up to date by what changed.

    A full evaluation looks at every node; after that an entry re-checks only the nodes named by
    ``changed_since`` (a Node object, CPU/memory in use, or its devices changed) since it was
    computed, so a decision costs what changed rather than the cluster's size. When the change is
    unknown (``changed_since`` returns None) the entry is evaluated in full again. The least
    recently used entries go beyond ``limit`` (every workload's pods share one).
    """

    def __init__(
        self,
        nodes: Callable[[], Iterable[str]],
        fits: Callable[[PodView, str], bool],
        changed_since: Callable[[tuple[int, ...]], set[str] | None],
        position: Callable[[], tuple[int, ...]],
        limit: int = 256,
    ) -> None:
        self._nodes = nodes
        self._fits = fits
        self._changed_since = changed_since
        self._position = position
        self._limit = limit
        self._entries: OrderedDict[tuple[object, ...], _FitEntry] = OrderedDict()

    def allowed(self, pod: PodView) -> frozenset[str]:
        key = fit_key(pod)
        position = self._position()
        entry = self._entries.get(key)
        changed = None if entry is None else self._changed_since(entry.position)
        if entry is None or changed is None:
            fitting = {name for name in self._nodes() if self._fits(pod, name)}
            entry = _FitEntry(position, fitting, frozenset(fitting))
            self._entries[key] = entry
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
            moved = False
            for name in changed:
                fits = self._fits(pod, name)
                if fits != (name in entry.nodes):
                    moved = True
                    (entry.nodes.add if fits else entry.nodes.discard)(name)
            if moved:
                entry.frozen = frozenset(entry.nodes)
            entry.position = position
        return entry.frozen


class _FitEntry:
    __slots__ = ("frozen", "nodes", "position")

    def __init__(self, position: tuple[int, ...], nodes: set[str], frozen: frozenset[str]) -> None:
        self.position = position
        self.nodes = nodes
        self.frozen = frozen
