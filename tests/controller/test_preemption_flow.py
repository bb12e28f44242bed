"""Share-aware preemption end to end over the in-memory API (issue 38 item 2): the controller's
passes evict the cheapest lower-priority share through the Eviction API (a PodDisruptionBudget's
refusal respected), mark the victim, hold the freed capacity for the preemptor (after a restart
too), and place the preemptor once the victim is gone. The choice of victims itself is
test_gpu_preemption.py's."""

from __future__ import annotations

import copy
import json
from typing import Any

from dra_driver.controller.allocator import Unschedulable
from dra_driver.controller.controller import Controller
from dra_driver.controller.nomination import hold_key, nomination_annotation
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Obj, Resource
from dra_driver.kube.watch import object_key
from dra_driver.resource.objects import PodView
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS, claim, pod, request

NOMINATION = nomination_annotation(DRIVER)


def busy_card(**kwargs: Any) -> FakeCluster:
    """One H100 (about 79 GiB) shared by ``old`` (40 GiB) and ``young`` (39 GiB), both of
    priority 1 and running; nothing else fits on it."""
    cluster = FakeCluster(("node-1",), **kwargs)
    for name in ("old", "young"):
        cluster.gpu_pod(name, "40Gi" if name == "old" else "39Gi", priority=1)
        cluster.run()
        cluster.bind(name)
    assert not cluster.gated("old") and not cluster.gated("young")
    return cluster


def stored(cluster: FakeCluster, name: str) -> Obj:
    return cluster.kube.stored(PODS, NS, name)


def evicted(cluster: FakeCluster) -> list[str]:
    """The pods the API has terminating (an eviction gave them their deletionTimestamp)."""
    return sorted(
        obj["metadata"]["name"]
        for (plural, _, _), obj in cluster.kube.objects.items()
        if plural == "pods" and obj["metadata"].get("deletionTimestamp")
    )


def disruption(cluster: FakeCluster, name: str) -> Obj | None:
    conditions = (stored(cluster, name).get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "DisruptionTarget"), None)


def events(cluster: FakeCluster, reason: str) -> list[tuple[str, str]]:
    """(pod, message) of the events of ``reason``."""
    return [
        (obj["involvedObject"]["name"], obj["message"])
        for (plural, _, _), obj in cluster.kube.objects.items()
        if plural == "events" and obj.get("reason") == reason
    ]


def terminate(cluster: FakeCluster, name: str) -> None:
    """What follows an eviction: the informer sees the pod terminating, then gone, then its claim
    released (kube-controller-manager deletes a pod's own claim)."""
    cluster.change(
        PODS, NS, name, lambda pod: pod["metadata"].update(deletionTimestamp="2026-12-01T12:00:00Z")
    )
    cluster.remove(PODS, name)
    cluster.release(name)


def test_the_youngest_lower_priority_share_is_evicted_and_the_preemptor_runs_after_it() -> None:
    cluster = busy_card()
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert cluster.gated("urgent") and cluster.reason("urgent") == "Unschedulable"
    assert evicted(cluster) == ["young"]
    condition = disruption(cluster, "young")
    assert condition is not None and condition["status"] == "True"
    assert condition["reason"] == "PreemptionByHamiDra" and f"{NS}/urgent" in condition["message"]
    assert disruption(cluster, "old") is None
    ((pod, message),) = events(cluster, "Preempted")
    assert pod == "young" and "Preempted by pod default/urgent (priority 1000" in message
    assert "10Gi on gpu-0" in message
    nomination = json.loads(stored(cluster, "urgent")["metadata"]["annotations"][NOMINATION])
    assert nomination["node"] == "node-1" and nomination["victims"] == [f"{NS}/young"]
    assert cluster.controller.metrics.preemption_victims._value.get() == 1
    # While the victim terminates, nothing more is evicted and the preemptor waits.
    cluster.run()
    assert evicted(cluster) == ["young"]
    terminate(cluster, "young")
    cluster.run()
    assert not cluster.gated("urgent")
    assert cluster.node_of("urgent") == "node-1"
    assert not cluster.controller.cache.ledger.holds()  # placed: its hold is released
    assert evicted(cluster) == [] and disruption(cluster, "old") is None  # old was never touched


