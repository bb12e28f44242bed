"""The plugin's Warning events on its Node (``node_events.py``), now events.k8s.io/v1 Events.

``kubectl describe node`` finds a node's events by kind, name and uid, so the Event names the Node
with its uid (read from the API when the caller does not know it); a problem that comes back after
it was cleared counts on the same Event's series.
"""

from __future__ import annotations

from typing import Any

from dra_driver.kube.api import EVENTS, EVENTS_V1, NODES, Kube
from dra_driver.kubeletplugin.node_events import ACTION, NodeEvents
from tests.controller.fake_kube import FakeKube
from tests.kubeletplugin.conftest import DRIVER, NODE


def test_a_warning_names_the_node_and_the_plugin() -> None:
    kube = FakeKube()
    NodeEvents(kube, "node-1", "gpu.hami.io").warn("DevicePluginPresent", "2 GPU(s) not published", "uid-1")
    (event,) = kube.list(EVENTS_V1)["items"]
    assert event["metadata"]["namespace"] == "default"
    assert event["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1"}
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "DevicePluginPresent", ACTION)
    assert event["reportingController"] == "gpu.hami.io/kubelet-plugin"
    assert event["reportingInstance"] == "node-1"
    assert event["note"] == "2 GPU(s) not published"


def test_the_same_message_is_posted_once_and_a_comeback_counts_on_the_series() -> None:
    kube = FakeKube()
    events = NodeEvents(kube, "node-1", "gpu.hami.io")
    events.warn("NoToolkitSpec", "2 GPU(s) not published: no CDI spec", "uid-1")
    events.warn("NoToolkitSpec", "2 GPU(s) not published: no CDI spec", "uid-1")  # every recheck
    assert len(kube.writes("events")) == 1
    events.clear("NoToolkitSpec")
    events.warn("NoToolkitSpec", "2 GPU(s) not published: no CDI spec", "uid-1")
    (event,) = kube.list(EVENTS_V1)["items"]
    assert event["series"]["count"] == 2


def test_without_a_uid_the_node_is_read_once_for_it() -> None:
    kube = FakeKube()
    kube.put(NODES, {"metadata": {"name": "node-1", "uid": "uid-from-api"}})
    events = NodeEvents(kube, "node-1", "gpu.hami.io")
    events.warn("SharesNotEnforced", "shares of 4 GPU(s) are not enforced", None)
    events.warn("NoToolkitSpec", "no CDI spec", None)
    uids = [e["regarding"]["uid"] for e in kube.list(EVENTS_V1)["items"]]
    assert uids == ["uid-from-api", "uid-from-api"]
    assert [c for c in kube.calls if c[0] == "get"] == [("get", "nodes", "node-1")]


def test_an_unreadable_node_or_a_refused_event_stops_nothing() -> None:
    kube = FakeKube()  # no Node: 404
    NodeEvents(kube, "node-1", "gpu.hami.io").warn("SharesNotEnforced", "not enforced", None)
    (event,) = kube.list(EVENTS_V1)["items"]
    assert "uid" not in event["regarding"]
    kube.fail("create", "events", 403, "forbidden")
    NodeEvents(kube, "node-2", "gpu.hami.io").warn("SharesNotEnforced", "not enforced", "uid-2")  # no raise
    assert len(kube.list(EVENTS_V1)["items"]) == 1


def test_the_api_server_accepts_it_and_describe_node_finds_it(api_client: Any) -> None:
    kube = Kube(api_client)
    uid = kube.get(NODES, None, NODE)["metadata"]["uid"]
    NodeEvents(kube, NODE, DRIVER).warn("DevicePluginPresent", "4 GPU(s) not published", None)
    # kubectl describe node's query (core/v1, as kubectl reads events).
    selector = f"involvedObject.kind=Node,involvedObject.name={NODE},involvedObject.uid={uid}"
    (event,) = kube.list(EVENTS, field_selector=selector)["items"]
    assert event["metadata"]["namespace"] == "default" and event["message"] == "4 GPU(s) not published"
    assert event["reason"] == "DevicePluginPresent" and event["type"] == "Warning"
