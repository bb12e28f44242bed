"""Failure cases on the real control plane (kube-scheduler, kube-controller-manager:
tests/controller/harness.py ``plane_harness``): conflicts, injected API faults, watch loss,
failover, crashes, and writes held in flight while the worker's threads plan the next pods.

The faults a real server makes on demand are real (a watch cut by the loopback proxy, a lease
left to expire); the rest are injected on our controller's own client (``Harness.faults``:
``ClientFaults``), so the server still judges every request that is sent."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from dra_driver.controller import FINALIZER, GATE_NAME
from dra_driver.kube.api import EVENTS, RESOURCE_CLAIMS, Kube
from dra_driver.kube.leader import LeaderElector
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.api_proxy import ApiFaultProxy, proxied_kubeconfig
from tests.controller.harness import (
    DRIVER,
    NS,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)
from tests.kube_validate import assert_valid


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane) as h:
        h.publish("node-1", "t4", 4)
        h.create_class(device_class(DRIVER))
        h.create_class(device_class("gpu-mutex", {"policy": "mutex,binpack"}))
        yield h


def devices(h: Harness, names: list[str]) -> list[str]:
    return [device for name in names for device in h.devices_of(name)]


def test_written_objects_pass_kubernetes_validate(harness: Harness) -> None:
    harness.start_controller()
    harness.create_claim(claim("v", request(memory="1000Mi", cores=30)))
    harness.create_pod(pod("v-pod", {"gpu": "claim:v"}))
    wait_for(lambda: harness.bound_node("v-pod"))
    written = harness.get_claim("v")
    assert written["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["cores"] == "30"
    assert_valid(written)
    harness.create_claim(claim("too-big", request(memory="20Gi")))
    harness.create_pod(pod("big-pod", {"gpu": "claim:too-big"}))
    wait_for(lambda: harness.events("big-pod"))
    events = harness.kube.list(EVENTS).get("items") or []
    assert "4/4 CardInsufficientMemory" in events[0]["message"]
    for event in events:
        # Items of a list carry no apiVersion and kind on a real server (the sandbox added them).
        assert_valid({"apiVersion": "v1", "kind": "Event", **event})
    assert_valid(harness.get_pod("big-pod"))


@pytest.mark.slow
def test_conflicts_and_server_errors_are_retried(harness: Harness) -> None:
    harness.faults.inject(r"/resourceclaims/c1/status$", status=409, count=2, methods={"PUT"})
    harness.faults.inject(r"/pods/p1$", status=409, count=1, methods={"PATCH"})
    harness.faults.inject(r"/resourceclaims/c2$", status=500, count=2, methods={"PUT"})
    controller = harness.start_controller()
    harness.create_claim(claim("c1", request(memory="1Gi")))
    harness.create_claim(claim("c2", request(memory="1Gi")))
    harness.create_pod(pod("p1", {"gpu": "claim:c1"}))
    harness.create_pod(pod("p2", {"gpu": "claim:c2"}))
    wait_for(lambda: harness.bound_node("p1") and harness.bound_node("p2"), what="both bound")
    assert controller.metrics.conflicts._value.get() >= 3
    assert len(harness.devices_of("c1")) == len(harness.devices_of("c2")) == 1


def test_concurrent_allocation_by_someone_else_wins_without_double_counting(harness: Harness) -> None:
    """Another allocator writes the claim first: our write conflicts, we adopt theirs and only ungate."""
    harness.create_claim(claim("race", request(memory="1Gi")))
    harness.create_pod(pod("race-pod", {"gpu": "claim:race"}))
    current = harness.get_claim("race")
    current["status"] = {
        "allocation": {
            "allocationTimestamp": "2026-01-01T00:00:00Z",
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-3"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                ]
            },
        }
    }
    harness.kube.update(RESOURCE_CLAIMS, current, status=True)
    controller = harness.start_controller()
    wait_for(lambda: harness.bound_node("race-pod"))
    assert harness.devices_of("race") == ["node-1/gpu-3"]
    usage = controller.cache.ledger.state.nodes["node-1"].usage[3]
    assert usage.tenants == 10  # an exclusive result fills every slot of the card, counted once


def test_watch_loss_and_410_relist_keep_working(
    harness: Harness, controller_plane: ControlPlane, tmp_path: Path
) -> None:
    """The controller's connections go through the loopback proxy, which cuts every one of them
    (watches included) at once; its ResourceClaim watch is then answered 410, as kube-apiserver
    answers one whose resourceVersion was compacted away (the watch cache keeps too long a window
    to make that happen on demand)."""
    host, _, port = controller_plane.server_url.removeprefix("https://").rpartition(":")
    proxy = ApiFaultProxy((host, int(port)))
    kubeconfig = proxied_kubeconfig(controller_plane.kubeconfig_path, proxy.port, tmp_path / "proxied")
    try:
        controller = harness.start_controller(kube=Kube(config.new_client_from_config(str(kubeconfig))))
        _watch_loss(harness, controller, proxy)
    finally:
        proxy.stop()


def _watch_loss(harness: Harness, controller: Any, proxy: ApiFaultProxy) -> None:
    harness.create_claim(claim("w1", request(memory="1Gi")))
    harness.create_pod(pod("w1-pod", {"gpu": "claim:w1"}))
    wait_for(lambda: harness.bound_node("w1-pod"))
    relists = controller.informers["ResourceClaim"].relists
    gone = harness.faults.inject(r"/resourceclaims$", status=410, count=1, methods={"GET"})
    assert proxy.cut() > 0  # every open connection, the watches' among them
    wait_for(lambda: gone.hits == 1, what="the ResourceClaim watch re-opened and answered 410")
    harness.create_claim(claim("w2", request(memory="1Gi")))
    harness.create_pod(pod("w2-pod", {"gpu": "claim:w2"}))
    wait_for(lambda: harness.bound_node("w2-pod"), what="w2-pod bound after watch loss")
    wait_for(lambda: controller.informers["ResourceClaim"].relists > relists, what="relist after 410")


@pytest.mark.slow
def test_leader_failover_never_both_allocate(harness: Harness) -> None:
    electors = []
    controllers = []
    for identity in ("replica-a", "replica-b"):
        kube = Kube(harness.server.api_client())
        elector = LeaderElector(kube, NS, identity, lease_duration=2.0, renew_deadline=1.5, retry_period=0.2)
        elector.start()
        electors.append(elector)
        controllers.append(harness.start_controller(is_leader=elector.is_leader, identity=identity))
    wait_for(lambda: sum(e.is_leader() for e in electors) == 1, what="one leader")
    leader = next(i for i, e in enumerate(electors) if e.is_leader())
    follower = 1 - leader
    for i in range(3):
        harness.create_claim(claim(f"l{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"l{i}-pod", {"gpu": f"claim:l{i}"}))
    wait_for(lambda: all(harness.bound_node(f"l{i}-pod") for i in range(3)), what="first batch bound")
    assert controllers[follower].metrics.allocations._value.get() == 0
    electors[leader].stop(release=False)  # crash: no release, the lease must expire
    controllers[leader].stop()
    wait_for(lambda: electors[follower].is_leader(), timeout=10, what="failover")
    harness.create_claim(claim("l3", request(klass="gpu-mutex", memory="1Gi")))
    harness.create_pod(pod("l3-pod", {"gpu": "claim:l3"}))
    wait_for(lambda: harness.bound_node("l3-pod"), what="allocated by the new leader")
    assert controllers[follower].metrics.allocations._value.get() == 1
    assert sorted(devices(harness, ["l0", "l1", "l2", "l3"])) == [f"node-1/gpu-{i}" for i in range(4)]
    electors[follower].stop()


def test_restart_after_crash_between_finalizer_and_allocation(harness: Harness) -> None:
    harness.create_claim(claim("half", request(memory="1Gi")))
    current = harness.get_claim("half")
    current["metadata"]["finalizers"] = [FINALIZER]  # the crash happened right after this write
    harness.kube.update(RESOURCE_CLAIMS, current)
    harness.create_pod(pod("half-pod", {"gpu": "claim:half"}))
    harness.start_controller()
    wait_for(lambda: harness.bound_node("half-pod"))
    assert harness.get_claim("half")["metadata"]["finalizers"] == [FINALIZER]
    assert len(harness.devices_of("half")) == 1


def test_restart_after_crash_between_allocation_and_gate_removal(harness: Harness) -> None:
    first = harness.start_controller()
    harness.faults.inject(r"/pods/gated$", status=500, methods={"PATCH"})  # gate removal keeps failing
    harness.create_claim(claim("kept", request(memory="1Gi")))
    harness.create_pod(pod("gated", {"gpu": "claim:kept"}))
    wait_for(lambda: harness.allocated("kept"), what="allocation written")
    share = copy.deepcopy(harness.get_claim("kept")["status"]["allocation"])
    first.stop()  # the crash
    harness.faults.clear()
    harness.start_controller()
    wait_for(lambda: harness.bound_node("gated"), what="gate removed after restart")
    assert harness.get_claim("kept")["status"]["allocation"] == share  # not allocated twice
    assert GATE_NAME not in [g["name"] for g in harness.get_pod("gated")["spec"].get("schedulingGates") or ()]


def test_deleted_pod_releases_template_claim_and_finalizer(harness: Harness) -> None:
    harness.start_controller()
    harness.create_template("one", request(memory="1Gi"))
    harness.create_pod(pod("tpl-pod", {"gpu": "template:one"}))
    wait_for(lambda: harness.bound_node("tpl-pod"))
    name = harness.pod_claim("tpl-pod")["metadata"]["name"]
    harness.delete_pod("tpl-pod")

    def claim_gone() -> bool:
        try:
            harness.get_claim(name)
        except Exception:
            return True
        return False

    wait_for(claim_gone, what="template claim deleted (our finalizer removed)")


def test_unschedulable_then_node_added(controller_plane: ControlPlane) -> None:
    with plane_harness(controller_plane) as h:
        h.publish("node-1", "t4", 1)
        h.create_class(device_class(DRIVER))
        h.start_controller()
        h.create_claim(claim("two", request(count=2, memory="1Gi")))
        h.create_pod(pod("two-pod", {"gpu": "claim:two"}))
        wait_for(lambda: h.events("two-pod"), what="pending")
        assert "NodeInsufficientDevice" in h.events("two-pod")[0] or "Insufficient" in h.events("two-pod")[0]
        h.cluster.add_node("node-2")
        h.publish("node-2", "t4", 2)
        assert wait_for(lambda: h.bound_node("two-pod"), what="bound to the new node") == "node-2"
    time.sleep(0)


def test_burst_of_exclusive_claims_never_shares_a_card(harness: Harness) -> None:
    """Many pods planned while earlier writes are still in flight: the assumed usage must hold."""
    for i in range(5):
        harness.create_claim(claim(f"b{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"b{i}-pod", {"gpu": f"claim:b{i}"}))
    controller = harness.start_controller()
    wait_for(lambda: sum(bool(harness.bound_node(f"b{i}-pod")) for i in range(5)) == 4, what="four bound")
    controller.wait_idle()
    placed = devices(harness, [f"b{i}" for i in range(5)])
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)]
    pending = next(f"b{i}-pod" for i in range(5) if not harness.bound_node(f"b{i}-pod"))
    wait_for(lambda: harness.events(pending), what="pending event")
    assert "ExclusiveDeviceAllocateConflict" in harness.events(pending)[0]


# --- writes held in flight: what the worker's threads plan meanwhile ------------------------------


def _listed_claim(h: Harness, name: str) -> dict[str, Any] | None:
    """Read a claim through the list path (GETs of the claim itself may carry injected faults)."""
    for item in h.kube.list(RESOURCE_CLAIMS).get("items") or ():
        if item["metadata"]["name"] == name:
            item.setdefault("apiVersion", "resource.k8s.io/v1")
            item.setdefault("kind", "ResourceClaim")
            return dict(item)
    return None


def test_a_claim_shared_by_two_gated_pods_is_planned_once_while_it_is_written(harness: Harness) -> None:
    """Pod B must not re-plan a claim whose allocation pod A is still writing.

    Otherwise B's plan replaces A's assumed use in the ledger, A's write wins, and the card A
    took looks free to the next pod: two exclusive claims on one card.
    """
    # A whole card: a claim with memory/cores limits may serve only one pod (GpuLimitsConflict).
    harness.create_claim(claim("shared", request(klass="gpu-mutex")))
    harness.create_pod(pod("a-pod", {"gpu": "claim:shared"}))
    harness.create_pod(pod("b-pod", {"gpu": "claim:shared"}))
    for i in range(3):
        harness.create_claim(claim(f"d{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"d{i}-pod", {"gpu": f"claim:d{i}"}))
    # Keep the shared claim's first write in flight until every pod is planned in one pass.
    release = threading.Event()
    harness.faults.inject(r"/resourceclaims/shared$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(write_workers=1)
    wait_for(lambda: len(controller.binding.keys()) == 4, what="a-pod and d0..d2 planned (b-pod waits)")
    release.set()
    names = ["a-pod", "b-pod", "d0-pod", "d1-pod", "d2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    placed = [device for name in ["shared", "d0", "d1", "d2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


def test_a_claim_referenced_twice_by_one_pod_is_counted_once_while_it_is_written(harness: Harness) -> None:
    """Two pod entries naming one ResourceClaim: one allocation, and the ledger keeps the one written."""
    harness.create_claim(claim("dup", request(klass="gpu-mutex", memory="1Gi")))
    harness.create_pod(pod("a-dup-pod", {"g1": "claim:dup", "g2": "claim:dup"}))
    for i in range(3):
        harness.create_claim(claim(f"e{i}", request(klass="gpu-mutex", memory="1Gi")))
        harness.create_pod(pod(f"e{i}-pod", {"gpu": f"claim:e{i}"}))
    release = threading.Event()
    harness.faults.inject(r"/resourceclaims/dup$", hold=release, count=1, methods={"PUT"})
    controller = harness.start_controller(write_workers=1)
    wait_for(lambda: len(controller.binding.keys()) == 4, what="every pod planned while dup's write is held")
    release.set()
    names = ["a-dup-pod", "e0-pod", "e1-pod", "e2-pod"]
    wait_for(lambda: all(harness.bound_node(name) for name in names), timeout=30, what="all bound")
    controller.wait_idle()
    assert len(harness.devices_of("dup")) == 1
    placed = [device for name in ["dup", "e0", "e1", "e2"] for device in harness.devices_of(name)]
    assert sorted(placed) == [f"node-1/gpu-{i}" for i in range(4)], placed


def test_a_writer_failure_does_not_leave_the_claim_in_flight_forever(harness: Harness) -> None:
    """A conflict whose re-read fails must not wedge the claim: once its pod goes it is out of
    flight and unallocated, and deleting it removes our finalizer (an unallocated claim keeps it
    until then: admission puts it on new claims of our classes, releaser.py)."""
    status_conflict = harness.faults.inject(
        r"/resourceclaims/wedged/status$", status=409, count=None, methods={"PUT"}
    )
    reread = harness.faults.inject(r"/resourceclaims/wedged$", status=500, count=None, methods={"GET"})
    controller = harness.start_controller()
    harness.create_claim(claim("wedged", request(memory="1Gi")))
    harness.create_pod(pod("wedged-pod", {"gpu": "claim:wedged"}))
    wait_for(lambda: status_conflict.hits >= 1 and reread.hits >= 1, what="conflict and failed re-read")
    harness.delete_pod("wedged-pod")
    wait_for(lambda: "default/wedged-pod" not in controller.cache.pods, what="pod gone from the cache")
    controller.wait_idle()
    harness.faults.clear()

    def settled() -> bool:
        listed = _listed_claim(harness, "wedged")
        return (
            listed is not None
            and not (listed.get("status") or {}).get("allocation")
            and not controller.cache.assumed.in_flight
        )

    wait_for(settled, what="the claim unallocated and out of flight once the pod is gone")
    assert FINALIZER in (_listed_claim(harness, "wedged") or {})["metadata"].get("finalizers", [])
    harness.kube.delete(RESOURCE_CLAIMS, NS, "wedged")
    wait_for(lambda: _listed_claim(harness, "wedged") is None, what="claim deleted (our finalizer removed)")
    assert not controller.cache.assumed.in_flight


def test_a_failed_write_keeps_the_allocation_someone_else_made_in_the_ledger(harness: Harness) -> None:
    """Another allocator takes the claim while our write fails and cannot be re-read: count theirs."""
    release = threading.Event()
    slow = harness.faults.inject(
        r"/resourceclaims/taken$", status=500, hold=release, count=1, methods={"PUT"}
    )
    harness.faults.inject(r"/resourceclaims/taken$", status=500, count=1, methods={"GET"})
    # The gate stays (its removal keeps failing): no later write of the claim corrects the ledger.
    ungate = harness.faults.inject(r"/pods/taken-pod$", status=500, count=None, methods={"PATCH"})
    controller = harness.start_controller()
    harness.create_claim(claim("taken", request(memory="1Gi")))
    harness.create_pod(pod("taken-pod", {"gpu": "claim:taken"}))
    wait_for(lambda: slow.hits >= 1, what="our finalizer write in flight")
    current = _listed_claim(harness, "taken")
    assert current is not None
    current["status"] = {
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
    harness.kube.update(RESOURCE_CLAIMS, current, status=True)  # e.g. kube-scheduler, first fit
    release.set()  # only now does our write fail
    wait_for(lambda: ungate.hits >= 1, what="gate removal tried with the other allocation")
    uid = current["metadata"]["uid"]

    def counted() -> bool:
        uses = controller.cache.ledger.claims().get(uid, ())
        return [use.device.device for use in uses] == ["gpu-2"] and uses[0].memory is None

    wait_for(counted, timeout=5, what="the exclusive result on gpu-2 counted in the ledger")
    assert controller.cache.ledger.state.nodes["node-1"].usage[2].tenants == 10