def test_the_freed_capacity_is_held_for_the_preemptor_not_taken_by_a_lower_pod() -> None:
    cluster = busy_card()
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"]
    terminate(cluster, "young")
    # A pod of lower priority than the preemptor's planned before it (its next pass) finds the
    # freed 39 GiB less the 10 GiB held: 30 GiB does not fit, 29 GiB would.
    cluster.gpu_pod("sneaky", "30Gi", priority=500)
    cluster.controller._drain()  # the informers' events in, nothing planned yet
    allocator = cluster.controller.allocator
    sneaky = cluster.controller.cache.pods[f"{NS}/sneaky"]
    assert isinstance(allocator.allocate(sneaky), Unschedulable)
    # A pod of higher priority than the preemptor's may take it (kube-scheduler's rule).
    higher = PodView.parse({**dict(sneaky), "spec": {**sneaky["spec"], "priority": 2000}})
    assert not isinstance(allocator.allocate(higher), Unschedulable)
    cluster.run()
    assert not cluster.gated("urgent") and cluster.gated("sneaky")


def test_a_pod_its_disruption_budget_protects_is_not_evicted_the_next_cheapest_is() -> None:
    cluster = busy_card()
    cluster.kube.budgets[f"{NS}/young"] = 0
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["old"]
    assert disruption(cluster, "young") is None
    assert [pod for pod, _ in events(cluster, "Preempted")] == ["old"]


def test_nothing_is_evicted_when_every_candidate_is_protected() -> None:
    cluster = busy_card()
    cluster.kube.budgets.update({f"{NS}/young": 0, f"{NS}/old": 0})
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == []
    assert NOMINATION not in (stored(cluster, "urgent")["metadata"].get("annotations") or {})
    assert cluster.controller.metrics.preemptions.labels("refused")._value.get() >= 1


def test_a_budget_used_up_between_the_dry_run_and_the_eviction_stops_the_preemption() -> None:
    """Two victims under one budget allowing one disruption: the dry runs pass, the second
    eviction is refused; its condition is set back and it is left out for a while."""
    cluster = FakeCluster(("node-1",))
    for name in ("a", "b"):
        cluster.gpu_pod(name, "39Gi", priority=1)
        cluster.run()
    cluster.kube.budgets.update({f"{NS}/a": 1, f"{NS}/b": 1})
    real = cluster.kube._evict

    def shared_budget(namespace: str, name: str, eviction: Obj) -> Obj:
        result = real(namespace, name, eviction)
        if not (eviction.get("deleteOptions") or {}).get("dryRun"):
            cluster.kube.budgets.update({f"{NS}/a": 0, f"{NS}/b": 0})  # one budget for both
        return result

    cluster.kube._evict = shared_budget  # type: ignore[method-assign]
    cluster.gpu_pod("urgent", "70Gi", priority=1000)
    cluster.run(1)
    assert len(evicted(cluster)) == 1
    (refused,) = {"a", "b"} - set(evicted(cluster))
    condition = disruption(cluster, refused)
    assert condition is not None and condition["status"] == "False"


def test_preemption_off_evicts_nothing() -> None:
    cluster = busy_card()
    cluster.controller.preemptor.enabled = False
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == [] and cluster.gated("urgent")


def test_a_pod_with_preemption_policy_never_waits_without_evicting() -> None:
    cluster = busy_card()
    cluster.gpu_pod("polite", "10Gi", priority=1000)
    cluster.change(PODS, NS, "polite", lambda pod: pod["spec"].update(preemptionPolicy="Never"))
    cluster.run()
    assert evicted(cluster) == [] and cluster.gated("polite")


def test_a_pod_over_its_quota_preempts_nothing() -> None:
    cluster = busy_card()
    cluster.quota("team", "8Gi")
    cluster.gpu_pod("urgent", "10Gi", priority=1000, namespace="team")
    cluster.run()
    assert evicted(cluster) == []
    assert cluster.gated("urgent", "team")


def test_equal_priority_preempts_nothing() -> None:
    cluster = busy_card()
    cluster.gpu_pod("peer", "10Gi", priority=1)
    cluster.run()
    assert evicted(cluster) == []
    assert cluster.controller.metrics.preemptions.labels("no_candidate")._value.get() >= 1


