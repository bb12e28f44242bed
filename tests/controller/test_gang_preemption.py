"""Preemption for a whole gang (issue 38: "preemption of lower-priority pods for a whole gang
follows the same rules"), end to end over the in-memory API: a gang that cannot reach its minimum
for capacity evicts the cheapest lower-priority shares through the Eviction API, holds the freed
capacity for its members while the victims terminate, and is placed all together after them;
never a pod of equal priority, never over its GpuQuota, and its holds go with it."""

from __future__ import annotations

import json

from dra_driver.controller.allocator import Unschedulable
from dra_driver.controller.gang_plan import plan_gang
from dra_driver.controller.gang_preemption import gang_candidate, gang_refusal
from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL, GangPolicy, group_of
from dra_driver.controller.nomination import hold_key, nomination_annotation
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.test_preemption import NOW, Share, running
from tests.controller.test_preemption_flow import (
    busy_card,
    disruption,
    events,
    evicted,
    gone,
    restarted,
    stored,
    terminate,
)
from tests.controller.worlds import CacheWorld

NOMINATION = nomination_annotation(DRIVER)


def share_gang(
    cluster: FakeCluster,
    group: str,
    size: int,
    memory: str,
    *,
    priority: int,
    namespace: str = NS,
    minimum: int | None = None,
    never: bool = False,
) -> list[str]:
    """``size`` gated pods of ``memory`` each, labelled with pod group ``group``, whose minimum
    (``minimum``, default all) the annotation gives."""
    names = [f"{group}-{index}" for index in range(size)]
    annotations = {MIN_MEMBERS_ANNOTATION: str(minimum or size)}
    for name in names:
        cluster.gpu_pod(name, memory, priority=priority, namespace=namespace, annotations=annotations)

        def labelled(pod: dict[str, object], never: bool = never) -> None:
            pod["metadata"]["labels"] = {POD_GROUP_LABEL: group}  # type: ignore[index]
            if never:
                pod["spec"]["preemptionPolicy"] = "Never"  # type: ignore[index]

        cluster.change(PODS, namespace, name, labelled)
    return names


def held(cluster: FakeCluster) -> dict[str, str]:
    """Hold key -> the node its uses are on."""
    ledger = cluster.controller.cache.ledger
    found = {}
    for key, uses in ledger.holds().items():
        device = ledger.device(uses[0].device)
        found[key] = device.node if device is not None else "?"
    return found


def uid(cluster: FakeCluster, name: str) -> str:
    return str(stored(cluster, name)["metadata"]["uid"])


def test_a_gang_evicts_the_cheapest_lower_priority_share_and_runs_after_it() -> None:
    cluster = busy_card()  # old 40Gi and young 39Gi, priority 1, on node-1's one card
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    cluster.run()
    assert [name for name in members if not cluster.gated(name)] == []
    assert evicted(cluster) == ["young"]  # 39Gi frees room for both members; old is not touched
    condition = disruption(cluster, "young")
    assert condition is not None and condition["status"] == "True"
    assert "Preempted by gang default/train (priority 1000" in condition["message"]
    assert "priority 1000, yours 1" in condition["message"] and "30Gi on gpu-0 there" in condition["message"]
    ((victim, message),) = events(cluster, "Preempted")
    assert victim == "young" and "gang default/train" in message
    assert [pod for pod, _ in events(cluster, "Preempting")] == ["train-0"]
    for name in members:  # every member nominated, its share held on node-1
        nomination = json.loads(stored(cluster, name)["metadata"]["annotations"][NOMINATION])
        assert nomination["node"] == "node-1" and nomination["victims"] == [f"{NS}/young"]
        assert held(cluster)[hold_key(uid(cluster, name))] == "node-1"
    assert disruption(cluster, "old") is None
    # While the victim terminates nothing more is evicted, and a lower pod cannot take the room.
    cluster.run()
    assert evicted(cluster) == ["young"]
    terminate(cluster, "young")
    cluster.gpu_pod("sneaky", "30Gi", priority=1)  # lower than the gang, may evict nobody
    cluster.controller._drain()
    sneaky = cluster.controller.cache.pods[f"{NS}/sneaky"]
    assert isinstance(cluster.controller.allocator.allocate(sneaky), Unschedulable)
    cluster.run()
    assert [name for name in members if not cluster.gated(name)] == members
    assert {cluster.node_of(name) for name in members} == {"node-1"}
    assert cluster.gated("sneaky")
    assert held(cluster) == {}  # placed: the holds are released
    assert evicted(cluster) == [] and disruption(cluster, "old") is None


