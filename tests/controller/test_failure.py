"""The failure handler (dra_driver/controller/failure.py): a pod that waits, written after the pass.

While planning, ``failed`` and ``warn`` write nothing (the queue learns the reason at once);
``handle`` then fences the pod's claims, and when the reason or message changed counts the
failure, records a Warning event and writes the condition. Over ``FakeKube``; the decisions that
lead here are in test_controller.py.
"""

from __future__ import annotations

import pytest

from dra_driver.controller import FINALIZER
from dra_driver.controller.allocator import Placed, Unschedulable, WaitingForClaim
from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.controller.pod_queue import Attempt, Step
from dra_driver.controller.reasons import EventReason, Reason
from dra_driver.kube.errors import KubeError
from dra_driver.resource.objects import PodView
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import NS, claim, pod, request
from tests.controller.worlds import World


def waiting_pod(world: World, name: str = "x") -> PodView:
    """Pod ``<name>-pod`` with an unallocated claim ``name`` that carries our finalizer."""
    body = claim(name, request(memory="100Gi"))
    body["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(body)
    return world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def failures(world: World, label: str) -> float:
    value: float = world.metrics.failures.labels(label)._value.get()
    return value


def test_a_failure_writes_nothing_until_handled_then_fences_counts_events_and_sets_the_condition() -> None:
    world = World()
    created = waiting_pod(world)
    handler = world.controller.failures
    assert not handler
    handler.failed(created, Reason.UNSCHEDULABLE, "node-1: 2/2 CardInsufficientMemory")
    assert handler and world.kube.writes() == []
    assert world.controller.queue.reason(created) == Reason.UNSCHEDULABLE  # known at once
    handler.handle()
    assert not handler
    assert world.claim("x")["metadata"]["annotations"][FENCE_ANNOTATION].startswith("test ")
    known = world.cache.claim(NS, "x")  # what the fence wrote is what the cache now knows
    assert known is not None and known.resource_version == world.claim("x")["metadata"]["resourceVersion"]
    assert failures(world, "CardInsufficientMemory") == 1  # HAMi's first reason labels the metric
    (event,) = world.event_objects()
    assert (event["type"], event["reason"]) == ("Warning", EventReason.FAILED_ALLOCATION)
    assert event["message"] == "node-1: 2/2 CardInsufficientMemory"
    found = world.condition("x-pod")
    assert found is not None
    assert (found["status"], found["reason"]) == ("False", "Unschedulable")
    assert world.cache.pods[f"{NS}/x-pod"].allocated_condition == "False"  # the written pod, cached


def test_the_same_failure_again_is_not_reported_again_and_a_new_message_is() -> None:
    world = World()
    created = waiting_pod(world)
    handler = world.controller.failures
    handler.failed(created, Reason.QUOTA_EXCEEDED, "quota team: no room")
    handler.handle()
    writes = len(world.kube.writes())
    handler.failed(world.pod_view("x-pod"), Reason.QUOTA_EXCEEDED, "quota team: no room")
    handler.handle()
    assert len(world.kube.writes()) == writes  # fenced at this version already; reported already
    assert failures(world, "GpuQuotaExceeded") == 1
    handler.failed(world.pod_view("x-pod"), Reason.QUOTA_EXCEEDED, "quota team: still no room")
    handler.handle()
    assert failures(world, "GpuQuotaExceeded") == 2
    assert world.events()[-1] == "quota team: still no room"
    found = world.condition("x-pod")
    assert found is not None and found["message"] == "quota team: still no room"


def test_an_api_error_plans_the_pod_again_and_the_other_failures_are_handled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    first, second = waiting_pod(world, "a"), waiting_pod(world, "b")
    handler = world.controller.failures
    fence = world.binder.fence

    def failing(claims: list) -> list:  # type: ignore[type-arg]
        if any(c.name == "a" for c in claims):
            raise KubeError(503, "unavailable")
        return fence(claims)

    monkeypatch.setattr(world.binder, "fence", failing)
    handler.failed(first, Reason.UNSCHEDULABLE, "a: no room")
    handler.failed(second, Reason.UNSCHEDULABLE, "b: no room")
    handler.handle()
    assert world.condition("a-pod") is None and world.condition("b-pod") is not None
    assert [a.pod.key for a in world.controller.queue.attempts()] == [f"{NS}/a-pod"]  # planned again


def test_an_unexpected_error_is_counted_and_the_other_failures_are_handled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    world = World()
    first, second = waiting_pod(world, "a"), waiting_pod(world, "b")
    handler = world.controller.failures
    pod_claims = world.cache.pod_claims

    def failing(pod: PodView):  # type: ignore[no-untyped-def]
        if pod.name == "a-pod":
            raise ValueError("poison")
        return pod_claims(pod)

    monkeypatch.setattr(world.cache, "pod_claims", failing)
    handler.failed(first, Reason.INVALID_REQUEST, "a: bad")
    handler.failed(second, Reason.INVALID_REQUEST, "b: bad")
    handler.handle()
    assert world.metrics.unexpected_errors.labels("Pod")._value.get() == 1
    assert "pod default/a-pod: pending reason not reported" in caplog.text
    assert world.condition("b-pod") is not None
    assert list(world.controller.queue.attempts()) == []  # not planned again: it would fail again


def test_warnings_are_events_once_per_pod_and_text_after_the_pass() -> None:
    world = World()
    created = waiting_pod(world)
    handler = world.controller.failures
    handler.warn(created, ("policy x unknown", "policy y unknown"))
    handler.warn(created, ("policy x unknown",))
    assert handler and world.events() == []
    handler.handle()
    reasons = [(e["reason"], e["message"]) for e in world.event_objects()]
    assert reasons == [
        (EventReason.UNKNOWN_POLICY, "policy x unknown"),
        (EventReason.UNKNOWN_POLICY, "policy y unknown"),
    ]
    assert not handler


def test_the_written_pod_is_cached_slim_as_the_informer_keeps_it() -> None:
    """The condition's patch returns the whole pod (status, environment, volumes); the cache holds
    our pods slim (slim.our_pod), and the handler's copy replaces the informer's until the next
    event, so it must be as slim: a cluster of pending pods would otherwise hold them whole."""
    world = World()
    body = claim("x", request(memory="100Gi"))
    body["metadata"]["finalizers"] = [FINALIZER]
    world.add_claim(body)
    whole = pod("x-pod", {"gpu": "claim:x"})
    whole["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y"}]
    whole["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    whole["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    created = world.add_pod(whole)
    world.controller.failures.failed(created, Reason.UNSCHEDULABLE, "no room")
    world.controller.failures.handle()
    assert "env" in world.pod("x-pod")["spec"]["containers"][0]  # the API's pod is whole
    cached = world.cache.pods[f"{NS}/x-pod"]
    assert cached.allocated_condition == "False"
    assert "env" not in cached.raw["spec"]["containers"][0] and "volumes" not in cached.raw["spec"]
    assert "managedFields" not in cached.raw["metadata"]


def test_a_condition_that_was_not_written_leaves_the_cached_pod() -> None:
    world = World()
    created = waiting_pod(world)
    world.kube.fail("patch/status", "pods", 500)  # the condition is a status patch
    world.controller.failures.failed(created, Reason.UNSCHEDULABLE, "no room")
    world.controller.failures.handle()
    assert world.cache.pods[f"{NS}/x-pod"] is created
    assert world.events() == ["no room"]


def test_the_written_pod_does_not_replace_a_namesake_cached_meanwhile() -> None:
    world = World()
    created = waiting_pod(world)
    world.controller.failures.failed(created, Reason.UNSCHEDULABLE, "no room")
    namesake = PodView.parse({**dict(created), "metadata": {**created["metadata"], "uid": "another"}})
    world.cache.pods[created.key] = namesake
    world.controller.failures.handle()
    assert world.cache.pods[created.key] is namesake
    del world.cache.pods[created.key]
    world.controller.failures.failed(created, Reason.UNSCHEDULABLE, "no room at all")
    world.controller.failures.handle()
    assert created.key not in world.cache.pods  # a pod gone from the cache is not brought back


def test_the_failures_of_a_pass_are_written_even_when_the_pass_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = FakeCluster(gpus=1)
    cluster.gpu_pod("big", "500Gi")
    cluster.gpu_pod("next", "1Gi")
    attempt = cluster.controller._attempt

    def breaking(planned: Attempt) -> Step | None:
        if planned.pod.name == "next":
            raise RuntimeError("the pass broke")
        return attempt(planned)

    monkeypatch.setattr(cluster.controller, "_attempt", breaking)
    with pytest.raises(RuntimeError):
        cluster.controller.run_once()
    found = cluster.condition("big")
    assert found is not None and found["reason"] == "Unschedulable"
    assert not cluster.controller.failures


def test_an_unexpected_error_is_reported_in_one_line_of_at_most_300_characters_of_its_text() -> None:
    world = World()
    created = waiting_pod(world)
    step = world.controller.fail_pod(created, ValueError("many\n  words " + "x" * 400))
    assert step is Step.PENDING
    world.controller.failures.handle()
    found = world.condition("x-pod")
    assert found is not None and found["reason"] == Reason.INVALID_REQUEST
    text = "ValueError: many words " + "x" * 400
    assert found["message"] == f"unexpected error while planning this pod: {text[:300]}"


def test_a_decision_leaves_its_warnings_and_a_failure_unless_quiet_or_placed() -> None:
    world = World()
    created = waiting_pod(world)
    handler = world.controller.failures
    handler.decided(created, Unschedulable(Reason.UNSCHEDULABLE, "on n1 only", quiet=True, warnings=("w1",)))
    handler.decided(created, Placed(created, [], warnings=("w2",)))
    handler.decided(created, WaitingForClaim())
    handler.handle()
    assert world.events() == ["w1", "w2"] and world.condition("x-pod") is None
    assert world.controller.queue.reason(created) is None  # a quiet retry keeps the last reason
    handler.decided(created, Unschedulable(Reason.NODE_CONFLICT, "claims on two nodes"))
    handler.handle()
    found = world.condition("x-pod")
    assert found is not None and found["reason"] == Reason.NODE_CONFLICT


def test_a_quiet_wait_fences_the_claims_and_reports_nothing() -> None:
    """A gang member within its timeout (gangs.py): no metric, event or condition, no error; its
    claims are fenced all the same and the cached pod stays as it was."""
    world = World()
    created = waiting_pod(world)
    handler = world.controller.failures
    handler.quiet(created)
    assert handler and world.kube.writes() == []
    handler.handle()
    assert world.claim("x")["metadata"]["annotations"][FENCE_ANNOTATION].startswith("test ")
    assert world.event_objects() == [] and world.condition("x-pod") is None
    assert world.metrics.unexpected_errors.labels("Pod")._value.get() == 0
    assert world.cache.pods[f"{NS}/x-pod"] == created
    assert world.controller.queue.reason(created) is None
