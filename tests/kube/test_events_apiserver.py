"""``EventRecorder`` against a real kube-apiserver: what it accepts and shows.

The run's own etcd + kube-apiserver (tests/apiserver_fixtures.py), one namespace per test: the
recorder writes events.k8s.io/v1 Events, which the API server checks with its strict rules for
that group and serves also as core/v1 Events, so these tests say the recorder's Events pass a real
API server and that readers of core/v1 events (``kubectl get events``, ``kubectl describe``) see them.
(They ran against the sandbox API server before, which had to learn each rule; the generateName
rule below was one it learned only from the real cluster.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from subprocess import CompletedProcess
from typing import Any

import pytest

from dra_driver.kube.api import EVENTS, EVENTS_V1, NODES, PODS, Kube, Resource
from dra_driver.kube.errors import Invalid, KubeError
from dra_driver.kube.events import EventRecorder

Kubectl = Callable[..., CompletedProcess[str]]


@pytest.fixture
def kube(api_kube: Kube) -> Kube:
    return api_kube


@pytest.fixture
def ns(api_namespace: str) -> str:
    return api_namespace


def listed(
    kube: Kube, resource: Resource, namespace: str, selector: str | None = None
) -> list[dict[str, Any]]:
    """The items of one namespace (the server is shared: never a list across all of them)."""
    scope = f"metadata.namespace={namespace}"
    items: list[dict[str, Any]] = kube.list(
        resource, field_selector=f"{scope},{selector}" if selector else scope
    )["items"]
    return items


@pytest.fixture
def web(kube: Kube, ns: str) -> dict[str, Any]:
    return kube.create(
        PODS,
        ns,
        {"metadata": {"name": "web-0"}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}},
    )


@pytest.fixture
def recorder(kube: Kube) -> Iterator[EventRecorder]:
    yield EventRecorder(kube, controller="gpu.hami.io/controller", instance="controller-0")


def test_created_and_counted_events_pass_the_strict_rules(
    kube: Kube, ns: str, recorder: EventRecorder, web: dict[str, Any]
) -> None:
    for _ in range(3):
        recorder.emit(web, "Normal", "Allocated", "Allocate", "node-1/gpu-0 (t4): 4096Mi")

    (event,) = listed(kube, EVENTS_V1, ns)
    assert event["series"]["count"] == 3 and event["note"] == "node-1/gpu-0 (t4): 4096Mi"
    assert event["regarding"]["uid"] == web["metadata"]["uid"]
    # The same object through core/v1, found by the field selectors kubectl describe uses.
    selector = (
        f"involvedObject.name=web-0,involvedObject.uid={web['metadata']['uid']},involvedObject.kind=Pod"
    )
    (core,) = listed(kube, EVENTS, ns, selector)
    assert core["message"] == event["note"] and core["series"] == event["series"]
    assert core["metadata"]["resourceVersion"] == event["metadata"]["resourceVersion"]
    # events.k8s.io/v1's own field labels.
    assert listed(kube, EVENTS_V1, ns, "regarding.name=web-0,reportingController=gpu.hami.io/controller")
    assert not listed(kube, EVENTS_V1, ns, "regarding.name=other")


def test_an_event_about_a_node_is_accepted_in_default(kube: Kube, ns: str, recorder: EventRecorder) -> None:
    node = kube.create(NODES, None, {"metadata": {"name": f"node-{ns}"}})
    recorder.emit(node, "Warning", "DevicePluginPresent", "PublishDevices", "4 GPU(s) not published")
    (event,) = listed(kube, EVENTS_V1, "default", f"regarding.name=node-{ns}")
    assert event["metadata"]["namespace"] == "default" and "namespace" not in event["regarding"]


def _v1_event(ns: str, **changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "metadata": {"name": "web-0.18a2b3c4d5e6f708", "namespace": ns},
        "eventTime": "2026-03-01T12:00:00.000000Z",
        "reportingController": "gpu.hami.io/controller",
        "reportingInstance": "controller-0",
        "action": "Allocate",
        "reason": "Allocated",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "namespace": ns},
        "note": "gpu-0",
        "type": "Normal",
    }
    event.update(changes)
    return event


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"eventTime": None}, "eventTime"),
        ({"type": "Error"}, "type"),
        ({"deprecatedCount": 2}, "count"),
        ({"series": {"count": 1, "lastObservedTime": "2026-03-01T12:00:01.000000Z"}}, "series.count"),
        ({"reportingController": ""}, "reportingController"),
        ({"action": ""}, "action"),
        ({"note": "x" * 1025}, "message"),
        (  # a cluster-scoped object's events belong in default (or kube-system)
            {
                "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-1"},
                "metadata": {"name": "node-1.18a2b3c4d5e6f708", "namespace": "kube-public"},
            },
            "involvedObject.namespace",
        ),
        # kube-apiserver validates a v1 Event's generateName as a whole subdomain: "web-0." is refused.
        ({"metadata": {"generateName": "web-0."}}, "metadata.generateName"),
    ],
)
def test_kube_apiserver_refuses_events_that_break_its_rules(
    kube: Kube, ns: str, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(Invalid) as refused:
        changes = dict(changes)
        if "metadata" in changes and "namespace" not in changes["metadata"]:
            changes["metadata"] = {**changes["metadata"], "namespace": ns}
        event = _v1_event(ns, **changes)
        kube.create(EVENTS_V1, event["metadata"]["namespace"], event)
    assert field in refused.value.message


def test_only_the_series_of_an_event_may_change(kube: Kube, ns: str) -> None:
    created = kube.create(EVENTS_V1, ns, _v1_event(ns))
    created["series"] = {"count": 2, "lastObservedTime": "2026-03-01T12:00:09.000000Z"}
    del created["metadata"]["resourceVersion"]  # unconditional, as the recorder writes it
    assert kube.update(EVENTS_V1, created)["series"]["count"] == 2
    created["note"] = "gpu-1"
    with pytest.raises(KubeError) as refused:
        kube.update(EVENTS_V1, created)
    assert refused.value.status == 422 and "message: Invalid value" in refused.value.message


def test_legacy_core_events_are_still_accepted(kube: Kube, ns: str) -> None:
    event = {
        "metadata": {"generateName": "web-0.", "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "namespace": ns},
        "reason": "Scheduled",
        "message": "assigned",
        "type": "Normal",
        "source": {"component": "default-scheduler"},
        "count": 1,
    }
    kube.create(EVENTS, ns, event)
    (seen,) = listed(kube, EVENTS_V1, ns)
    assert seen["note"] == "assigned" and seen["deprecatedSource"] == {"component": "default-scheduler"}
    assert seen["eventTime"] is None
    bad = dict(event, metadata={"generateName": "web-0.", "namespace": "kube-public"})
    with pytest.raises(Invalid, match=r"involvedObject\.namespace"):
        kube.create(EVENTS, "kube-public", bad)


def test_a_watch_of_events_k8s_io_shows_that_shape(
    kube: Kube, ns: str, recorder: EventRecorder, web: dict[str, Any]
) -> None:
    scope = f"metadata.namespace={ns}"
    start = kube.list(EVENTS_V1, field_selector=scope)["metadata"]["resourceVersion"]
    recorder.emit(web, "Normal", "Allocated", "Allocate", "gpu-0")
    recorder.emit(web, "Normal", "Allocated", "Allocate", "gpu-0")
    seen = []
    for change in kube.watch(EVENTS_V1, start, timeout_seconds=5, field_selector=scope):
        if change["type"] != "BOOKMARK":
            seen.append(
                (change["type"], change["object"]["note"], change["object"].get("series", {}).get("count"))
            )
        if len(seen) == 2:
            break
    assert seen == [("ADDED", "gpu-0", None), ("MODIFIED", "gpu-0", 2)]


def test_kubectl_sees_the_events(
    api_kubectl: Kubectl, ns: str, recorder: EventRecorder, web: dict[str, Any]
) -> None:
    kubectl = api_kubectl
    for _ in range(4):
        recorder.emit(web, "Warning", "FailedAllocation", "Allocate", "0/1 nodes: 1 CardInsufficientMemory")
    table = kubectl("get", "events", "-n", ns).stdout
    assert "FailedAllocation" in table and "pod/web-0" in table and "CardInsufficientMemory" in table
    described = kubectl("describe", "pod", "web-0", "-n", ns).stdout
    assert "FailedAllocation" in described and "x4 over" in described
    shown = json.loads(kubectl("get", "events.v1.events.k8s.io", "-n", ns, "-o", "json").stdout)
    (event,) = shown["items"]
    assert event["apiVersion"] == "events.k8s.io/v1" and event["series"]["count"] == 4
