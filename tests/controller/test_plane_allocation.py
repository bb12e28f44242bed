"""The controller against the real control plane: kube-apiserver, kube-scheduler (which binds the
pods our controller ungates) and kube-controller-manager (claims from templates, reservations),
with Node objects kept Ready and no kubelet (tests/controller/harness.py ``plane_harness``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.config import ControllerDefaults
from dra_driver.controller import FINALIZER
from dra_driver.controller.allocation import node_selector
from dra_driver.controller.controller import Controller
from dra_driver.kube.api import NODES, RESOURCE_CLAIMS, Kube
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.apiserver_fixtures import kubectl_runner
from tests.controller.harness import (
    DRIVER,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)

INDEX = 'device.attributes["gpu.hami.io"].index == {}'


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane) as h:
        yield h


@pytest.fixture
def kubectl(controller_plane: ControlPlane, tmp_path: Any) -> Any:
    return kubectl_runner(controller_plane.kubeconfig_path, tmp_path)


def tenants(h: Harness, placements: dict[str, int]) -> None:
    """Pods with one 1000Mi claim each, pinned to a GPU index by a CEL selector; wait until bound."""
    for name, index in placements.items():
        h.create_claim(claim(name, request(memory="1000Mi", selectors=[INDEX.format(index)])))
        h.create_pod(pod(f"pod-{name}", {"gpu": f"claim:{name}"}))
    for name in placements:
        wait_for(lambda name=name: h.bound_node(f"pod-{name}"), what=f"pod-{name} bound")


def worked_example_cluster(h: Harness) -> None:
    h.publish("node-1", "t4", 4)
    h.create_class(device_class(DRIVER))
    h.create_class(device_class("gpu-mutex-binpack", {"policy": "mutex,binpack"}))
    h.create_class(device_class("gpu-binpack", {"policy": "binpack"}))


def test_worked_example_mutex_binpack_lands_on_gpu2(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    worked_example_cluster(harness)
    harness.start_controller()
    tenants(harness, {"a": 0, "b": 0, "c": 1})
    caplog.set_level(logging.INFO, logger="dra_driver.controller")
    harness.create_claim(claim("seed", request(klass="gpu-mutex-binpack", memory="1000Mi")))
    harness.create_pod(pod("seed-pod", {"gpu": "claim:seed"}))
    assert wait_for(lambda: harness.bound_node("seed-pod")) == "node-1"
    assert harness.devices_of("seed") == ["node-1/gpu-2"]
    allocation = harness.get_claim("seed")["status"]["allocation"]
    result = allocation["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "1000Mi", "cores": "0", "slots": "1"}
    assert result["request"] == "gpu" and result["driver"] == DRIVER and result["pool"] == "node-1"
    assert len(result["shareID"]) == 36
    assert allocation["devices"]["config"][0]["source"] == "FromClass"
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]
    assert FINALIZER in harness.get_claim("seed")["metadata"]["finalizers"]
    line = next(r.getMessage() for r in caplog.records if "claim default/seed" in r.getMessage())
    # HAMi's 3.302083 / 1.651042 over a T4's total; the profile publishes total minus reserved.
    assert "node-1/gpu-0=3.336273(ExclusiveDeviceAllocateConflict)" in line
    assert "node-1/gpu-1=1.668137(ExclusiveDeviceAllocateConflict)" in line
    assert "node-1/gpu-2=0.000000*" in line and "policy=mutex,binpack(class)" in line
    # Plain binpack on the same state picks gpu-0, as the seed says.
    harness.create_claim(claim("packed", request(klass="gpu-binpack", memory="1000Mi")))
    harness.create_pod(pod("packed-pod", {"gpu": "claim:packed"}))
    wait_for(lambda: harness.bound_node("packed-pod"))
    assert harness.devices_of("packed") == ["node-1/gpu-0"]


def test_pending_with_mutex_reason_then_scheduled_when_a_card_frees(harness: Harness, kubectl: Any) -> None:
    worked_example_cluster(harness)
    harness.start_controller()
    tenants(harness, {"a": 0, "b": 1, "c": 2, "d": 3})
    harness.create_claim(claim("excl", request(klass="gpu-mutex-binpack", memory="1000Mi")))
    harness.create_pod(pod("excl-pod", {"gpu": "claim:excl"}))
    wait_for(
        lambda: any("ExclusiveDeviceAllocateConflict" in m for m in harness.events("excl-pod")), what="event"
    )
    assert "4/4 ExclusiveDeviceAllocateConflict" in harness.events("excl-pod")[0]

    def our_condition() -> Any:  # written right after the event
        conditions = harness.get_pod("excl-pod")["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "gpu.hami.io/Allocated"), None)

    ours = wait_for(our_condition, what="pod condition")
    assert ours["status"] == "False" and "ExclusiveDeviceAllocateConflict" in ours["message"]
    assert not harness.allocated("excl") and harness.bound_node("excl-pod") is None
    described = kubectl("describe", "pod", "excl-pod").stdout
    assert "ExclusiveDeviceAllocateConflict" in described
    # Free gpu-2: delete its pod; the claim is released (allocation cleared, finalizer removed).
    harness.delete_pod("pod-c")
    # Released in two writes (allocation cleared, then finalizer removed): wait for both.
    wait_for(
        lambda: (
            not harness.allocated("c")
            and FINALIZER not in (harness.get_claim("c")["metadata"].get("finalizers") or [])
        ),
        what="claim c released and its finalizer removed",
    )
    assert wait_for(lambda: harness.bound_node("excl-pod"), what="excl-pod bound") == "node-1"
    assert harness.devices_of("excl") == ["node-1/gpu-2"]


def test_precedence_annotation_over_claim_over_class(harness: Harness) -> None:
    worked_example_cluster(harness)
    harness.start_controller()
    tenants(harness, {"a": 0, "b": 0, "c": 1})
    # class: mutex,binpack (gpu-2); claim: binpack (gpu-0); annotation: spread (the idle gpu-3).
    harness.create_claim(claim("by-class", request(klass="gpu-mutex-binpack", memory="1000Mi")))
    harness.create_claim(
        claim("by-claim", request(klass="gpu-mutex-binpack", memory="1000Mi"), config={"policy": "binpack"})
    )
    harness.create_pod(pod("p-class", {"gpu": "claim:by-class"}))
    wait_for(lambda: harness.bound_node("p-class"))
    assert harness.devices_of("by-class") == ["node-1/gpu-2"]
    harness.create_pod(pod("p-claim", {"gpu": "claim:by-claim"}))
    wait_for(lambda: harness.bound_node("p-claim"))
    assert harness.devices_of("by-claim") == ["node-1/gpu-0"]
    harness.create_claim(
        claim(
            "by-annotation", request(klass="gpu-mutex-binpack", memory="1000Mi"), config={"policy": "binpack"}
        )
    )
    harness.create_pod(
        pod("p-ann", {"gpu": "claim:by-annotation"}, annotations={"hami.io/gpu-scheduler-policy": "spread"})
    )
    wait_for(lambda: harness.bound_node("p-ann"))
    assert harness.devices_of("by-annotation") == ["node-1/gpu-3"]  # the only idle card left


def test_template_claims_numa_bind_and_first_available(harness: Harness) -> None:
    worked_example_cluster(harness)
    harness.create_class(device_class("gpu-numa", {"policy": "binpack", "numaBind": True}))
    harness.start_controller()
    tenants(harness, {"a": 0})
    harness.create_template("two-gpus", request(klass="gpu-numa", memory="2Gi", count=2))
    harness.create_pod(pod("numa-pod", {"gpu": "template:two-gpus"}))
    wait_for(lambda: harness.bound_node("numa-pod"), what="numa-pod bound")
    devices = harness.devices_of(harness.pod_claim("numa-pod")["metadata"]["name"])
    # binpack prefers gpu-0 (busy), but numaBind needs two cards on one NUMA node: gpu-0 and gpu-1.
    assert devices == ["node-1/gpu-0", "node-1/gpu-1"]
    first_available = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "huge", "deviceClassName": DRIVER, "capacity": {"requests": {"memory": "100Gi"}}},
            {"name": "small", "deviceClassName": DRIVER, "capacity": {"requests": {"memory": "1Gi"}}},
        ],
    }
    harness.create_claim({**claim("fa"), "spec": {"devices": {"requests": [first_available]}}})
    harness.create_pod(pod("fa-pod", {"gpu": "claim:fa"}))
    wait_for(lambda: harness.bound_node("fa-pod"))
    result = harness.get_claim("fa")["status"]["allocation"]["devices"]["results"][0]
    assert result["request"] == "gpu/small" and result["consumedCapacity"]["memory"] == "1Gi"


def test_cel_runtime_error_aborts_with_scheduler_message(harness: Harness) -> None:
    worked_example_cluster(harness)
    harness.start_controller()
    harness.create_claim(claim("bad", request(selectors=['device.attributes["gpu.hami.io"].nosuch == 1'])))
    harness.create_pod(pod("bad-pod", {"gpu": "claim:bad"}))
    wait_for(lambda: harness.events("bad-pod"), what="event")
    message = harness.events("bad-pod")[0]
    assert "claim default/bad: selector #0: CEL runtime error: no such key: nosuch" in message
    assert not harness.allocated("bad")


def test_claim_allocated_by_someone_else_is_counted(harness: Harness) -> None:
    worked_example_cluster(harness)
    harness.start_controller()
    # kube-scheduler style: an exclusive result (no shareID) on gpu-2, written by another allocator.
    other = harness.create_claim(claim("foreign"))
    other["status"] = {
        "allocation": {
            "allocationTimestamp": "2026-01-01T00:00:00Z",
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-2"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                ]
            },
        }
    }
    harness.kube.update(RESOURCE_CLAIMS, other, status=True)
    tenants(harness, {"a": 0, "b": 1})
    harness.create_claim(claim("excl", request(klass="gpu-mutex-binpack", memory="1000Mi")))
    harness.create_pod(pod("excl-pod", {"gpu": "claim:excl"}))
    wait_for(lambda: harness.bound_node("excl-pod"))
    assert harness.devices_of("excl") == ["node-1/gpu-3"]


def test_postfilter_deallocation_is_reallocated_elsewhere(controller_plane: ControlPlane) -> None:
    with plane_harness(controller_plane, ["node-1", "node-2"]) as h:
        h.publish("node-1", "t4", 2)
        h.publish("node-2", "t4", 2)
        h.create_class(device_class(DRIVER))
        # Our earlier allocation on node-1 (finalizer ours), then node-1 was cordoned before binding.
        created = h.create_claim(claim("moved", request(memory="1Gi")))
        created["metadata"]["finalizers"] = [FINALIZER]
        created = h.kube.update(RESOURCE_CLAIMS, created)
        created["status"] = {
            "allocation": {
                "allocationTimestamp": "2026-01-01T00:00:00Z",
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0",
                         "shareID": "6a1e4a43-9a2b-4f5e-8f6a-0c2d1e3f4a5b",
                         "consumedCapacity": {"memory": "1Gi", "cores": "0", "slots": "1"}}
                    ]
                },
                "nodeSelector": node_selector("node-1"),
            }
        }  # fmt: skip
        h.kube.update(RESOURCE_CLAIMS, created, status=True)
        node1 = h.kube.get(NODES, None, "node-1")
        node1["spec"]["unschedulable"] = True
        h.kube.update(NODES, node1)
        h.create_pod(pod("mover", {"gpu": "claim:moved"}, gated=False))
        h.start_controller()
        assert wait_for(lambda: h.bound_node("mover"), what="mover bound") == "node-2"
        assert h.devices_of("moved") == ["node-2/gpu-0"]


def test_pod_waits_gated_until_its_device_class_exists(harness: Harness) -> None:
    harness.publish("node-1", "t4", 2)
    harness.start_controller()
    harness.create_claim(claim("early", request(memory="1Gi")))
    harness.create_pod(pod("early-pod", {"gpu": "claim:early"}))
    wait_for(lambda: harness.events("early-pod"), what="pending event")
    assert "DeviceClass gpu.hami.io not found" in harness.events("early-pod")[0]
    assert harness.get_pod("early-pod")["spec"]["schedulingGates"] == [{"name": "gpu.hami.io/allocation"}]
    harness.create_class(device_class(DRIVER))
    wait_for(lambda: harness.bound_node("early-pod"), what="bound once the class exists")


def test_node_policy_spread_versus_binpack(controller_plane: ControlPlane) -> None:
    with plane_harness(controller_plane, ["node-1", "node-2"]) as h:
        for name in ("node-1", "node-2"):
            h.publish(name, "t4", 2)
        h.create_class(device_class("packed", {"nodePolicy": "binpack"}))
        h.create_class(device_class("spread", {"nodePolicy": "spread"}))
        h.start_controller()
        for name in ("p1", "p2"):
            h.create_claim(claim(name, request(klass="packed", memory="1Gi")))
            h.create_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))
            wait_for(lambda name=name: h.bound_node(f"{name}-pod"))
        assert h.bound_node("p1-pod") == h.bound_node("p2-pod")  # binpack: the busier node again
        first = h.bound_node("p1-pod")
        h.create_claim(claim("s1", request(klass="spread", memory="1Gi")))
        h.create_pod(pod("s1-pod", {"gpu": "claim:s1"}))
        wait_for(lambda: h.bound_node("s1-pod"))
        assert h.bound_node("s1-pod") != first  # spread: the idle node


def test_start_returns_with_the_published_devices_in_the_placement_state(harness: Harness) -> None:
    """What the lists gave is folded into the cache and the ledger before ``start`` returns (the
    loop held back here, so nothing else can have built it): the first pass places at once, and
    the daemon freezes what was built (dra_driver/heap.py)."""
    harness.publish("node-1", "t4", 4)
    controller = Controller(Kube(harness.server.api_client()), DRIVER, ControllerDefaults())
    harness.controllers.append(controller)
    held, loop = threading.Event(), controller._loop

    def held_loop() -> None:
        held.wait(30)
        loop()

    controller._loop = held_loop  # type: ignore[method-assign]
    try:
        controller.start()
        node = controller.cache.ledger.inventory["node-1"]
        assert sorted(device.device for device in node.devices) == [f"gpu-{i}" for i in range(4)]
    finally:
        held.set()
