"""ResourceSlice publishing against a real kube-apiserver (the shared tier, tests/apiserver_fixtures.py).

The node and the driver are the test's own (``api_namespace``-named node, ``api_driver``): the
slices of other tests' plugins are neither listed nor touched. The tier runs the DRA feature gates
the cluster runs, so what the server keeps of a slice (consumable capacity, device taints) is
what a real cluster keeps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_driver.contract import policy_taint_key, unhealthy_taint_key
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import NODES, Kube
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.publisher import SlicePublisher
from tests.apiserver_fixtures import create_ready_node
from tests.kubeletplugin.conftest import NODE, Dirs, plugin_options
from tests.waiting import wait_for


@dataclass(frozen=True)
class Node:
    """The test's node on the shared server and the driver its plugin publishes for."""

    api_client: Any
    name: str
    driver: str


@pytest.fixture
def node(apiserver_client: Any, api_kube: Kube, api_namespace: str, api_driver: str) -> Node:
    name = f"{api_namespace}-node"
    create_ready_node(api_kube, {"apiVersion": NODES.api_version, "kind": "Node", "metadata": {"name": name}})
    # A short driver name of the test's own: the plugin's sockets are named after it, and a Unix
    # socket path has at most 107 bytes (``api_driver`` ends in the random part).
    return Node(apiserver_client, name, f"p{api_driver.split('.')[0][-4:]}.test.hami.io")


def slices(api_client: Any, node_name: str = NODE) -> list[dict[str, Any]]:
    """The ResourceSlices of ``node_name`` (the kubelet plugin's other suites read theirs too)."""
    response = k8s.ResourceV1Api(api_client).list_resource_slice(
        field_selector=f"spec.nodeName={node_name}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


def node_slices(node: Node) -> list[dict[str, Any]]:
    return slices(node.api_client, node.name)


def options(dirs: Dirs, node: Node, **overrides: Any) -> Any:
    return plugin_options(dirs, node_name=node.name, driver_name=node.driver, **overrides)


@pytest.fixture
def publishing(dirs: Dirs, node: Node) -> Iterator[KubeletPlugin]:
    plugin = KubeletPlugin(
        options(dirs, node, publish=True),
        profile_gpus("h100-80gb", node_name=node.name, gpus=8),
        node.api_client,
    )
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


def test_publishes_valid_pool_owned_by_node(publishing: KubeletPlugin, node: Node) -> None:
    import kubernetes_validate

    (published,) = wait_for(lambda: node_slices(node))
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (node.driver, node.name, node.name)
    assert spec["pool"]["resourceSliceCount"] == 1 and spec["pool"]["generation"] >= 1
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert all(d.get("allowMultipleAllocations") for d in spec["devices"])
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node.name)
    # The server kept every field the plugin sent (the tier runs the cluster's DRA feature gates).
    assert all(
        "consumesCounters" not in d and d["capacity"]["memory"].get("requestPolicy") for d in spec["devices"]
    )
    # Items of a list carry no apiVersion and kind on a real server (the sandbox added them).
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}
    body["metadata"] = {"name": published["metadata"]["name"]}
    kubernetes_validate.validate(body, "1.34.0", strict=True)


def test_recreated_after_kubelet_deletes_it(publishing: KubeletPlugin, node: Node) -> None:
    (first,) = wait_for(lambda: node_slices(node))
    k8s.ResourceV1Api(node.api_client).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={node.name}", _preload_content=False
    )
    (again,) = wait_for(
        lambda: [s for s in node_slices(node) if s["metadata"]["uid"] != first["metadata"]["uid"]]
    )
    assert again["spec"]["devices"] == first["spec"]["devices"]


