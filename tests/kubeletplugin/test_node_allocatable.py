"""The device-plugin check reads a Node's allocatable through ``NodeView`` (``plugin.check_withheld``):
the count is the one the raw ``status.allocatable`` gives, whatever is published there."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.kubeletplugin.withheld import device_plugin_gpus
from dra_driver.resource.nodes import NodeView


@pytest.mark.parametrize(
    ("node", "count"),
    [
        ({}, 0),
        ({"status": {}}, 0),
        ({"status": {"allocatable": None}}, 0),
        ({"status": {"allocatable": {"cpu": "4"}}}, 0),
        ({"status": {"allocatable": {"nvidia.com/gpu": "0"}}}, 0),
        ({"status": {"allocatable": {"nvidia.com/gpu": "8"}}}, 8),
        ({"status": {"allocatable": {"nvidia.com/gpu": 8}}}, 8),
        ({"status": {"allocatable": {"nvidia.com/gpu": "1500m"}}}, 1),
        ({"status": {"allocatable": {"nvidia.com/gpu": "not-a-number"}}}, 0),
        ({"status": {"allocatable": {"nvidia.com/gpu": None}}}, 0),
        ({"status": {"allocatable": {"nvidia.com/gpu": True}}}, 0),
    ],
)
def test_the_device_plugins_gpus_read_through_the_node_view_match_the_raw_allocatable(
    node: dict[str, Any], count: int
) -> None:
    assert device_plugin_gpus(NodeView.parse(node).allocatable_quantities) == count
    assert device_plugin_gpus((node.get("status") or {}).get("allocatable")) == count