def restarted(cluster: FakeCluster) -> Controller:
    """A new controller over what the API holds, as its informers would list it (the old one is
    gone: killed mid-preemption), its events applied but nothing planned yet."""
    controller = Controller(cluster.kube, DRIVER, write_workers=0)
    slices = list(cluster.slices.values())
    controller.informers["ResourceSlice"].cache = {object_key(item): item for item in slices}
    controller.cache.refresh_inventory(slices)
    kinds = {
        "DeviceClass": "deviceclasses",
        "Node": "nodes",
        "ResourceClaim": "resourceclaims",
        "Pod": "pods",
    }
    for kind, plural in kinds.items():
        for (stored_plural, _, _), obj in sorted(cluster.kube.objects.items()):
            if stored_plural == plural:
                controller._on_change(kind, None, copy.deepcopy(obj))
    controller._drain()
    return controller


def gone(controller: Controller, cluster: FakeCluster, resource: Resource, name: str) -> None:
    """``name`` deleted from the API, and its informer's event delivered to ``controller``."""
    obj = cluster.kube.objects.pop((resource.plural, NS, name))
    controller._on_change(resource.kind, obj, None)


def test_a_restarted_controller_holds_the_capacity_again_from_the_nomination() -> None:
    cluster = busy_card()
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"]
    uid = stored(cluster, "urgent")["metadata"]["uid"]
    controller = restarted(cluster)  # the victim still terminates
    assert hold_key(uid) in controller.cache.ledger.holds()
    gone(controller, cluster, PODS, "young")
    gone(controller, cluster, RESOURCE_CLAIMS, "young")
    sneaky = claim("sneaky", request(memory="30Gi"))
    controller._on_change("ResourceClaim", None, cluster.kube.put(RESOURCE_CLAIMS, sneaky))
    body = pod("sneaky", {"gpu": "claim:sneaky"})
    body["spec"]["priority"] = 1  # old's: it may not preempt old either
    controller._on_change("Pod", None, cluster.kube.put(PODS, body))
    controller._drain()
    # A lower-priority pod cannot take what was freed for the preemptor...
    assert isinstance(controller.allocator.allocate(controller.cache.pods[f"{NS}/sneaky"]), Unschedulable)
    controller.run_once()
    # ... which is placed at the new controller's first pass, and nothing more evicted.
    assert not stored(cluster, "urgent")["spec"].get("schedulingGates")
    assert stored(cluster, "sneaky")["spec"].get("schedulingGates")
    assert evicted(cluster) == [] and disruption(cluster, "old") is None
    assert hold_key(uid) not in controller.cache.ledger.holds()


def test_the_worked_example_of_policies_md() -> None:
    """docs/policies.md, "Preemption": three batch notebooks on one H100, the youngest protected by
    its budget; a serving pod's 10 GiB evicts notebook-b, and a batch pod cannot take what was
    freed while notebook-b terminates."""
    cluster = FakeCluster(("node-1",))
    for name, memory in (("notebook-a", "40Gi"), ("notebook-b", "20Gi"), ("notebook-c", "19Gi")):
        cluster.gpu_pod(name, memory, priority=100, namespace="team")  # each younger than the last
        cluster.run()
    cluster.kube.budgets["team/notebook-c"] = 0
    cluster.gpu_pod("serving", "10Gi", priority=1000, namespace="prod")
    cluster.run(1)
    assert evicted(cluster) == ["notebook-b"]
    ((pod, message),) = events(cluster, "Preempted")
    assert pod == "notebook-b"
    assert message == (
        "Preempted by pod prod/serving (priority 1000, yours 100) on node node-1: it fits on no "
        "node's free GPU capacity and needs 10Gi on gpu-0 there"
    )
    nomination = json.loads(
        cluster.kube.stored(PODS, "prod", "serving")["metadata"]["annotations"][NOMINATION]
    )
    assert nomination["victims"] == ["team/notebook-b"]
    assert nomination["devices"] == [
        {"pool": "node-1", "device": "gpu-0", "memory": 10 * 1024**3, "cores": 0, "slots": 1}
    ]
    cluster.change(
        PODS,
        "team",
        "notebook-b",
        lambda obj: obj["metadata"].update(deletionTimestamp="2026-12-01T12:01:00Z"),
    )
    cluster.remove(RESOURCE_CLAIMS, "notebook-b", "team")
    cluster.gpu_pod("batch", "15Gi", priority=100, namespace="team")
    cluster.controller._drain()
    assert isinstance(
        cluster.controller.allocator.allocate(cluster.controller.cache.pods["team/batch"]), Unschedulable
    )
    cluster.run()
    assert not cluster.gated("serving", "prod") and cluster.gated("batch", "team")
    assert cluster.node_of("serving", "prod") == "node-1"


