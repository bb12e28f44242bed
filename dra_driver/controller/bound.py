"""CPU/memory requested by the active pods bound to each node, kept per pod as pod events arrive.

What a new pod must fit beside on a node (``nodefit.py``). Each pod's contribution is remembered
by its key, so an event replaces exactly what that pod counted before, wherever it was bound; a
node's totals are summed again from its own pods (not adjusted by differences, which would let
rounding drift), so the cost of an event is the pods of one node, never every pod of the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.resource.objects import PodView

#: The resources counted (a node's totals always name both, as ``bound_requests_by_node`` does).
RESOURCES = ("cpu", "memory")


class BoundRequests:
    """Node -> requested CPU/memory of its active bound pods (``by_node``), kept per pod."""

    def __init__(self) -> None:
        self.by_node: dict[str, dict[str, float]] = {}
        self._pods: dict[str, dict[str, Mapping[str, float]]] = {}  # node -> pod key -> requests
        self._node_of: dict[str, str] = {}  # pod key -> the node it is counted on

    def track(self, key: str, pod: PodView | None) -> set[str]:
        """The pod ``key`` is now ``pod`` (None: gone); returns the nodes whose totals changed."""
        node = pod.bound_to if pod is not None and pod.bound_to and pod.active else None
        before = self._node_of.get(key)
        if before is None and node is None:
            return set()
        if (
            before is not None
            and before == node
            and pod is not None
            and self._pods[before][key] == pod.requests
        ):
            return set()
        changed = set()
        if before is not None:
            del self._node_of[key]
            del self._pods[before][key]
            changed.add(before)
        if node is not None and pod is not None:
            self._node_of[key] = node
            self._pods.setdefault(node, {})[key] = pod.requests
            changed.add(node)
        for name in changed:
            self._total(name)
        return changed

    def _total(self, node: str) -> None:
        pods = self._pods.get(node)
        if not pods:
            self._pods.pop(node, None)
            self.by_node.pop(node, None)
            return
        totals = dict.fromkeys(RESOURCES, 0.0)
        for requests in pods.values():
            for resource, amount in requests.items():
                totals[resource] = totals.get(resource, 0.0) + amount
        self.by_node[node] = totals
