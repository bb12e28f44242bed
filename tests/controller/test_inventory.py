"""ResourceSlices as the engine's cards (dra_driver/controller/inventory.py): one card per (node,
index), NVLink peers. Pools and their generations: test_inventory_pools.py."""

from __future__ import annotations

import pytest

from dra_driver.contract import DeviceId
from dra_driver.controller.inventory import build_inventory, nvlink_pair_scores
from dra_driver.devices.simulated import profile_gpus
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.harness import DRIVER


def test_nvlink_peers_parse_into_pair_scores() -> None:
    assert nvlink_pair_scores("18:1-3;4:5") == {1: 1800, 2: 1800, 3: 1800, 5: 400}


def test_two_pools_of_one_node_with_the_same_gpu_index_keep_the_first_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine knows a card as (node, index): a second pool reusing an index would be the same
    card to it, so the inventory keeps one and says why; a placement maps back by index."""
    gpus = profile_gpus("t4", node_name="n1", gpus=2)
    first = build_resource_slices(gpus, node_name="n1", driver_name=DRIVER)
    second = build_resource_slices(gpus[:1], node_name="n1", driver_name=DRIVER, pool_name="n1-extra")
    second[0]["metadata"]["name"] = "n1-extra"
    nodes = build_inventory([*first, *second], DRIVER)
    assert sorted(nodes["n1"].devices) == [DeviceId(DRIVER, "n1", "gpu-0"), DeviceId(DRIVER, "n1", "gpu-1")]
    assert nodes["n1"].device_at(1).name == "gpu-1" and nodes["n1"].device_at(0).pool == "n1"
    assert "device n1-extra/gpu-0 has index 0 like n1/gpu-0; ignored" in caplog.text