def taint_times(slice_: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {
        (d["name"], t["key"]): t["timeAdded"]
        for d in slice_["spec"]["devices"]
        for t in d.get("taints") or []
    }


def test_a_taint_keeps_the_time_it_was_added(publishing: KubeletPlugin, node: Node, dirs: Dirs) -> None:
    """A NoExecute toleration's seconds count from ``timeAdded``: a republish (an update on a health
    change, a re-creation after kubelet deleted the slice) must not restart a taint's clock."""
    (first,) = wait_for(lambda: node_slices(node))
    policy, unhealthy = policy_taint_key(node.driver), unhealthy_taint_key(node.driver)
    assert {key for _, key in taint_times(first)} == {policy}, "every GPU is policy-managed"
    # The slice as an earlier publish long ago left it: only the taints' times differ, so the
    # publisher has nothing to write (its content hash ignores the times).
    long_ago = "2020-01-01T00:00:00Z"
    for device in first["spec"]["devices"]:
        for taint in device["taints"]:
            taint["timeAdded"] = long_ago
    api = k8s.ResourceV1Api(node.api_client)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **first}
    api.replace_resource_slice(first["metadata"]["name"], body, _preload_content=False)

    dirs.health.write_text("gpu-5: {healthy: false, message: XID 79}\n")
    generation = first["spec"]["pool"]["generation"]
    (updated,) = wait_for(
        lambda: [s for s in node_slices(node) if s["spec"]["pool"]["generation"] == generation + 1]
    )
    times = taint_times(updated)
    assert {times[(f"gpu-{i}", policy)] for i in range(8)} == {long_ago}
    assert times[("gpu-5", unhealthy)] != long_ago, "a new taint is stamped when it is added"

    api.delete_collection_resource_slice(field_selector=f"spec.nodeName={node.name}", _preload_content=False)
    (again,) = wait_for(
        lambda: [s for s in node_slices(node) if s["metadata"]["uid"] != updated["metadata"]["uid"]]
    )
    assert taint_times(again) == times


def test_health_change_bumps_generation_and_taints(publishing: KubeletPlugin, node: Node, dirs: Dirs) -> None:
    (first,) = wait_for(lambda: node_slices(node))
    generation = first["spec"]["pool"]["generation"]
    dirs.health.write_text("gpu-5: {healthy: false, message: XID 79}\n")

    def tainted() -> dict[str, Any] | None:
        for s in node_slices(node):
            device = s["spec"]["devices"][5]
            if any(t["key"] == f"{node.driver}/unhealthy" for t in device.get("taints") or []):
                return s
        return None

    updated = wait_for(tainted)
    assert updated["spec"]["pool"]["generation"] == generation + 1
    assert updated["spec"]["devices"][5]["attributes"]["healthy"] == {"bool": False}
    assert len(node_slices(node)) == 1  # never two generations of the pool
    dirs.health.write_text("{}\n")
    healed = wait_for(
        lambda: [s for s in node_slices(node) if s["spec"]["pool"]["generation"] == generation + 2]
    )
    assert not any(
        t["key"] == f"{node.driver}/unhealthy" for t in healed[0]["spec"]["devices"][5].get("taints") or []
    )


def test_health_monitoring_is_published_per_gpu(publishing: KubeletPlugin, node: Node) -> None:
    (published,) = wait_for(lambda: node_slices(node))
    monitored = {d["attributes"]["healthMonitored"]["bool"] for d in published["spec"]["devices"]}
    assert monitored == {True}, "the health file speaks for every GPU"