def test_a_gang_across_nodes_evicts_on_each_node_it_needs_and_none_other() -> None:
    cluster = FakeCluster(("node-1", "node-2", "node-3"))
    for name, node, priority in (("low-1", "node-1", 1), ("mid", "node-2", 50), ("low-3", "node-3", 1)):
        cluster.gpu_pod(name, "81043Mi", priority=priority)  # each holds its node's card whole
        cluster.run()
        cluster.bind(name, node)
    members = share_gang(cluster, "train", 2, "81043Mi", priority=100)
    cluster.run()
    assert evicted(cluster) == ["low-1", "low-3"]  # never mid: two cards are enough
    nodes = {
        json.loads(stored(cluster, name)["metadata"]["annotations"][NOMINATION])["node"] for name in members
    }
    assert nodes == {"node-1", "node-3"}
    messages = dict(events(cluster, "Preempted"))
    assert "on node node-1" in messages["low-1"] and "on node node-3" in messages["low-3"]
    for name in ("low-1", "low-3"):
        terminate(cluster, name)
    cluster.run()
    assert [name for name in members if not cluster.gated(name)] == members
    assert sorted(cluster.node_of(name) for name in members) == ["node-1", "node-3"]


def test_a_gang_never_evicts_pods_of_its_own_priority() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "peers", 2, "15Gi", priority=1)
    cluster.run()
    assert evicted(cluster) == [] and all(cluster.gated(name) for name in members)
    assert held(cluster) == {}
    assert cluster.controller.metrics.preemptions.labels("no_candidate")._value.get() >= 1


def test_a_gang_over_its_quota_preempts_nothing() -> None:
    """Room for both members would exceed the namespace's GpuQuota (20Gi for 2 x 15Gi)."""
    cluster = busy_card()
    cluster.quota("team", "20Gi")
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000, namespace="team")
    cluster.run()
    assert evicted(cluster) == [] and all(cluster.gated(name, "team") for name in members)
    assert held(cluster) == {}


def test_a_gang_with_a_member_that_never_preempts_evicts_nothing() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "polite", 2, "15Gi", priority=1000, never=True)
    cluster.run()
    assert evicted(cluster) == [] and all(cluster.gated(name) for name in members)


def test_the_holds_go_when_the_gang_is_deleted() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"] and len(held(cluster)) == 2
    for name in members:
        cluster.remove(PODS, name)
        cluster.release(name)
    cluster.controller._drain()  # the informers' events in, nothing planned yet
    assert held(cluster) == {}
    terminate(cluster, "young")
    cluster.gpu_pod("next", "39Gi", priority=1)  # the room freed is anyone's again
    cluster.run()
    assert not cluster.gated("next")


def test_the_holds_go_when_the_gang_can_no_longer_fit() -> None:
    """A member is deleted while the victim terminates: the gang (minimum 2) cannot be placed,
    so the other member's hold and nomination go and nothing more is evicted."""
    cluster = busy_card()
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    cluster.run()
    assert len(held(cluster)) == 2
    cluster.remove(PODS, members[1])
    cluster.run()
    assert held(cluster) == {}
    assert NOMINATION not in (stored(cluster, members[0])["metadata"].get("annotations") or {})
    assert evicted(cluster) == ["young"]


def test_a_restarted_controller_holds_every_member_s_capacity_again_and_places_the_gang() -> None:
    cluster = busy_card()
    members = share_gang(cluster, "train", 2, "15Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"]
    controller = restarted(cluster)  # killed while the victim terminates
    holds = {hold_key(uid(cluster, name)) for name in members}
    assert holds <= set(controller.cache.ledger.holds())
    gone(controller, cluster, PODS, "young")
    gone(controller, cluster, RESOURCE_CLAIMS, "young")
    controller.run_once()
    assert all(not stored(cluster, name)["spec"].get("schedulingGates") for name in members)
    assert evicted(cluster) == [] and disruption(cluster, "old") is None
    assert not holds & set(controller.cache.ledger.holds())


