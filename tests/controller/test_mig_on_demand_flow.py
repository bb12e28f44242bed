"""MIG on demand through the controller over ``FakeKube`` (issue 37 item 2): pods of the MIG class
on a node whose H200 cards publish possible placements are placed by the policy chain, bound, and
never given overlapping placements; a claim's end frees its slices."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.allocator import Unschedulable
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.simulated import parse_devices
from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.harness import DRIVER, claim, pod, request
from tests.controller.mig_world import MIG_CLASS, mig_class, profile_selector
from tests.controller.worlds import NODE, World


def on_demand_slices(cards: int) -> list[dict[str, Any]]:
    entries = [{"index": i, "profile": "h200", "migEnabled": True} for i in range(cards)]
    gpus = mark_on_demand(parse_devices({"gpus": entries}, node_name=NODE), parse_selection("all"))
    return build_resource_slices(
        gpus, node_name=NODE, driver_name=DRIVER, policy_taint=True, mig_on_demand_layout=LAYOUT_OWN_SLICE
    )


def on_demand_world(cards: int = 2) -> World:
    world = World()
    world.cache.refresh_inventory(on_demand_slices(cards))
    world.add_class(mig_class())
    return world


def tenant(world: World, name: str, profile: str) -> None:
    body = claim(name, request(klass=MIG_CLASS))
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = profile_selector(profile)
    world.add_claim(body)
    world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def test_three_1g_slices_pack_low_on_one_card_and_a_7g_takes_an_untouched_card() -> None:
    world = on_demand_world()
    for name in ("a", "b", "c"):
        tenant(world, name, "1g.18gb")
        assert world.place(f"{name}-pod").outcome == "bound"
    assert [world.devices(n) for n in ("a", "b", "c")] == [
        ["gpu-0-mig-1g18gb-at-0"],
        ["gpu-0-mig-1g18gb-at-1"],
        ["gpu-0-mig-1g18gb-at-2"],
    ]
    (result,) = world.claim("a")["status"]["allocation"]["devices"]["results"]
    assert "shareID" not in result  # a placement is given out whole
    tenant(world, "big", "7g.141gb")
    assert world.place("big-pod").outcome == "bound"
    assert world.devices("big") == ["gpu-1-mig-7g141gb-at-0"]
    tenant(world, "mid", "3g.71gb")  # slices 4-7 of gpu-0 were kept for it
    assert world.place("mid-pod").outcome == "bound"
    assert world.devices("mid") == ["gpu-0-mig-3g71gb-at-4"]


def test_an_overlapping_placement_is_never_given_and_the_pod_says_why() -> None:
    world = on_demand_world(cards=1)
    tenant(world, "whole", "7g.141gb")
    assert world.place("whole-pod").outcome == "bound"
    tenant(world, "small", "1g.18gb")
    outcome = world.decide("small-pod")
    assert isinstance(outcome, Unschedulable)
    assert "MigPlacementTaken" in outcome.message