def test_health_checks_off_publish_every_gpu_unmonitored_and_healthy(
    dirs: Dirs, node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    dirs.health.write_text("gpu-1: unhealthy\n")  # not read: checks are off
    gpus = profile_gpus("h100-80gb", node_name=node.name, gpus=2)
    plugin = KubeletPlugin(options(dirs, node, publish=True, health_checks=False), gpus, node.api_client)
    with caplog.at_level(logging.WARNING):
        plugin.start()
    try:
        (published,) = wait_for(lambda: node_slices(node))
        attributes = [d["attributes"] for d in published["spec"]["devices"]]
        assert [(a["healthy"], a["healthMonitored"]) for a in attributes] == [
            ({"bool": True}, {"bool": False})
        ] * 2
        assert "GPU health checks are off (--health-checks=false)" in caplog.text
    finally:
        plugin.stop()


def test_sync_without_change_writes_nothing(publishing: KubeletPlugin, node: Node) -> None:
    (first,) = wait_for(lambda: node_slices(node))
    assert publishing.publisher is not None
    assert publishing.publisher.sync() is False
    (same,) = node_slices(node)
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_feature_gate_warnings(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    publisher = SlicePublisher(
        node.api_client,
        driver_name=node.driver,
        node_name=node.name,
        gpus=lambda: profile_gpus("t4", node_name=node.name, gpus=1),
    )
    sent = publisher.desired(1)
    device = sent[0]["spec"]["devices"][0]
    stripped = {k: v for k, v in device.items() if k not in ("allowMultipleAllocations", "taints")}
    stripped["capacity"] = {k: {"value": v["value"]} for k, v in device["capacity"].items()}
    stored = [{"spec": {"devices": [stripped]}}]
    with caplog.at_level(logging.WARNING):
        publisher._check_feature_gates(sent, stored)
        publisher._check_feature_gates(sent, stored)
    assert caplog.text.count("dropped allowMultipleAllocations") == 1  # said once, with how to enable it
    assert "--feature-gates=DRAConsumableCapacity=true" in caplog.text
    assert not publisher.consumable_capacity_supported and not publisher.taints_supported
    assert "taints" not in json.dumps(publisher.desired(2))


def test_a_server_with_the_dra_feature_gates_keeps_what_is_published(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The other side of the warnings: the tier's kube-apiserver runs DRAConsumableCapacity and
    DRADeviceTaints, so a sync stores every field and the publisher warns of nothing."""
    publisher = SlicePublisher(
        node.api_client,
        driver_name=node.driver,
        node_name=node.name,
        gpus=lambda: profile_gpus("t4", node_name=node.name, gpus=1),
    )
    with caplog.at_level(logging.WARNING):
        assert publisher.sync() is True
    assert publisher.consumable_capacity_supported and publisher.taints_supported
    assert "dropped" not in caplog.text
    (stored,) = node_slices(node)
    assert stored["spec"]["devices"][0]["allowMultipleAllocations"] is True


def on_demand_cards(node_name: str) -> list:
    from dataclasses import replace

    from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection

    cards = [replace(g, mig_enabled=True) for g in profile_gpus("h100-80gb", node_name=node_name, gpus=4)]
    return mark_on_demand(cards, parse_selection("all"))


def test_mig_on_demand_placements_and_counters_are_kept_by_the_server(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The tier's server validates partitionable devices for real: the counter sets and each
    placement's consumption are stored in the layout its version takes, and nothing is dropped."""
    publisher = SlicePublisher(
        node.api_client, driver_name=node.driver, node_name=node.name, gpus=lambda: on_demand_cards(node.name)
    )
    with caplog.at_level(logging.WARNING):
        assert publisher.sync() is True
    assert publisher.partitionable_supported and "dropped" not in caplog.text
    stored = node_slices(node)
    sets = [cs["name"] for s in stored for cs in s["spec"].get("sharedCounters") or []]
    assert sorted(sets) == ["gpu-0-mig", "gpu-1-mig", "gpu-2-mig", "gpu-3-mig"]
    devices = [d for s in stored for d in s["spec"].get("devices") or []]
    assert len(devices) == 4 * 18 and all(d["consumesCounters"] for d in devices)
    assert publisher.sync() is False  # what the server normalised hashes the same


def test_without_counters_on_demand_cards_fall_back_to_static(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = SlicePublisher(
        node.api_client, driver_name=node.driver, node_name=node.name, gpus=lambda: on_demand_cards(node.name)
    )
    sent = publisher.desired(1)
    stored = [
        {"spec": {k: v for k, v in s["spec"].items() if k != "sharedCounters"}}
        for s in sent
        if s["spec"].get("devices")
    ]
    for slice_ in stored:
        slice_["spec"]["devices"] = [
            {k: v for k, v in d.items() if k != "consumesCounters"} for d in slice_["spec"]["devices"]
        ]
    with caplog.at_level(logging.WARNING):
        publisher._check_feature_gates(sent, stored)
        publisher._check_feature_gates(sent, stored)
    assert caplog.text.count("dropped sharedCounters/consumesCounters") == 1
    assert "--feature-gates=DRAPartitionableDevices=true" in caplog.text
    assert not publisher.partitionable_supported
    again = json.dumps(publisher.desired(2))
    assert "sharedCounters" not in again and "onDemand" not in again