def test_a_nomination_no_room_can_follow_any_more_is_withdrawn() -> None:
    """The victim's budget refuses the real eviction (used up after the dry run) and no other
    victim would do: the preemptor's hold and annotation go, so the node is not kept from
    everyone else for nothing."""
    cluster = FakeCluster(("node-1",))
    cluster.gpu_pod("low", "70Gi", priority=1)
    cluster.run()
    cluster.kube.budgets[f"{NS}/low"] = 1
    real = cluster.kube._evict

    def used_up(namespace: str, name: str, eviction: Obj) -> Obj:
        if not (eviction.get("deleteOptions") or {}).get("dryRun"):
            cluster.kube.budgets[f"{NS}/low"] = 0  # another eviction took the budget meanwhile
        return real(namespace, name, eviction)

    cluster.kube._evict = used_up  # type: ignore[method-assign]
    cluster.gpu_pod("urgent", "70Gi", priority=1000)
    cluster.run(1)
    assert evicted(cluster) == []
    assert NOMINATION in stored(cluster, "urgent")["metadata"]["annotations"]
    assert cluster.controller.cache.ledger.holds()
    cluster.controller.queue.resync()  # its next full plan: low is left out, nobody else would do
    cluster.run(1)
    assert NOMINATION not in stored(cluster, "urgent")["metadata"]["annotations"]
    assert not cluster.controller.cache.ledger.holds()
    assert cluster.gated("urgent")


def test_a_pod_the_hold_kept_out_is_planned_again_when_the_hold_is_withdrawn() -> None:
    """No claim changes when a hold goes: its release itself wakes the pods it kept out."""
    cluster = FakeCluster(("node-1",))
    cluster.gpu_pod("low", "70Gi", priority=1)
    cluster.run()
    cluster.kube.budgets[f"{NS}/low"] = 1
    real = cluster.kube._evict

    def used_up(namespace: str, name: str, eviction: Obj) -> Obj:
        if not (eviction.get("deleteOptions") or {}).get("dryRun"):
            cluster.kube.budgets[f"{NS}/low"] = 0
        return real(namespace, name, eviction)

    cluster.kube._evict = used_up  # type: ignore[method-assign]
    cluster.gpu_pod("urgent", "70Gi", priority=1000)
    cluster.run(1)
    assert cluster.controller.cache.ledger.holds()  # nominated; its victim's eviction was refused
    cluster.gpu_pod("small", "5Gi", priority=1)  # fits in the 9 GiB left, were nothing held
    cluster.run()
    assert cluster.gated("small")
    # The preemptor changes (planned in full again): nobody can make room, its hold goes.
    cluster.change(PODS, NS, "urgent", lambda obj: obj["metadata"].setdefault("labels", {}).update(x="y"))
    cluster.run(2)
    assert not cluster.controller.cache.ledger.holds()
    assert not cluster.gated("small")


def test_the_per_card_metrics_count_allocations_not_holds() -> None:
    cluster = busy_card()
    metrics = cluster.controller.metrics

    def allocated() -> float | None:
        cluster.controller._metrics_at = 0.0  # the series are refreshed at most once a second
        cluster.run(1)
        return metrics.gpus.value("hami_dra_gpu_allocated_memory_bytes", ("node-1", "gpu-0", *card_labels()))

    def card_labels() -> tuple[str, str]:
        card = cluster.controller.cache.ledger.state.nodes["node-1"].cards[0]
        return card.uuid, card.product_name

    before = allocated()
    assert before == 79 * 1024**3
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert cluster.controller.cache.ledger.holds()
    assert allocated() == before  # the 10 GiB held for urgent are allocated to nobody yet


def test_a_victim_gone_whose_claim_is_not_released_yet_is_waited_for_not_replaced() -> None:
    """The victim's pod is gone but its claim is not released yet (kube-controller-manager and the
    releaser have not caught up): the preemptor waits for it, old is not evicted in its place."""
    cluster = busy_card()
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"]
    cluster.remove(PODS, "young")
    # A change of the preemptor's own: it is planned in full again (a retry on the freed node
    # alone would not preempt at all).
    cluster.change(PODS, NS, "urgent", lambda obj: obj["metadata"].setdefault("labels", {}).update(seen="1"))
    cluster.run()
    assert evicted(cluster) == [] and disruption(cluster, "old") is None and cluster.gated("urgent")
    assert cluster.controller.preemptor.nominations.held()  # still held while the claim goes
    cluster.release("young")
    cluster.run()
    assert not cluster.gated("urgent") and disruption(cluster, "old") is None
