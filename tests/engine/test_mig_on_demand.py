"""MIG on demand, placement (issue 37 item 2): the policy chain over a card's possible placements.

The placements come the way the controller gets them: published by the slice builder for H200
cards marked on demand, read back by the controller's inventory, placed by ``engine/mig.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from dra_driver.controller.inventory import build_inventory
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import parse_policy_chain
from dra_driver.engine.mig import MigRequest, MigState, free_blocks, place_mig, place_mig_and_allocate
from dra_driver.engine.model import DeviceShare, Placement
from dra_driver.engine.reasons import Reason
from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE
from dra_driver.resource.slice_builder import build_resource_slices

DRIVER = "gpu.hami.io"


def on_demand_state(cards: int = 2, node: str = "node-1", numa: Sequence[int] = ()) -> MigState:
    """``cards`` H200s in MIG on demand; ``numa``: each card's NUMA node (default: the profile's)."""
    gpus = [
        dataclasses.replace(g, mig_enabled=True) for g in profile_gpus("h200", node_name=node, gpus=cards)
    ]
    if numa:
        gpus = [dataclasses.replace(g, numa_node=n) for g, n in zip(gpus, numa, strict=True)]
    slices = build_resource_slices(
        mark_on_demand(gpus, parse_selection("all")),
        driver_name=DRIVER,
        node_name=node,
        mig_on_demand_layout=LAYOUT_OWN_SLICE,
    )
    inventory = build_inventory(slices, DRIVER)
    instances = inventory[node].mig_instances
    assert len(instances) == cards * 18 and all(i.on_demand for i in instances)
    return MigState(instances)


def take(state: MigState, profile: str, policy: str = "binpack", count: int = 1) -> list[str]:
    decision = place_mig_and_allocate(
        state, MigRequest(name="r", profile=profile, count=count, policy=parse_policy_chain(policy))
    )
    assert decision.placement is not None, decision.reason
    names = {c.index: c.device for c in decision.candidates}
    return [names[share.index] for share in decision.placement.devices]


def covered(state: MigState, parent: int) -> list[int]:
    return sorted(
        s
        for i in state.instances("node-1")
        if i.parent == parent and state.in_use("node-1", i.index)
        for s in i.span
    )


def test_binpack_packs_small_profiles_low_and_keeps_the_largest_placement() -> None:
    state = on_demand_state()
    placed = [take(state, "1g.18gb")[0] for _ in range(3)]
    assert placed == ["gpu-0-mig-1g18gb-at-0", "gpu-0-mig-1g18gb-at-1", "gpu-0-mig-1g18gb-at-2"]
    assert free_blocks(covered(state, 0))[0] == 4  # slices 4-7: a 3g.71gb still fits
    assert take(state, "3g.71gb") == ["gpu-0-mig-3g71gb-at-4"]
    assert take(state, "7g.141gb") == ["gpu-1-mig-7g141gb-at-0"]  # an untouched card


def test_a_7g_goes_to_an_untouched_card_and_why_the_others_lost() -> None:
    state = on_demand_state()
    take(state, "1g.18gb")
    decision = place_mig(
        state, MigRequest(name="r", profile="7g.141gb", policy=parse_policy_chain("binpack"))
    )
    assert decision.placement is not None
    by_device = {c.device: c for c in decision.candidates}
    assert by_device["gpu-1-mig-7g141gb-at-0"].chosen
    assert by_device["gpu-0-mig-7g141gb-at-0"].reason is Reason.MIG_PLACEMENT_TAKEN


def test_spread_opens_a_second_card() -> None:
    state = on_demand_state()
    first, second = take(state, "1g.18gb", "spread"), take(state, "1g.18gb", "spread")
    assert {first[0].split("-mig-")[0], second[0].split("-mig-")[0]} == {"gpu-0", "gpu-1"}


def test_overlapping_placements_are_never_both_given_out() -> None:
    state = on_demand_state(cards=1)
    assert take(state, "4g.71gb") == ["gpu-0-mig-4g71gb-at-0"]
    # One request for two 3g: only slices 4-7 are left, so it cannot have both.
    decision = place_mig(state, MigRequest(name="r", profile="3g.71gb", count=2))
    assert decision.placement is None
    assert "MigPlacementTaken" in (decision.reason or "")
    # Compute slices count too: 4g + 3g are all seven.
    assert take(state, "3g.71gb") == ["gpu-0-mig-3g71gb-at-4"]
    assert place_mig(state, MigRequest(name="r", profile="1g.18gb")).placement is None
    # The ledger refuses an overlapping allocation whoever asks.
    seven = next(i for i in state.instances("node-1") if i.profile == "7g.141gb")
    with pytest.raises(ValueError, match="overlaps a MIG instance in use"):
        state.allocate(Placement("node-1", (DeviceShare(seven.index, seven.memory, 100),)))


def test_one_request_for_several_slices_takes_disjoint_placements() -> None:
    state = on_demand_state(cards=1)
    names = take(state, "1g.18gb", count=3)
    assert names == ["gpu-0-mig-1g18gb-at-0", "gpu-0-mig-1g18gb-at-1", "gpu-0-mig-1g18gb-at-2"]


def test_profiles_sharing_a_placement_are_distinct_devices() -> None:
    state = on_demand_state(cards=1)
    same_start = [i for i in state.instances("node-1") if i.placement_start == 2 and i.placement_size == 2]
    assert sorted(i.profile for i in same_start) == ["1g.35gb", "2g.35gb"]
    assert len({i.index for i in same_start}) == 2


def test_mutex_takes_no_placement_of_a_card_another_claim_holds() -> None:
    state = on_demand_state()
    assert take(state, "1g.18gb", "mutex,binpack") == ["gpu-0-mig-1g18gb-at-0"]
    # binpack alone would pack the next 1g next to it; mutex takes the untouched card.
    assert take(state, "1g.18gb", "mutex,binpack") == ["gpu-1-mig-1g18gb-at-0"]
    mutex = MigRequest(name="r", profile="1g.18gb", policy=parse_policy_chain("mutex"))
    decision = place_mig(state, mutex, max_candidates=64)
    assert decision.placement is None
    by_device = {c.device: c.reason for c in decision.candidates}
    assert by_device["gpu-0-mig-1g18gb-at-3"] is Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    assert by_device["gpu-1-mig-1g18gb-at-3"] is Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    assert take(state, "1g.18gb", "binpack") == ["gpu-0-mig-1g18gb-at-1"]  # without mutex: packed


def test_the_numa_policy_prefers_cards_of_the_lower_numa_node() -> None:
    state = on_demand_state(cards=3, numa=(1, 0, 0))
    assert take(state, "7g.141gb", "numa", count=2) == ["gpu-1-mig-7g141gb-at-0", "gpu-2-mig-7g141gb-at-0"]
    assert take(state, "1g.18gb", "numa") == ["gpu-0-mig-1g18gb-at-0"]  # the only card left


def numa_bound(memory_gib: int, count: int) -> MigRequest:
    return MigRequest(
        name="r", memory=memory_gib << 30, count=count, numa_bind=True, policy=parse_policy_chain("binpack")
    )


def test_numa_bind_keeps_a_claim_on_one_numa_node_even_where_placements_overlap() -> None:
    # NUMA node 0 has one card: four placements of 60 GiB or more (7g, 4g, two 3g), of which only
    # the two 3g fit together; NUMA node 1 has two cards. Three such slices fit only there.
    state = on_demand_state(cards=3, numa=(0, 1, 1))
    decision = place_mig_and_allocate(state, numa_bound(60, 3))
    assert decision.placement is not None, decision.reason
    names = {c.index: c.device for c in decision.candidates}
    placed = [names[share.index] for share in decision.placement.devices]
    assert all(not name.startswith("gpu-0-") for name in placed), placed
    assert {name.split("-mig-")[0] for name in placed} == {"gpu-1", "gpu-2"}
    lost = {c.device: c.reason for c in decision.candidates}
    assert lost["gpu-0-mig-3g71gb-at-0"] is Reason.NUMA_NOT_FIT
    # Two of them still fit on NUMA node 0 alone; four nowhere on one NUMA node.
    assert place_mig(state, numa_bound(60, 2)).placement is not None
    refused = place_mig(state, numa_bound(60, 4))
    assert refused.placement is None and "NumaNotFit" in (refused.reason or "")
