"""Our ResourceSlices: what the kubelet plugin writes is what the controller and ``top`` read.

The names (devices ``gpu-<n>``, attributes, capacities) are defined once in
``dra_driver/resource/slices.py``; these tests publish GPUs through the plugin's producer and read
them back through the one parser, and pin kube-scheduler's rule for which slices count: each
pool's newest generation, and only when it is complete.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from dra_driver.contract import (
    CAPACITY_NAMES,
    HAMI_CORE_VERSION_ATTRIBUTE,
    ISOLATION_ATTRIBUTE,
    ISOLATION_HAMI_CORE,
)
from dra_driver.controller.inventory import build_inventory
from dra_driver.devices.model import Gpu
from dra_driver.devices.nvlink import parse_nvlink_peers
from dra_driver.devices.simulated import profile_gpus
from dra_driver.quantity import GIB, MIB
from dra_driver.resource import slices as names
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.slices import (
    SlicePlace,
    capacity_entries,
    current_devices,
    current_pools,
    device_index,
    device_name,
    newest_complete,
    owned_pools,
    parse_device,
    pool_owner,
    slice_devices,
    slice_place,
)
from dra_driver.top.objects import parse_slices

DRIVER = "gpu.hami.io"


def node_slices(node: str, gpus: list[Gpu], *, generation: int = 1) -> list[dict[str, Any]]:
    return build_resource_slices(gpus, driver_name=DRIVER, node_name=node, generation=generation)


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [0, 7, 15, 255])
def test_device_names_round_trip(number: int) -> None:
    assert device_name(number) == f"gpu-{number}"
    assert device_index(device_name(number)) == number


@pytest.mark.parametrize("name", ["gpu-", "gpu-x", "gpu--1", "gpu-1a", "mig-0", "GPU-0", "gpu-\u0663", "0"])
def test_other_names_have_no_index(name: str) -> None:
    assert device_index(name) is None


def test_every_published_attribute_and_capacity_is_a_named_one() -> None:
    """The producer writes no name the readers do not know (no literal drifting on one side)."""
    known = {
        value for key, value in vars(names).items() if key.endswith("_ATTRIBUTE") and isinstance(value, str)
    } | {ISOLATION_ATTRIBUTE, HAMI_CORE_VERSION_ATTRIBUTE}
    gpu = replace(profile_gpus("h100-80gb", node_name="n1", gpus=2)[0], hami_core_version="2.6.0")
    (item,) = node_slices("n1", [gpu])
    (entry,) = item["spec"]["devices"]
    assert set(entry["attributes"]) <= known
    assert tuple(entry["capacity"]) == CAPACITY_NAMES


# --- producer -> consumer -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["t4", "h100-80gb"])
def test_a_published_gpu_reads_back_fact_for_fact(profile: str) -> None:
    gpus = profile_gpus(profile, node_name="n1", gpus=4)
    read = {
        device.name: (node, pool, device)
        for node, pool, device in current_devices(node_slices("n1", gpus), DRIVER)
    }
    assert set(read) == {gpu.name for gpu in gpus}
    for gpu in gpus:
        node, pool, device = read[gpu.name]
        assert (node, pool) == ("n1", "n1")
        assert device.index == gpu.index and device_index(device.name) == gpu.index
        assert (device.uuid, device.product_name) == (gpu.uuid, gpu.product_name)
        assert (device.healthy, device.isolation, device.numa_node) == (
            gpu.healthy,
            gpu.isolation,
            gpu.numa_node,
        )
        assert (device.memory, device.cores, device.slots) == (
            (gpu.memory_bytes // MIB) * MIB,
            gpu.cores,
            gpu.slots,
        )
        peers = parse_nvlink_peers(device.nvlink_peers) if device.nvlink_peers is not None else ()
        assert peers == gpu.nvlink_peers
        assert device.taints == ()


def test_the_index_attribute_wins_over_the_name() -> None:
    """NVML nodes name GPUs by minor number; the index the engine places by is the attribute."""
    gpu = Gpu(
        index=1, uuid="GPU-a", product_name="Tesla T4", memory_bytes=16 * GIB, minor=5, name_by_minor=True
    )
    (item,) = node_slices("n1", [gpu])
    device = parse_device(item["spec"]["devices"][0])
    assert (device.name, device.index) == ("gpu-5", 1)
    (card,) = build_inventory([item], DRIVER)["n1"].cards
    assert card.index == 1


def test_unpublished_facts_are_none_and_the_name_gives_the_index() -> None:
    device = parse_device(
        {
            "name": "gpu-3",
            "attributes": {"index": {"bool": True}, "numaNode": {"int": 1}, "healthy": {"string": "yes"}},
            "capacity": {"memory": {"value": "1500m"}, "cores": {"value": "lots"}},
        }
    )
    assert device.index == 3, "a bool is no index"
    assert device.numa_node == 1, "the pre-standard NUMA attribute is read too"
    assert (device.uuid, device.product_name, device.isolation, device.healthy) == (None, None, None, None)
    assert (device.memory, device.cores, device.slots) == (1, None, None), "capacity rounds down"


def test_the_controller_and_top_read_the_same_devices() -> None:
    gpus = profile_gpus("t4", node_name="n1", gpus=2)
    gpus[1] = replace(gpus[1], healthy=False, isolation=ISOLATION_HAMI_CORE)
    items = node_slices("n1", gpus)
    controller = build_inventory(items, DRIVER)["n1"]
    shown = {device.name: device for device in parse_slices(items, DRIVER)}
    for device in controller.devices.values():
        seen = shown[device.name]
        card = device.card
        assert (seen.index, seen.uuid, seen.product_name) == (card.index, card.uuid, card.product_name)
        assert (seen.memory, seen.cores, seen.slots) == (card.memory, card.cores, card.slots)
        assert seen.healthy is card.healthy
    assert controller.device_at(1).card.shares_enforced and shown["gpu-1"].isolation == ISOLATION_HAMI_CORE


# --- which slices count ---------------------------------------------------------------------------


def two_slice_pool(node: str, generation: int) -> list[dict[str, Any]]:
    """A node whose 65 tainted GPUs need two slices (64 tainted devices per slice at most)."""
    gpus = [replace(gpu, healthy=False) for gpu in profile_gpus("t4", node_name=node, gpus=65)]
    items = build_resource_slices(
        gpus, driver_name=DRIVER, node_name=node, generation=generation, taint_unhealthy=True
    )
    assert [item["spec"]["pool"]["resourceSliceCount"] for item in items] == [2, 2]
    for item in items:
        item["metadata"]["name"] += f"-g{generation}"
    return items


def test_only_the_newest_generation_counts() -> None:
    old = node_slices("n1", profile_gpus("t4", node_name="n1", gpus=4), generation=1)
    new = node_slices("n1", profile_gpus("t4", node_name="n1", gpus=2), generation=2)
    assert [d.name for _, _, d in current_devices([*old, *new], DRIVER)] == ["gpu-0", "gpu-1"]
    assert [d.name for _, _, d in current_devices([*new, *old], DRIVER)] == ["gpu-0", "gpu-1"]


def test_an_incomplete_newest_generation_hides_the_pool() -> None:
    """Being republished: the older generation is being replaced, the newer is not all there."""
    complete = two_slice_pool("n1", 1)
    half_new = two_slice_pool("n1", 2)[:1]
    assert current_pools([*complete, *half_new], DRIVER) == {}
    assert list(current_pools(complete, DRIVER)) == [("n1", "n1")]
    assert len(list(current_devices(complete, DRIVER))) == 65
    assert parse_slices([*complete, *half_new], DRIVER) == [], "top shows what the controller sees"


def test_other_drivers_and_slices_without_a_node_do_not_count() -> None:
    (item,) = node_slices("n1", profile_gpus("t4", node_name="n1", gpus=1))
    other = copy.deepcopy(item)
    other["spec"]["driver"] = "other.example.com"
    unbound = copy.deepcopy(item)
    del unbound["spec"]["nodeName"]
    unbound["spec"]["allNodes"] = True
    assert current_pools([other, unbound], DRIVER) == {}


def test_a_pool_belongs_to_the_node_it_is_named_after() -> None:
    owner = node_slices("node-a", profile_gpus("t4", node_name="node-a", gpus=2))
    intruder = build_resource_slices(
        profile_gpus("t4", node_name="node-b", gpus=1),
        driver_name=DRIVER,
        node_name="node-b",
        pool_name="node-a",
        generation=9,
    )
    intruder[0]["metadata"]["name"] += "-intruder"
    assert list(current_pools([*owner, *intruder], DRIVER)) == [("node-a", "node-a")]


def raw_slice(node: str, pool: dict[str, Any] | None, driver: str = DRIVER) -> dict[str, Any]:
    """A hand-written slice (the fields a non-plugin publisher may leave out)."""
    spec: dict[str, Any] = {"driver": driver, "nodeName": node, "devices": [{"name": "gpu-0"}]}
    if pool is not None:
        spec["pool"] = pool
    return {"metadata": {"name": f"{node}-{driver}"}, "spec": spec}


def test_a_foreign_slice_does_not_hide_the_ones_after_it() -> None:
    items = [raw_slice("n0", {"name": "n0"}, driver="other"), raw_slice("n1", {"name": "n1"})]
    assert list(current_pools(items, DRIVER)) == [("n1", "n1")]


def test_a_slice_without_pool_name_generation_or_count_is_a_complete_pool_named_empty() -> None:
    """Kubernetes defaults: generation 0, one slice; a missing pool name groups as ""."""
    item = raw_slice("n1", {})
    assert current_pools([item], DRIVER) == {("n1", ""): [item]}
    assert newest_complete([item]) == [item]
    two = raw_slice("n2", {"name": "n2", "resourceSliceCount": 2})
    assert newest_complete([two]) is None


@pytest.mark.parametrize(
    ("pool", "nodes", "owner"),
    [
        ("n2", ["n1", "n2", "n3"], "n2"),
        ("n3/left", ["n3", "n1"], "n3"),
        ("shared", ["n2", "n1"], "n1"),
        ("shared", ["n9"], "n9"),
    ],
)
def test_a_pool_owner_is_the_node_it_is_named_after_else_the_first_by_name(
    pool: str, nodes: list[str], owner: str
) -> None:
    assert pool_owner(pool, nodes) == owner


def test_every_pool_keeps_its_owner_after_an_ignored_intruder() -> None:
    pools: dict[tuple[str, str], list[Any]] = {("n1", "n2"): ["x"], ("n2", "n2"): ["y"], ("n1", "n1"): ["z"]}
    assert owned_pools(pools) == {("n2", "n2"): ["y"], ("n1", "n1"): ["z"]}


def test_capacities_and_request_policies_on_the_wire() -> None:
    assert capacity_entries(16 * GIB + 5, 100, 1) == {
        "memory": {
            "value": "16Gi",
            "requestPolicy": {"default": "16Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
        },
        "slots": {"value": "1", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}}},
    }


@pytest.mark.parametrize("slots", [2, 3])
def test_a_shared_card_gets_a_slot_step(slots: int) -> None:
    policy = capacity_entries(GIB, 100, slots)["slots"]["requestPolicy"]
    assert policy == {"default": "1", "validRange": {"min": "1", "max": str(slots), "step": "1"}}


def test_a_device_entry_without_name_peers_of_another_kind_and_taints() -> None:
    taint = {"key": "k", "effect": "NoSchedule"}
    device = parse_device({"attributes": {"nvlinkPeers": {"int": 3}}, "taints": [taint]})
    assert (device.name, device.index) == ("", None)
    assert device.nvlink_peers is None
    assert device.taints == (taint,)
    assert (
        parse_device({"name": "gpu-1", "attributes": {"nvlinkPeers": {"string": "0,2"}}}).nvlink_peers
        == "0,2"
    )


# --- one slice -----------------------------------------------------------------------------------


def test_a_slice_is_placed_by_its_driver_pool_and_node() -> None:
    (published,) = node_slices("node-a", profile_gpus("t4", node_name="node-a", gpus=1))
    assert slice_place(published) == SlicePlace(driver=DRIVER, pool="node-a", node="node-a", generation=1)
    published["spec"]["pool"]["generation"] = 7
    assert slice_place(published) == SlicePlace(driver=DRIVER, pool="node-a", node="node-a", generation=7)


@pytest.mark.parametrize(
    ("obj", "place"),
    [
        ({"spec": {"driver": DRIVER, "pool": {"name": "p"}}}, SlicePlace(DRIVER, "p", None)),
        ({"spec": {"driver": DRIVER, "pool": {}, "nodeName": ""}}, SlicePlace(DRIVER, "", None)),
        ({"spec": {"driver": 7, "pool": "p", "nodeName": "n1"}}, SlicePlace(None, "", "n1")),
        ({"spec": {}}, SlicePlace(None, "", None)),
        ({"spec": "bad"}, None),
        ({"metadata": {"name": "s"}}, None),
    ],
)
def test_a_slice_without_pool_node_or_spec_is_placed_as_far_as_it_says(
    obj: dict[str, Any], place: SlicePlace | None
) -> None:
    assert slice_place(obj) == place


def test_a_slices_devices_are_the_entries_it_holds() -> None:
    (published,) = node_slices("node-a", profile_gpus("t4", node_name="node-a", gpus=2))
    devices = slice_devices(published)
    assert [entry["name"] for entry in devices] == ["gpu-0", "gpu-1"]
    assert all(entry is held for entry, held in zip(devices, published["spec"]["devices"], strict=True))
    assert slice_devices({"spec": {"driver": DRIVER}}) == ()
    assert slice_devices({"spec": {"devices": None}}) == ()
    assert slice_devices({}) == ()
