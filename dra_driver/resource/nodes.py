"""Nodes as placement reads them: labels, taints, allocatable, and the selector and taint rules.

Kubernetes semantics for NodeSelector terms (ORed; requirements within a term ANDed; an empty term
matches nothing), and for taints and tolerations (an empty key with ``Exists`` tolerates every
taint; an empty effect matches every effect). The controller's node filter
(``dra_driver/controller/nodefit.py``) and device-taint eligibility
(``dra_driver/controller/eligibility.py``) both use these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.kube.api import ObjView
from dra_driver.quantity import optional_quantity

#: Taint effects that keep a pod (or a request) off a node (or a device); PreferNoSchedule does not.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def quantity_or_zero(value: Any) -> float:
    """A resource quantity as a float; one that does not parse counts as 0 (as a missing one)."""
    return float(optional_quantity(value) or 0)


def _requirement_matches(requirement: ObjView, value: str | None) -> bool:
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
    taints: tuple[ObjView, ...]
    unschedulable: bool
    #: Allocatable CPU (cores) and memory (bytes); a quantity that does not parse counts as 0.
    allocatable: Mapping[str, float]
    #: Allocatable as published (quantity text by resource name), for readers that round a count
    #: themselves, exactly (the kubelet plugin's device-plugin check). Not compared: a node whose
    #: quantities are only written differently (``4`` then ``4000m``) is the same node to placement.
    allocatable_quantities: Mapping[str, str] = field(compare=False)

    @classmethod
    def parse(cls, node: ObjView) -> NodeView:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        return cls(
            name=str(meta.get("name", "")),
            labels={str(key): str(value) for key, value in (meta.get("labels") or {}).items()},
            taints=tuple(spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable")),
            allocatable={str(key): quantity_or_zero(value) for key, value in allocatable.items()},
            allocatable_quantities={str(key): str(value) for key, value in allocatable.items()},
        )


def node_selector_term_matches(term: ObjView, node: NodeView) -> bool:
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


def node_selector_matches(selector: ObjView | None, node: NodeView) -> bool:
    """A NodeSelector (terms ORed); None matches every node."""
    if selector is None:
        return True
    return any(node_selector_term_matches(term, node) for term in selector.get("nodeSelectorTerms") or ())


def tolerates(tolerations: Sequence[ObjView], taint: ObjView) -> bool:
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


def taints_tolerated(
    taints: Iterable[ObjView], tolerations: Sequence[ObjView], effects: Sequence[str]
) -> bool:
    return all(taint.get("effect") not in effects or tolerates(tolerations, taint) for taint in taints)
