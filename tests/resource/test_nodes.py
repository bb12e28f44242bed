"""Nodes as placement reads them (dra_driver/resource/nodes.py): the parsed NodeView, Kubernetes'
NodeSelector semantics and its taint/toleration rules."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.resource.nodes import (
    NodeView,
    node_selector_matches,
    quantity_or_zero,
    taints_tolerated,
    tolerates,
)

NODE = NodeView.parse({"metadata": {"name": "n1", "labels": {"zone": "a", "rank": "5"}}})


def test_a_node_view_reads_labels_taints_schedulability_and_allocatable_once() -> None:
    taint = {"key": "k", "effect": "NoSchedule"}
    view = NodeView.parse({
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "spec": {"taints": [taint], "unschedulable": True},
        "status": {"allocatable": {"cpu": "3500m", "memory": "1Gi", "pods": "lots"}},
    })  # fmt: skip
    assert (view.name, dict(view.labels), view.taints, view.unschedulable) == (
        "n1",
        {"zone": "a"},
        (taint,),
        True,
    )
    assert view.allocatable == {"cpu": 3.5, "memory": float(2**30), "pods": 0.0}  # unparsable: 0
    assert view.allocatable_quantities == {"cpu": "3500m", "memory": "1Gi", "pods": "lots"}  # as published
    bare = NodeView.parse({"metadata": {"name": "n2"}})
    assert (bare.labels, bare.taints, bare.unschedulable, bare.allocatable) == ({}, (), False, {})
    assert bare.allocatable_quantities == {}


def test_quantities_written_differently_are_the_same_node_to_placement() -> None:
    def node(cpu: object) -> NodeView:
        return NodeView.parse({"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": cpu}}})

    assert node("4").allocatable_quantities != node("4000m").allocatable_quantities
    assert node("4") == node("4000m") and node(4).allocatable_quantities == {"cpu": "4"}
    assert node("4") != node("5")


def test_a_quantity_that_does_not_parse_counts_as_zero() -> None:
    assert quantity_or_zero("250m") == 0.25 and quantity_or_zero("2Ki") == 2048.0
    assert quantity_or_zero("lots") == 0.0


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (expression("zone", "In", "a", "b"), True),
        (expression("zone", "In", "b"), False),
        (expression("missing", "In", "a"), False),
        (expression("zone", "NotIn", "b"), True),
        (expression("zone", "NotIn", "a"), False),
        (expression("missing", "NotIn", "a"), True),
        (expression("zone", "Exists"), True),
        (expression("missing", "Exists"), False),
        (expression("missing", "DoesNotExist"), True),
        (expression("zone", "DoesNotExist"), False),
        (expression("rank", "Gt", "4"), True),
        (expression("rank", "Gt", "5"), False),
        (expression("rank", "Lt", "6"), True),
        (expression("rank", "Lt", "5"), False),
        (expression("zone", "Gt", "4"), False),  # not an integer: no match
        (expression("rank", "Gt"), False),  # no value to compare with
        (expression("zone", "Unknown", "a"), False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, False),
        ({"matchFields": [{"key": "metadata.uid", "operator": "Exists"}]}, False),  # only the name is a field
        ({"matchExpressions": [*expression("zone", "In", "a")["matchExpressions"],
                               *expression("rank", "In", "6")["matchExpressions"]]}, False),
        (
            {**expression("zone", "In", "a"),
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
            False,
        ),  # requirements of one term are ANDed
        ({}, False),  # an empty term matches nothing
    ],
)  # fmt: skip
def test_a_node_selector_term_follows_kubernetes_operators(term: dict[str, Any], matches: bool) -> None:
    assert node_selector_matches({"nodeSelectorTerms": [term]}, NODE) is matches


def test_node_selector_terms_are_ored_and_no_selector_matches_every_node() -> None:
    assert node_selector_matches(
        {"nodeSelectorTerms": [expression("zone", "In", "b"), expression("zone", "In", "a")]}, NODE
    )
    assert not node_selector_matches({"nodeSelectorTerms": []}, NODE)
    assert node_selector_matches(None, NODE)


TAINT = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "value": "x", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "x"}, True),  # no effect: every effect
        ({"key": "dedicated", "value": "y"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"key": "dedicated", "value": "x", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # no key with Exists: every taint
        ({"value": "x"}, False),  # no key without Exists: nothing
    ],
)
def test_a_toleration_matches_a_taint_as_kubernetes_does(toleration: dict[str, Any], tolerated: bool) -> None:
    assert tolerates([toleration], TAINT) is tolerated


def test_only_taints_of_the_given_effects_must_be_tolerated() -> None:
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    assert taints_tolerated([soft], [], ("NoSchedule", "NoExecute"))
    assert not taints_tolerated([soft, TAINT], [], ("NoSchedule", "NoExecute"))
    assert taints_tolerated([soft, TAINT], [TAINT], ("NoSchedule", "NoExecute"))
