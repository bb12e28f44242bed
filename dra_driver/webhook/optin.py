"""Which namespaces HAMi resources are translated in: where the controller makes the templates.

The webhook configuration's ``namespaceSelector`` decides which pods the API server sends to
``/mutate-hami``, which writes nothing. The controller creates the templates a translated pod
names, and only for a pod that exists, in a namespace that opted in: the label
``gpu.hami.io/hami-resources=enabled`` (``--hami-translate=namespaces``) or the configuration's
selector (``--hami-translate=all``, ``--hami-namespace-selector``). Anyone may write the
translation's annotation into a pod of their own; the check keeps the controller from making
templates of our classes where the admin did not turn translation on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

#: Namespace label that turns translation on (the webhook configuration's namespaceSelector).
NAMESPACE_LABEL = "gpu.hami.io/hami-resources"
NAMESPACE_LABEL_VALUE = "enabled"
#: ``--hami-translate`` values, as the chart's ``webhook.hamiResources.translate``.
TRANSLATE_MODES = ("namespaces", "all", "off")
OPT_IN_SELECTOR: dict[str, Any] = {"matchLabels": {NAMESPACE_LABEL: NAMESPACE_LABEL_VALUE}}
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: A namespace name is a DNS label; anything else must not reach an API path.
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@runtime_checkable
class NamespaceReader(Protocol):
    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The Namespace's labels; None when it does not exist. Raises ``KubeError`` otherwise."""


def selector_problems(selector: Any) -> list[str]:
    """What makes ``selector`` an invalid Kubernetes LabelSelector (empty: it is valid)."""
    if not isinstance(selector, Mapping):
        return ["a label selector must be an object with matchLabels and/or matchExpressions"]
    known = ("matchLabels", "matchExpressions")
    problems = [f"unknown field {key!r}" for key in selector if key not in known]
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        problems.append("matchLabels must map label names to strings")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return [*problems, "matchExpressions must be a list"]
    for position, expression in enumerate(expressions):
        problems += [f"matchExpressions[{position}]: {p}" for p in _expression_problems(expression)]
    return problems


def _expression_problems(expression: Any) -> list[str]:
    if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
        return ["needs a key"]
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator not in _OPERATORS:
        return [f"operator must be one of {', '.join(_OPERATORS)}, got {operator!r}"]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return ["values must be a list of strings"]
    if operator in ("In", "NotIn") and not values:
        return [f"{operator} needs values"]
    if operator in ("Exists", "DoesNotExist") and values:
        return [f"{operator} takes no values"]
    return []


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes' LabelSelector semantics; the empty selector matches every object."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


class NamespaceGate:
    """Says why a namespace may not get templates, or None when it opted in."""

    def __init__(self, reader: NamespaceReader, selector: Mapping[str, Any], how_to_opt_in: str) -> None:
        self._reader = reader
        self._selector = selector
        self._how_to_opt_in = how_to_opt_in

    def refusal(self, namespace: str) -> str | None:
        """None if ``namespace`` opted in; otherwise the reason, for the pod's admission warning.

        Raises ``KubeError`` when the Namespace cannot be read (the caller decides what that means).
        """
        if not NAMESPACE_NAME.fullmatch(namespace):
            return f"{namespace[:80]!r} is not a namespace name; HAMi resources were not translated"
        labels = self._reader.namespace_labels(namespace)
        if labels is None:
            return f"namespace {namespace} does not exist; HAMi resources were not translated"
        if selector_matches(self._selector, labels):
            return None
        return (
            f"namespace {namespace} has not opted in to HAMi resource translation ({self._how_to_opt_in}); "
            "the pod's nvidia.com/* resources were left as they are"
        )


def namespace_gate(mode: str, selector: Mapping[str, Any], reader: NamespaceReader) -> NamespaceGate:
    """The gate for ``--hami-translate=mode`` (``namespaces`` or ``all``)."""
    if mode == "namespaces":
        return NamespaceGate(reader, OPT_IN_SELECTOR, f"label it {NAMESPACE_LABEL}={NAMESPACE_LABEL_VALUE}")
    return NamespaceGate(reader, selector, "it is outside the webhook's namespaceSelector")


def parse_selector(text: str, flag: str = "--hami-namespace-selector") -> dict[str, Any]:
    """``flag``'s JSON label selector; ``ValueError`` naming the flag and what is wrong."""
    try:
        selector = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{flag} is not JSON: {err}") from None
    problems = selector_problems(selector)
    if problems:
        raise ValueError(f"{flag} is not a label selector: {'; '.join(problems)}")
    return dict(selector)
