"""``spec.devices.constraints`` read once as typed values (dra_driver/resource/constraints.py)."""

from __future__ import annotations

from dra_driver.resource.constraints import DeviceConstraint, parse_constraints


def test_each_entry_becomes_its_attribute_its_kind_and_its_requests() -> None:
    match, distinct, nameless = parse_constraints([
        {"matchAttribute": "resource.kubernetes.io/numaNode", "requests": ["a", "b/small"]},
        {"distinctAttribute": "gpu.hami.io/index"},
        {"requests": ["a"]},
    ])  # fmt: skip
    assert match == DeviceConstraint("resource.kubernetes.io/numaNode", False, frozenset({"a", "b/small"}))
    assert distinct == DeviceConstraint("gpu.hami.io/index", True, frozenset())
    assert nameless is None  # the API server refuses it: nothing to check, its position kept
    assert parse_constraints(None) == () == parse_constraints([])


def test_a_constraint_covers_its_requests_and_their_subrequests_or_every_request() -> None:
    named = DeviceConstraint("x", False, frozenset({"a", "b/small"}))
    assert named.covers("a") and named.covers("a/any") and named.covers("b/small")
    assert not named.covers("b") and not named.covers("b/large") and not named.covers("c")
    assert not named.covers("ab") and not named.covers("c/a")
    every = DeviceConstraint("x", True)
    assert every.covers("a") and every.covers("z/small")
