"""Label and field selectors with the syntax and the errors of ``k8s.io/apimachinery``.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``.
Field selectors: ``f=v``, ``f==v``, ``f!=v`` over the labels a resource supports; any other
label is rejected with 400 like the real server ("field label not supported").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.kube.api import Obj
from dra_driver.resource import nodes
from hami_dra_dev.sandbox.errors import ApiError, bad_request
from hami_dra_dev.sandbox.resources import ResourceType


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as in Kubernetes.
        return labels.get(self.key) not in self.values


_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse a label selector; 400 BadRequest on bad syntax."""
    if not text or not text.strip():
        return []
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_RE.match(part):
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise bad_request(f"unable to parse requirement: {part.strip()!r}: invalid label selector")
    return reqs


def labels_match(reqs: list[Requirement], obj: Obj) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


def selector_from_label_selector(sel: Obj | None) -> list[Requirement]:
    """Convert a ``metav1.LabelSelector`` object (matchLabels/matchExpressions) to requirements."""
    if not sel:
        return []
    reqs = [Requirement(k, "=", (v,)) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in sel.get("matchExpressions") or []:
        reqs.append(Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ())))
    return reqs


@dataclass(frozen=True)
class FieldRequirement:
    label: str
    negate: bool
    value: str


def parse_field_selector(text: str | None, rt: ResourceType) -> list[FieldRequirement]:
    """Parse a field selector and check every label is supported for ``rt``."""
    if not text or not text.strip():
        return []
    out: list[FieldRequirement] = []
    for part in text.split(","):
        m = re.match(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        label = m.group(1)
        if not rt.supports_field(label):
            raise bad_request(f"field label not supported: {label}")
        out.append(FieldRequirement(label, m.group(2) == "!=", m.group(3)))
    return out


def _field_value(obj: Obj, label: str) -> str:
    if label == "source":  # events: source is source.component (deprecatedSource in events.k8s.io/v1)
        label = "deprecatedSource.component" if "deprecatedSource" in obj else "source.component"
    cur: Any = obj
    for part in label.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(reqs: list[FieldRequirement], obj: Obj) -> bool:
    for r in reqs:
        equal = _field_value(obj, r.label) == r.value
        if equal == r.negate:
            return False
    return True


def make_filter(
    label_selector: str | None, field_selector: str | None, rt: ResourceType
) -> Callable[[Obj], bool]:
    """One predicate for both selectors, parsed once (errors raise before any work is done)."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, rt)

    def predicate(obj: Obj) -> bool:
        return labels_match(labels, obj) and fields_match(fields, obj)

    return predicate


__all__ = ["ApiError", "make_filter", "parse_label_selector", "selector_from_label_selector"]


def node_selector_matches(selector: Obj | None, node: Obj) -> bool:
    """``core/v1 NodeSelector`` semantics: terms are ORed, requirements inside a term ANDed.

    ``None`` matches every node (an allocation without ``nodeSelector`` is usable anywhere); an
    empty term matches nothing. The rule is the controller's (``dra_driver/resource/nodes.py``).
    """
    return nodes.node_selector_matches(selector, nodes.NodeView.parse(node))
