"""How ``Controller`` wires its parts, and what each pass publishes (dra_driver/controller/controller.py).

The informers' own behaviour is in tests/kube; the API server tiers run them for real. Here:
each informer is built with the controller's client and change handler and with the right cut-down
(transform, field selector, optional CRD); the options reach the binder, the queue and the writer
pool; the leader gauge and the pass count follow the lease; the pending-pods series are refreshed
at most once a second, or at once when a term starts.
"""

from __future__ import annotations

from typing import cast

import pytest

from dra_driver.controller.controller import Controller
from dra_driver.controller.gang_refs import GROUP_RESOURCES, event_kind
from dra_driver.controller.hami_templates import HamiTemplates
from dra_driver.controller.slim import SliceParts, keep_pod, placement_node, slice_selector
from dra_driver.kube.events import TokenBucket
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER
from tests.controller.worlds import World, tenant


def test_every_informer_feeds_the_worker_through_the_same_client_cut_down_as_its_resource_needs() -> None:
    kube = FakeKube()
    controller = Controller(kube, DRIVER)
    informers = dict(controller.informers)
    # Gangs' group objects (gang_refs.py): optional, delivered under their own kind (two are PodGroups).
    for resource in GROUP_RESOURCES:
        group = informers.pop(event_kind(resource))
        assert group.kube is kube and group.resource is resource and group.optional
        assert group.on_change.func == controller._on_group_change  # type: ignore[attr-defined]
        assert group.on_change.args == (event_kind(resource),)  # type: ignore[attr-defined]
        assert group.transform is informers["DeviceClass"].transform
    assert set(informers) == {
        "DeviceClass", "Node", "ResourceSlice", "ResourceClaim", "Pod", "ResourceQuota", "GpuQuota",
    }  # fmt: skip
    for kind, informer in informers.items():
        assert informer.kube is kube and informer.resource.kind == kind
        assert informer.on_change == controller._on_change
        assert informer.optional is (kind == "GpuQuota")  # the CRD may not be installed
        assert informer.field_selector == (slice_selector(DRIVER) if kind == "ResourceSlice" else None)
    assert informers["Node"].transform is placement_node
    assert informers["Pod"].transform is keep_pod
    assert isinstance(informers["ResourceSlice"].transform, SliceParts)
    default = informers["DeviceClass"].transform
    assert all(
        informers[kind].transform is default for kind in ("ResourceClaim", "ResourceQuota", "GpuQuota")
    )
    assert default not in (placement_node, keep_pod)
    assert controller.ready() == "listing " + ", ".join(
        sorted(informer.resource.plural for informer in controller.informers.values())
    )


def test_the_options_reach_the_parts_that_use_them() -> None:
    kube = FakeKube()
    budget = TokenBucket(rate=1.0, burst=2)
    templates = cast(HamiTemplates, object())  # only passed on
    controller = Controller(
        kube, DRIVER, background_events=True, normal_event_budget=budget, hami_templates=templates,
        pass_budget=2.5, resync_seconds=7.0, gang_timeout=12.0,
    )  # fmt: skip
    try:
        assert controller.driver == DRIVER and controller.hami_templates is templates
        assert controller.binder.events._queue is not None  # events are sent on their own thread
        assert controller.binder.events.normal_budget is budget
        assert controller.queue.pass_budget == 2.5 and controller.resync_seconds == 7.0
        assert controller.gangs.timeout == 12.0
        assert controller.binding.threaded
    finally:
        controller.stop()
    plain = Controller(FakeKube(), DRIVER, write_workers=0)
    assert plain.binder.events._queue is None and plain.binder.events.normal_budget is None
    assert plain.binder.identity == "hami-dra-controller" and plain.resync_seconds == 30.0
    assert not plain.binding.threaded and plain.passes == 0


def test_the_leader_gauge_and_the_passes_follow_the_lease() -> None:
    world = World()
    world.controller.run_once()
    world.controller.run_once()
    assert world.metrics.leader._value.get() == 1 and world.controller.passes == 2
    world.leading = False
    world.controller.run_once()
    assert world.metrics.leader._value.get() == 0 and world.controller.passes == 2


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr("time.monotonic", lambda: self.now)  # the worker's metrics clock


def pending_pods(world: World) -> float | None:
    value: float | None = world.metrics.registry.get_sample_value(
        "hami_dra_pending_pods", {"reason": "Unschedulable"}
    )
    return value


def test_the_pending_series_are_refreshed_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    world = World(gpus=1)
    world.controller.run_once()  # the term's first pass publishes at once
    assert pending_pods(world) is None
    tenant(world, "big", memory="100Gi")
    world.controller.queue.activate([f"{world.pod_view('big-pod').key}"])
    clock.now += 1.0
    world.controller.run_once()
    assert world.controller.queue.reason(world.pod_view("big-pod")) == "Unschedulable"
    assert pending_pods(world) is None, "a second has not passed since the last refresh"
    clock.now += 0.01
    world.controller.run_once()
    assert pending_pods(world) == 1
    world.controller.queue.placed(world.pod_view("big-pod"))
    clock.now += 1.5
    world.controller.run_once()
    assert pending_pods(world) is None or pending_pods(world) == 0


def test_a_new_term_publishes_the_series_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    world = World(gpus=1)
    tenant(world, "a")
    world.leading = False
    world.controller.run_once()  # a standby computes, publishes nothing
    gpus = "hami_dra_gpu_memory_capacity_bytes"
    assert not [s for m in world.metrics.registry.collect() if m.name == gpus for s in m.samples]
    world.leading = True
    clock.now += 0.1
    world.controller.run_once()
    assert [s for m in world.metrics.registry.collect() if m.name == gpus for s in m.samples]


def allocated_memory(world: World) -> float:
    return sum(
        sample.value
        for metric in world.metrics.registry.collect()
        if metric.name == "hami_dra_gpu_allocated_memory_bytes"
        for sample in metric.samples
    )


def test_a_leaders_series_follow_what_changed_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    world = World(gpus=1)
    world.controller.run_once()
    assert allocated_memory(world) == 0
    tenant(world, "a", memory="2Gi")
    world.place("a-pod")  # the claim's allocation is in the ledger now
    world.controller.run_once()
    assert allocated_memory(world) == 0, "within the second: the last snapshot"
    clock.now += 1.01
    world.controller.run_once()
    assert allocated_memory(world) == 2 * 2**30
    world.releaser.deallocate(world.cache.claims[f"{world.pod_view('a-pod').namespace}/a"])
    world.sync()
    clock.now += 1.01
    world.controller.run_once()
    assert allocated_memory(world) == 0


def test_a_standby_keeps_its_series_current_and_publishes_them_when_it_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    world = World(gpus=1)
    world.leading = False
    world.controller.run_once()
    tenant(world, "a", memory="2Gi")
    world.leading = True
    world.place("a-pod")
    world.leading = False
    clock.now += 1.01
    world.controller.run_once()  # computed, not published
    assert allocated_memory(world) == 0
    world.leading = True
    world.controller.run_once()  # the new term publishes what it kept current
    assert allocated_memory(world) == 2 * 2**30
