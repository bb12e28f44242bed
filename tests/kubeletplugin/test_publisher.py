"""ResourceSlice publishing against the sandbox API server (real HTTP, real kubernetes client)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.publisher import SlicePublisher
from tests.kubeletplugin.conftest import NODE, Dirs, plugin_options
from tests.kubeletplugin.helpers import DRIVER
from tests.waiting import wait_for


def slices(api_client: Any) -> list[dict[str, Any]]:
    response = k8s.ResourceV1Api(api_client).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items


@pytest.fixture
def publishing(dirs: Dirs, api_client: Any) -> Iterator[KubeletPlugin]:
    plugin = KubeletPlugin(
        plugin_options(dirs, publish=True), profile_gpus("h100-80gb", node_name=NODE, gpus=8), api_client
    )
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


def test_publishes_valid_pool_owned_by_node(publishing: KubeletPlugin, api_client: Any) -> None:
    import kubernetes_validate

    (published,) = wait_for(lambda: slices(api_client))
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, NODE, NODE)
    assert spec["pool"]["resourceSliceCount"] == 1 and spec["pool"]["generation"] >= 1
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert all(d.get("allowMultipleAllocations") for d in spec["devices"])
    assert published["metadata"]["ownerReferences"][0]["kind"] == "Node"
    body = {k: v for k, v in published.items() if k in ("apiVersion", "kind", "spec")}
    body["metadata"] = {"name": published["metadata"]["name"]}
    kubernetes_validate.validate(body, "1.34.0", strict=True)


def test_recreated_after_kubelet_deletes_it(publishing: KubeletPlugin, api_client: Any) -> None:
    (first,) = wait_for(lambda: slices(api_client))
    k8s.ResourceV1Api(api_client).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={NODE}", _preload_content=False
    )
    (again,) = wait_for(
        lambda: [s for s in slices(api_client) if s["metadata"]["uid"] != first["metadata"]["uid"]]
    )
    assert again["spec"]["devices"] == first["spec"]["devices"]


def test_health_change_bumps_generation_and_taints(
    publishing: KubeletPlugin, api_client: Any, dirs: Dirs
) -> None:
    (first,) = wait_for(lambda: slices(api_client))
    generation = first["spec"]["pool"]["generation"]
    dirs.health.write_text("gpu-5: {healthy: false, message: XID 79}\n")

    def tainted() -> dict[str, Any] | None:
        for s in slices(api_client):
            device = s["spec"]["devices"][5]
            if any(t["key"] == f"{DRIVER}/unhealthy" for t in device.get("taints") or []):
                return s
        return None

    updated = wait_for(tainted)
    assert updated["spec"]["pool"]["generation"] == generation + 1
    assert updated["spec"]["devices"][5]["attributes"]["healthy"] == {"bool": False}
    assert len(slices(api_client)) == 1  # never two generations of the pool
    dirs.health.write_text("{}\n")
    healed = wait_for(
        lambda: [s for s in slices(api_client) if s["spec"]["pool"]["generation"] == generation + 2]
    )
    assert not any(
        t["key"] == f"{DRIVER}/unhealthy" for t in healed[0]["spec"]["devices"][5].get("taints") or []
    )


def test_health_monitoring_is_published_per_gpu(publishing: KubeletPlugin, api_client: Any) -> None:
    (published,) = wait_for(lambda: slices(api_client))
    monitored = {d["attributes"]["healthMonitored"]["bool"] for d in published["spec"]["devices"]}
    assert monitored == {True}, "the health file speaks for every GPU"


def test_health_checks_off_publish_every_gpu_unmonitored_and_healthy(
    dirs: Dirs, api_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dirs.health.write_text("gpu-1: unhealthy\n")  # not read: checks are off
    gpus = profile_gpus("h100-80gb", node_name=NODE, gpus=2)
    plugin = KubeletPlugin(plugin_options(dirs, publish=True, health_checks=False), gpus, api_client)
    with caplog.at_level(logging.WARNING):
        plugin.start()
    try:
        (published,) = wait_for(lambda: slices(api_client))
        attributes = [d["attributes"] for d in published["spec"]["devices"]]
        assert [(a["healthy"], a["healthMonitored"]) for a in attributes] == [
            ({"bool": True}, {"bool": False})
        ] * 2
        assert "GPU health checks are off (--health-checks=false)" in caplog.text
    finally:
        plugin.stop()


def test_sync_without_change_writes_nothing(publishing: KubeletPlugin, api_client: Any) -> None:
    (first,) = wait_for(lambda: slices(api_client))
    assert publishing.publisher is not None
    assert publishing.publisher.sync() is False
    (same,) = slices(api_client)
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_feature_gate_warnings(api_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    publisher = SlicePublisher(
        api_client,
        driver_name=DRIVER,
        node_name=NODE,
        gpus=lambda: profile_gpus("t4", node_name=NODE, gpus=1),
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
