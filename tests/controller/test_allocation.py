"""A plan as ``status.allocation`` (dra_driver/controller/allocation.py): results, the config in the
API's order and sources, and the node the allocation pins."""

from __future__ import annotations

from dra_driver.controller.allocation import build_allocation
from dra_driver.resource.objects import pinned_node
from tests.controller.harness import CFG, DRIVER, claim, exactly
from tests.controller.worlds import PLANNER_CLASSES, plan_one, planner


def test_the_config_comes_from_the_class_then_the_claim_and_each_share_has_an_id() -> None:
    _, p = planner()
    obj = claim("c", exactly("a"))
    obj["spec"]["devices"]["config"] = [
        {"requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {**CFG, "numaBind": True}}},
        {"opaque": {"driver": "other.io", "parameters": {"x": 1}}},
    ]
    plan = plan_one(obj, p)
    allocation = build_allocation(
        plan.claims[0], "n1", PLANNER_CLASSES.get, {"a": DRIVER}, new_uid=lambda: "uid-1"
    )
    assert [entry["source"] for entry in allocation["devices"]["config"]] == [
        "FromClass",
        "FromClaim",
        "FromClaim",
    ]
    assert allocation["devices"]["config"][0]["requests"] == ["a"]
    assert "requests" not in allocation["devices"]["config"][2]
    assert allocation["devices"]["results"][0]["shareID"] == "uid-1"
    assert pinned_node(allocation) == "n1"
