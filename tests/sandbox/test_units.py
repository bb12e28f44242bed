"""Pure helpers of the sandbox: selectors, patches, quantities, node selectors."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.fieldcheck import parse_quantity
from hami_dra_dev.sandbox.firstfit import format_quantity
from hami_dra_dev.sandbox.patch import json_patch, merge_patch, strategic_merge_patch
from hami_dra_dev.sandbox.selectors import labels_match, node_selector_matches, parse_label_selector


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b,c", {"a": "b"}, False),
        ("a!=b", {}, True),
        ("a in (x, y),!z", {"a": "y"}, True),
        ("a notin (x)", {"a": "x"}, False),
        ("a notin (x)", {}, True),
        ("", {"a": "b"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(selector), {"metadata": {"labels": labels}}) is expected


def test_bad_label_selector_is_400() -> None:
    with pytest.raises(ApiError) as exc:
        parse_label_selector("a in x")
    assert exc.value.code == 400


def test_merge_and_json_patch() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2},
        "l": [2],
    }
    doc = {"a": [1, 2]}
    assert json_patch(
        doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "move", "from": "/a/0", "path": "/b"}]
    ) == {"a": [2, 3], "b": 1}
    assert doc == {"a": [1, 2]}, "patches never modify their input"
    with pytest.raises(ApiError):
        json_patch(doc, [{"op": "remove", "path": "/missing"}])


def test_strategic_merge_patch_directives() -> None:
    pod = {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
        "metadata": {"finalizers": ["x"]},
    }
    patched = strategic_merge_patch(
        pod,
        {
            "spec": {"containers": [{"name": "b", "$patch": "delete"}, {"name": "c", "image": "2"}]},
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]},
        },
    )
    # The new item first, as kube-apiserver 1.37 orders it (a pod's status conditions, checked:
    # [B delete, C] on [A, B] gives [C, A]).
    assert patched["spec"]["containers"] == [{"name": "c", "image": "2"}, {"name": "a", "image": "1"}]
    assert patched["metadata"]["finalizers"] == []
    replaced = strategic_merge_patch({"spec": {"x": 1, "y": 2}}, {"spec": {"$patch": "replace", "z": 3}})
    assert replaced == {"spec": {"z": 3}}
    retained = strategic_merge_patch({"s": {"a": 1, "b": 2}}, {"s": {"$retainKeys": ["b"], "b": 3}})
    assert retained == {"s": {"b": 3}}


def test_a_nodes_taints_are_replaced_whole_by_a_strategic_merge_patch() -> None:
    """NodeSpec.taints has no merge key: kube-apiserver 1.37 answers [d] to [d] on [a, b]."""
    node = {"spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in ("a", "b")]}}
    patched = strategic_merge_patch(node, {"spec": {"taints": [{"key": "d", "effect": "NoSchedule"}]}})
    assert patched["spec"]["taints"] == [{"key": "d", "effect": "NoSchedule"}]


def test_quantities() -> None:
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("1500m") == Fraction(3, 2)
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1.5.3") is None
    assert format_quantity(Fraction(1000 * 2**20)) == "1000Mi"
    assert format_quantity(Fraction(1500)) == "1500"


def test_node_selectors() -> None:
    node = {"metadata": {"name": "n1", "labels": {"zone": "a", "gpus": "4"}}}
    term = {
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "gpus", "operator": "Gt", "values": ["2"]},
        ]
    }
    assert node_selector_matches({"nodeSelectorTerms": [term]}, node)
    assert not node_selector_matches(
        {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
            ]
        },
        node,
    )
    assert node_selector_matches(None, node)
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, node)
