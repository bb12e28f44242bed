"""One read of the Node for the withheld check and the slice publisher (``kubeletplugin/node.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import NODES, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.kubeletplugin.node import NodeReader
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from tests.kubeletplugin.conftest import NODE, Dirs, plugin_options
from tests.kubeletplugin.test_publisher import slices
from tests.waiting import wait_for


class Nodes:
    """A KubeApi with one Node (or an error), counting the reads."""

    def __init__(self, node: dict[str, Any] | None = None, error: int | None = None) -> None:
        self.node = node
        self.error = error
        self.reads = 0

    def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        assert (resource, namespace, name) == (NODES, None, NODE)
        self.reads += 1
        if self.error is not None:
            raise KubeError(self.error, "nope")
        if self.node is None:
            raise KubeError(404, f'nodes "{name}" not found')
        return self.node


def test_the_uid_comes_from_the_last_read_and_is_read_only_when_unknown() -> None:
    api = Nodes({"metadata": {"name": NODE, "uid": "u-1"}})
    reader = NodeReader(api, NODE)  # type: ignore[arg-type]
    assert reader.read()["metadata"]["uid"] == "u-1"
    assert reader.uid() == reader.uid() == "u-1" and api.reads == 1
    fresh = NodeReader(api, NODE)  # type: ignore[arg-type]
    assert fresh.uid() == "u-1" and fresh.uid() == "u-1" and api.reads == 2


def test_a_missing_node_has_no_uid_yet_and_other_errors_propagate() -> None:
    missing = Nodes()
    reader = NodeReader(missing, NODE)  # type: ignore[arg-type]
    assert reader.uid() is None and reader.uid() is None and missing.reads == 2  # asked again later
    missing.node = {"metadata": {"uid": "u-2"}}
    assert reader.uid() == "u-2"
    with pytest.raises(KubeError):
        NodeReader(Nodes(error=503), NODE).uid()  # type: ignore[arg-type]


def test_the_withheld_check_and_the_publisher_share_one_reader(dirs: Dirs, api_client: Any) -> None:
    plugin = KubeletPlugin(
        plugin_options(dirs, publish=True), profile_gpus("t4", node_name=NODE, gpus=1), api_client
    )
    assert plugin.node is not None
    api = Nodes({"metadata": {"uid": "u-3"}, "status": {"allocatable": {}}})
    plugin.node.kube = api  # type: ignore[assignment]
    assert plugin._read_node()["metadata"]["uid"] == "u-3"  # what the withheld check reads
    plugin.start()
    try:
        (published,) = wait_for(lambda: slices(api_client))
    finally:
        plugin.stop()
    assert published["metadata"]["ownerReferences"][0]["uid"] == "u-3"
    assert api.reads == 1, "the publisher used the Node the check had read"
