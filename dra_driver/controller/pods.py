"""Where a pod may run, so that our node choice is one kube-scheduler will accept.

Checked, as kube-scheduler's default plugins do: ``spec.nodeName``, ``nodeSelector``, required
node affinity (``matchExpressions`` and ``matchFields`` on ``metadata.name``), node taints with
effect NoSchedule/NoExecute against the pod's tolerations, unschedulable nodes, and the pod's
CPU/memory requests against allocatable minus the requests of pods already bound to the node.
Preferred affinity, pod (anti-)affinity and topology spread are not evaluated (the scheduler may
still reject the node; then PostFilter clears the allocation and we place again elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.cel.values import ValueParseError, parse_quantity

Obj = Mapping[str, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")


def _requirement_matches(requirement: Obj, value: str | None) -> bool:
    operator = requirement.get("operator")
    values = [str(item) for item in requirement.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


@dataclass(frozen=True, slots=True)
class NodeView:
    """What placement reads of a Node, parsed once when the informer delivers it (the controller
    checks every node for every pod it plans: at 5,000 nodes, re-reading dicts and quantities per
    check was most of a pending decision's cost)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Obj, ...]
    unschedulable: bool
    #: Allocatable CPU (cores) and memory (bytes); a quantity that does not parse counts as 0.
    allocatable: Mapping[str, float]

    @classmethod
    def parse(cls, node: Obj) -> NodeView:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        return cls(
            name=str(meta.get("name", "")),
            labels={str(key): str(value) for key, value in (meta.get("labels") or {}).items()},
            taints=tuple(spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable")),
            allocatable={str(key): _quantity(value) for key, value in allocatable.items()},
        )


def node_selector_term_matches(term: Obj, node: NodeView) -> bool:
    labels, name = node.labels, node.name
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False  # an empty term matches nothing (Kubernetes semantics)
    for requirement in expressions:
        if not _requirement_matches(requirement, labels.get(requirement.get("key"))):
            return False
    for requirement in fields:
        value = name if requirement.get("key") == "metadata.name" else None
        if not _requirement_matches(requirement, value):
            return False
    return True


def node_selector_matches(selector: Obj | None, node: NodeView) -> bool:
    """A NodeSelector (terms ORed); None matches every node."""
    if selector is None:
        return True
    return any(node_selector_term_matches(term, node) for term in selector.get("nodeSelectorTerms") or ())


def _tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        operator = toleration.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or str(toleration.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def taints_tolerated(taints: Iterable[Obj], tolerations: Sequence[Obj], effects: Sequence[str]) -> bool:
    return all(taint.get("effect") not in effects or _tolerates(tolerations, taint) for taint in taints)


def _quantity(value: Any) -> float:
    try:
        return float(parse_quantity(str(value)))
    except ValueParseError:
        return 0.0


def pod_requests(pod: Obj) -> dict[str, float]:
    """Effective CPU/memory requests: max(sum of containers, largest init container) + overhead."""
    spec = pod.get("spec") or {}
    totals = {"cpu": 0.0, "memory": 0.0}
    for container in spec.get("containers") or ():
        for name in totals:
            totals[name] += _quantity(((container.get("resources") or {}).get("requests") or {}).get(name, 0))
    for container in spec.get("initContainers") or ():
        for name in totals:
            init = _quantity(((container.get("resources") or {}).get("requests") or {}).get(name, 0))
            totals[name] = max(totals[name], init)
    for name in totals:
        totals[name] += _quantity((spec.get("overhead") or {}).get(name, 0))
    return totals


def pod_active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def node_fit_problem(
    pod: Obj,
    node: NodeView,
    bound_requests: Mapping[str, float],
    wanted: Mapping[str, float] | None = None,
) -> str | None:
    """Why ``pod`` cannot run on ``node`` (a short reason), or None; ``wanted`` = ``pod_requests(pod)``."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or ()
    if spec.get("nodeName") and spec["nodeName"] != node.name:
        return "NodeName"
    labels = node.labels
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return "NodeSelectorMismatch"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not node_selector_matches(required, node):
        return "NodeAffinityMismatch"
    if node.unschedulable:
        unschedulable = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        if not _tolerates(tolerations, unschedulable):
            return "NodeUnschedulable"
    if not taints_tolerated(node.taints, tolerations, ("NoSchedule", "NoExecute")):
        return "TaintToleration"
    allocatable = node.allocatable
    if wanted is None:
        wanted = pod_requests(pod)
    for resource, amount in wanted.items():
        if amount <= 0 or resource not in allocatable:
            continue
        if bound_requests.get(resource, 0.0) + amount > allocatable[resource]:
            return f"Insufficient{resource.capitalize()}" if resource == "memory" else "InsufficientCPU"
    return None


def pod_claim_names(pod: Obj) -> list[tuple[str, str | None]]:
    """(pod claim name, ResourceClaim name or None when its template claim does not exist yet)."""
    statuses = {
        entry.get("name"): entry.get("resourceClaimName")
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    names: list[tuple[str, str | None]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("resourceClaimName"):
            names.append((str(entry["name"]), str(entry["resourceClaimName"])))
        else:
            claim = statuses.get(entry.get("name"))
            names.append((str(entry["name"]), str(claim) if claim else None))
    return names