def notebooks() -> FakeCluster:
    """docs/policies.md's worked example: three batch notebooks (priority 100) on one H100,
    notebook-c protected by its PodDisruptionBudget."""
    cluster = FakeCluster(("node-1",))
    for name, memory in (("notebook-a", "40Gi"), ("notebook-b", "20Gi"), ("notebook-c", "19Gi")):
        cluster.gpu_pod(name, memory, priority=100, namespace="team")  # each younger than the last
        cluster.run()
    cluster.kube.budgets["team/notebook-c"] = 0
    return cluster


def test_the_gang_worked_example_of_policies_md() -> None:
    """docs/policies.md, "Preemption", "Gangs": two 8 GiB workers of gang train evict notebook-b
    alone and are placed on gpu-0 once it is gone."""
    cluster = notebooks()
    members = share_gang(cluster, "train", 2, "8Gi", priority=1000, namespace="team")
    cluster.run(1)
    assert evicted(cluster) == ["notebook-b"]
    ((pod, message),) = events(cluster, "Preempted")
    assert pod == "notebook-b"
    assert message == (
        "Preempted by gang team/train (priority 1000, yours 100) on node node-1: the gang fits on no "
        "nodes' free GPU capacity all together and needs 16Gi on gpu-0 there"
    )
    terminate_in = "team"
    cluster.change(
        PODS,
        terminate_in,
        "notebook-b",
        lambda obj: obj["metadata"].update(deletionTimestamp="2026-12-01T12:01:00Z"),
    )
    cluster.remove(PODS, "notebook-b", terminate_in)
    cluster.remove(RESOURCE_CLAIMS, "notebook-b", terminate_in)
    cluster.run()
    assert [name for name in members if not cluster.gated(name, "team")] == members
    assert {cluster.node_of(name, "team") for name in members} == {"node-1"}
    assert held(cluster) == {}


def test_a_gang_over_many_cards_evicts_only_on_the_cards_it_takes() -> None:
    """Eight T4 full of four shares each (priorities 0-3): four members needing three shares freed
    on a card each. The bounded reprieve (24 tries for 32 pods) stops before trying every pod;
    the victims on cards no member takes are let go, leaving the 12 cheapest on four cards."""
    world = CacheWorld(8)
    for gpu in range(8):
        for share in range(4):
            running(
                world, Share(f"s-{gpu}-{share}", 3700, priority=share, device=f"gpu-{gpu}", hour=1 + share)
            )
    members = []
    for index in range(4):
        name = f"worker-{index}"
        world.add_claim(claim(name, request(memory="8000Mi")))
        body = pod(name, {"gpu": f"claim:{name}"})
        body["metadata"]["labels"] = {POD_GROUP_LABEL: "train"}
        body["spec"]["priority"] = 10
        members.append(world.add_pod(body))
    ref = group_of(members[0])
    assert ref is not None
    plan = plan_gang(world.allocator, ref, GangPolicy(4), members)
    assert not plan.ready and gang_refusal(plan) is None
    found = gang_candidate(world.allocator, plan, now=NOW)
    assert found is not None
    assert len(found.victims) == 12 and max(victim.priority for victim in found.victims) == 2
    cards = {victim.key.rsplit("-", 2)[1] for victim in found.victims}
    assert len(cards) == 4
    with world.cache.ledger.hiding(found.freed):
        assert plan_gang(world.allocator, ref, GangPolicy(4), members).ready


def test_victims_gone_whose_claims_are_not_released_yet_are_waited_for_not_replaced() -> None:
    """The victims' pods are gone but one claim is not released yet (kube-controller-manager and
    the releaser have not caught up): the gang waits for it instead of evicting a third pod."""
    cluster = FakeCluster(("node-1", "node-2", "node-3"))
    for name, node in (("low-1", "node-1"), ("low-2", "node-2"), ("low-3", "node-3")):
        cluster.gpu_pod(name, "81043Mi", priority=1)
        cluster.run()
        cluster.bind(name, node)
    members = share_gang(cluster, "train", 2, "81043Mi", priority=100)
    cluster.run()
    victims = evicted(cluster)
    assert len(victims) == 2
    for name in victims:
        cluster.remove(PODS, name)
    cluster.release(victims[0])  # the other victim's claim is still allocated, used by nobody
    cluster.run()
    assert evicted(cluster) == []
    (spared,) = {"low-1", "low-2", "low-3"} - set(victims)
    assert disruption(cluster, spared) is None and all(cluster.gated(name) for name in members)
    cluster.release(victims[1])
    cluster.run()
    assert [name for name in members if not cluster.gated(name)] == members
