"""A pool belongs to one node: a slice of another node naming it never shadows the owner's GPUs.

The inventory groups slices by (node, pool). Before, it grouped by pool name alone, so a slice
from node-a named ``pool: node-b`` replaced node-b's devices (or, with a newer generation, hid them)
and node-b vanished from the controller's view.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from dra_driver.contract import DeviceId
from dra_driver.controller.inventory import build_inventory
from dra_driver.devices.simulated import profile_gpus
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.slices import pool_owner

DRIVER = "gpu.hami.io"


def pool_of(node: str, gpus: int, *, pool: str | None = None, generation: int = 1) -> list[dict[str, Any]]:
    """The slices node ``node`` publishes, named apart from the real ones when ``pool`` differs."""
    items = build_resource_slices(
        profile_gpus("t4", node_name=node, gpus=gpus),
        node_name=node,
        driver_name=DRIVER,
        pool_name=pool,
        generation=generation,
    )
    for item in items:
        item["metadata"]["name"] += f"-{pool or node}"
    return items


def devices(nodes: dict[str, Any], node: str) -> list[DeviceId]:
    return sorted(nodes[node].devices) if node in nodes else []


@pytest.mark.parametrize("generation", [1, 99], ids=["same generation", "newer generation"])
@pytest.mark.parametrize("foreign_first", [False, True], ids=["owner first", "foreign first"])
def test_a_slice_of_another_node_naming_its_pool_is_ignored(
    caplog: pytest.LogCaptureFixture, generation: int, foreign_first: bool
) -> None:
    owner = pool_of("node-b", 2)
    foreign = pool_of("node-a", 1, pool="node-b", generation=generation)
    own_a = pool_of("node-a", 1)
    with caplog.at_level(logging.WARNING):
        nodes = build_inventory(
            [*foreign, *owner, *own_a] if foreign_first else [*owner, *foreign, *own_a], DRIVER
        )
    assert devices(nodes, "node-b") == [
        DeviceId(DRIVER, "node-b", "gpu-0"),
        DeviceId(DRIVER, "node-b", "gpu-1"),
    ]
    assert devices(nodes, "node-a") == [DeviceId(DRIVER, "node-a", "gpu-0")]  # its own pool still counts
    assert (
        "pool node-b is published by node node-b and by node node-a; ignoring the slices of node node-a"
        in (caplog.text)
    )


def test_an_owner_whose_pool_is_incomplete_is_not_replaced_by_a_foreign_copy() -> None:
    owner = pool_of("node-b", 2)
    owner[0]["spec"]["pool"]["resourceSliceCount"] = 2  # mid-update: one of two slices written
    nodes = build_inventory([*owner, *pool_of("node-a", 1, pool="node-b")], DRIVER)
    assert devices(nodes, "node-a") == [] and devices(nodes, "node-b") == []


def test_a_pool_named_after_no_node_goes_to_the_first_node_by_name_whatever_the_order() -> None:
    first = pool_of("node-a", 1, pool="shared")
    second = pool_of("node-c", 2, pool="shared")
    for order in ([*first, *second], [*second, *first]):
        nodes = build_inventory(order, DRIVER)
        assert devices(nodes, "node-a") == [DeviceId(DRIVER, "shared", "gpu-0")]
        assert devices(nodes, "node-c") == []


def test_the_same_device_names_in_each_nodes_own_pool_are_distinct_devices() -> None:
    nodes = build_inventory([*pool_of("node-a", 2), *pool_of("node-b", 2)], DRIVER)
    assert [d.pool for d in nodes["node-a"].devices] == ["node-a", "node-a"]
    assert [d.pool for d in nodes["node-b"].devices] == ["node-b", "node-b"]


@pytest.mark.parametrize(
    ("pool", "nodes", "owner"),
    [
        ("node-b", ["node-a", "node-b"], "node-b"),
        ("node-b/extra", ["node-a", "node-b"], "node-b"),
        ("node-bb", ["node-b", "node-a"], "node-a"),  # a name prefix is not ownership
        ("shared", ["node-z", "node-c"], "node-c"),
    ],
)
def test_pool_owner(pool: str, nodes: list[str], owner: str) -> None:
    assert pool_owner(pool, nodes) == owner


@pytest.mark.parametrize(
    ("isolation", "enforced"), [("hami-core", True), ("simulated", True), ("none", False), (None, False)]
)
def test_shares_count_as_enforced_only_where_the_slice_says_so(isolation: str | None, enforced: bool) -> None:
    """An unknown isolation (a plugin older than the attribute) is not enforced: shares need proof."""
    (slice_,) = build_resource_slices(
        profile_gpus("t4", node_name="n1", gpus=1), node_name="n1", driver_name=DRIVER
    )
    attributes = slice_["spec"]["devices"][0]["attributes"]
    attributes.pop("isolation")
    if isolation is not None:
        attributes["isolation"] = {"string": isolation}
    (card,) = [device.card for device in build_inventory([slice_], DRIVER)["n1"].devices.values()]
    assert card.shares_enforced is enforced


@pytest.mark.parametrize(
    ("mode", "whole_only"),
    [("Default", False), ("Exclusive_Process", True), ("Prohibited", True), (None, False)],
)
def test_a_card_whose_compute_mode_forbids_sharing_is_whole_only(mode: str | None, whole_only: bool) -> None:
    """No ``computeMode`` (a plugin older than the attribute, or NVML did not say) shares as before."""
    (slice_,) = build_resource_slices(
        profile_gpus("t4", node_name="n1", gpus=1), node_name="n1", driver_name=DRIVER
    )
    attributes = slice_["spec"]["devices"][0]["attributes"]
    attributes.pop("computeMode")
    if mode is not None:
        attributes["computeMode"] = {"string": mode}
    (card,) = [device.card for device in build_inventory([slice_], DRIVER)["n1"].devices.values()]
    assert card.whole_only is whole_only


def test_a_rebuild_keeps_the_devices_of_unchanged_slices() -> None:
    """A slice change re-reads that slice only: other devices (and their CEL inputs) are kept."""
    node_a, node_b = pool_of("node-a", 2), pool_of("node-b", 2)
    first = build_inventory([*node_a, *node_b], DRIVER)
    kept = first["node-a"].device_at(0)
    cel = kept.cel
    changed = copy.deepcopy(node_b)
    changed[0]["spec"]["devices"][0]["attributes"]["healthy"] = {"bool": False}
    second = build_inventory([*node_a, *changed], DRIVER, previous=first)
    assert second["node-a"].device_at(0) is kept and kept.cel is cel
    assert second["node-b"].device_at(0).card.healthy is False, "the changed slice is read anew"
    assert second == build_inventory([*node_a, *changed], DRIVER), "the same inventory as from scratch"
    assert build_inventory(node_b, DRIVER, previous=first).keys() == {"node-b"}
