"""MIG on demand through the controller over ``FakeKube`` (issue 37 item 2): pods of the MIG class
on a node whose H200 cards publish possible placements are placed by the policy chain, bound, and
never given overlapping placements; a claim's end frees its slices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.controller.allocator import Placed, Unschedulable
from dra_driver.controller.reasons import Reason
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.simulated import parse_devices
from dra_driver.kube.api import GPU_QUOTAS
from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.mig_world import MIG_CLASS, mig_class, profile_selector
from tests.controller.worlds import NODE, World


def on_demand_slices(cards: int, numa: Sequence[int] = ()) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [
        {"index": i, "profile": "h200", "migEnabled": True} for i in range(cards)
    ]
    for entry, node in zip(entries, numa, strict=False):
        entry["numaNode"] = node
    gpus = mark_on_demand(parse_devices({"gpus": entries}, node_name=NODE), parse_selection("all"))
    return build_resource_slices(
        gpus, node_name=NODE, driver_name=DRIVER, policy_taint=True, mig_on_demand_layout=LAYOUT_OWN_SLICE
    )


def on_demand_world(cards: int = 2, numa: Sequence[int] = ()) -> World:
    world = World()
    world.cache.refresh_inventory(on_demand_slices(cards, numa))
    world.add_class(mig_class())
    return world


def tenant(world: World, name: str, profile: str, config: dict[str, Any] | None = None) -> None:
    body = claim(name, request(klass=MIG_CLASS), config=config)
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


def test_a_gpu_quota_counts_the_placements_memory_and_refuses_past_it() -> None:
    world = on_demand_world(cards=1)
    cap = {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "40Gi"}}}
    world.deliver("GpuQuota", cap)
    for name in ("a", "b"):  # 2 x 16896Mi (a 1g.18gb's memory, not the card's 140 GiB) fit in 40Gi
        tenant(world, name, "1g.18gb")
        assert world.place(f"{name}-pod").outcome == "bound"
    world.cache.quotas.sync(world.kube, force=True)
    used = world.kube.stored(GPU_QUOTAS, NS, "cap")["status"]["used"]
    assert used == {"memory": "33Gi", "cores": 28, "devices": 2}
    tenant(world, "c", "1g.18gb")  # 33Gi + 16896Mi > 40Gi
    outcome = world.decide("c-pod")
    assert isinstance(outcome, Unschedulable) and outcome.reason is Reason.QUOTA_EXCEEDED
    assert "memory: used 33Gi + requested 16896Mi > hard 40Gi" in outcome.message
    world.deliver("GpuQuota", {**cap, "spec": {"hard": {"memory": "60Gi"}}})
    world.cache.quotas.sync(world.kube, force=True)
    assert isinstance(world.decide("c-pod"), Placed)  # within the raised quota: placed


def test_mutex_takes_no_placement_of_a_card_another_pod_holds() -> None:
    world = on_demand_world()
    exclusive = {"policy": "mutex,binpack"}
    tenant(world, "a", "1g.18gb", exclusive)
    assert world.place("a-pod").outcome == "bound"
    tenant(world, "b", "1g.18gb", exclusive)  # binpack alone would put it next to a, on gpu-0
    assert world.place("b-pod").outcome == "bound"
    assert world.devices("b") == ["gpu-1-mig-1g18gb-at-0"]
    tenant(world, "c", "1g.18gb", exclusive)
    outcome = world.decide("c-pod")
    assert isinstance(outcome, Unschedulable)
    assert "ExclusiveDeviceAllocateConflict" in outcome.message


def test_numa_bind_places_a_multi_slice_claim_on_cards_of_one_numa_node() -> None:
    # gpu-0 alone on NUMA node 0 offers four placements of 60 GiB or more but only two fit
    # together; three go to gpu-1 and gpu-2, both on NUMA node 1.
    world = on_demand_world(cards=3, numa=(0, 1, 1))
    body = claim("trio", request(klass=MIG_CLASS, memory="60Gi", count=3), config={"numaBind": True})
    world.add_claim(body)
    world.add_pod(pod("trio-pod", {"gpu": "claim:trio"}))
    assert world.place("trio-pod").outcome == "bound"
    devices = world.devices("trio")
    assert len(devices) == 3 and {d.split("-mig-")[0] for d in devices} == {"gpu-1", "gpu-2"}, devices


def test_the_numa_policy_prefers_placements_on_the_lower_numa_node() -> None:
    world = on_demand_world(cards=3, numa=(1, 0, 0))
    body = claim("pair", request(klass=MIG_CLASS, count=2), config={"policy": "numa"})
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = profile_selector("7g.141gb")
    world.add_claim(body)
    world.add_pod(pod("pair-pod", {"gpu": "claim:pair"}))
    assert world.place("pair-pod").outcome == "bound"
    assert world.devices("pair") == ["gpu-1-mig-7g141gb-at-0", "gpu-2-mig-7g141gb-at-0"]


def test_metrics_show_each_placement_a_claim_holds_and_each_cards_free_slices() -> None:
    world = on_demand_world(cards=1)
    sample = world.metrics.registry.get_sample_value
    placement = next(
        i for i in world.cache.ledger.mig_state.instances(NODE) if i.name == "gpu-0-mig-1g18gb-at-0"
    )
    card = {"node": NODE, "device": "gpu-0", "uuid": placement.parent_uuid, "model": "NVIDIA H200"}
    # No UUID is published for a placement (the instance does not exist yet): its key stands in.
    held = {**card, "device": placement.name, "uuid": placement.uuid, "profile": "1g.18gb", "parent": "gpu-0"}
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    # A possible placement nobody holds is no instance: no series (18 would sum to 5 cards' memory).
    assert sample("hami_dra_mig_instance_memory_bytes", held) is None
    assert sample("hami_dra_mig_on_demand_free_slices", {**card, "kind": "memory"}) == 8
    assert sample("hami_dra_mig_on_demand_free_slices", {**card, "kind": "compute"}) == 7
    tenant(world, "a", "1g.18gb")
    assert world.place("a-pod").outcome == "bound"
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    assert sample("hami_dra_mig_instance_memory_bytes", held) == 16896 * 1024**2
    assert sample("hami_dra_mig_instance_allocated", held) == 1
    assert sample("hami_dra_mig_on_demand_free_slices", {**card, "kind": "memory"}) == 7
    assert sample("hami_dra_mig_on_demand_free_slices", {**card, "kind": "compute"}) == 6
    claim_labels = {"claim_namespace": NS, "claim": "a", "claim_pod": "a-pod"}
    gpu = {k: held[k] for k in ("node", "device", "uuid", "model")}
    assert sample("hami_dra_claim_allocated_memory_bytes", {**claim_labels, **gpu}) == 16896 * 1024**2
    names = {
        sample_.labels["device"]
        for family in world.metrics.registry.collect()
        if family.name == "hami_dra_mig_instance_memory_bytes"
        for sample_ in family.samples
    }
    assert names == {"gpu-0-mig-1g18gb-at-0"}
