"""Gangs (issue 38 item 3): the members of one group are placed all together, or hold nothing.

Through the controller's passes over the in-memory API (``FakeCluster``): joint planning of a
group (table-driven), the two-phase commit (allocations of every member written before any gate
is lifted), the timeout after which members say why they wait, the Workload API's groups, and the
recovery of a gang a crash left half written (completed, or released: no capacity held).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from dra_driver.contract import FINALIZER
from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.controller.binding import BindingPool
from dra_driver.controller.gang_plan import plan_gang
from dra_driver.controller.gang_refs import (
    COSCHEDULING_POD_GROUPS,
    MIN_MEMBERS_ANNOTATION,
    POD_GROUP_LABEL,
    POD_GROUPS_V1ALPHA3,
    WORKLOADS_V1ALPHA1,
    event_kind,
)
from dra_driver.controller.retries import CommitBackoff
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Obj, Resource
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import NS, claim, pod, request
from tests.waiting import wait_for


class Clock:
    """The controller's clock, stepped by the test (the gang timeout reads it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster_of(nodes: tuple[str, ...], gpus: int, *, timeout: float = 60.0) -> tuple[FakeCluster, Clock]:
    clock = Clock()
    cluster = FakeCluster(nodes, gpus=gpus, backoff=CommitBackoff(clock=clock))
    gangs = cluster.controller.gangs
    gangs.clock = clock
    gangs.timeout = timeout
    return cluster, clock


def group_object(resource: Resource, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def add_group(cluster: FakeCluster, resource: Resource, name: str, spec: Obj) -> None:
    cluster.add(resource, group_object(resource, name, spec), kind=event_kind(resource))


def pod_group(cluster: FakeCluster, name: str, min_member: int, **spec: Any) -> None:
    """scheduler-plugins' PodGroup ``name`` with ``spec.minMember``."""
    add_group(cluster, COSCHEDULING_POD_GROUPS, name, {"minMember": min_member, **spec})


def member(
    cluster: FakeCluster,
    name: str,
    group: str | None,
    gpus: int = 1,
    *,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    spec: Obj | None = None,
) -> None:
    """A claim of ``gpus`` whole cards and a gated pod using it, labelled with pod group ``group``."""
    body = claim(name, request(count=gpus))
    body["metadata"]["namespace"] = NS
    cluster.add(RESOURCE_CLAIMS, body)
    obj = pod(name, {"gpu": f"claim:{name}"}, annotations=annotations)
    if group is not None:
        obj["metadata"]["labels"] = {POD_GROUP_LABEL: group}
    if priority is not None:
        obj["spec"]["priority"] = priority
    obj["spec"].update(spec or {})
    cluster.stamp += 1
    minutes, seconds = divmod(cluster.stamp, 60)
    obj["metadata"]["creationTimestamp"] = f"2026-12-01T00:{minutes:02d}:{seconds:02d}Z"
    cluster.add(PODS, obj)


def gang(cluster: FakeCluster, prefix: str, size: int, gpus: int = 1, **kwargs: Any) -> list[str]:
    names = [f"{prefix}-{index}" for index in range(size)]
    for name in names:
        member(cluster, name, prefix, gpus, **kwargs)
    return names


def allocated(cluster: FakeCluster, name: str) -> bool:
    return bool((cluster.kube.stored(RESOURCE_CLAIMS, NS, name).get("status") or {}).get("allocation"))


def holds(cluster: FakeCluster, names: list[str]) -> list[str]:
    """Which of the pods' claims hold devices, as the API and the ledger say (they must agree)."""
    in_api = [name for name in names if allocated(cluster, name)]
    ledger = cluster.controller.cache.ledger.claims()
    claims = cluster.controller.cache.claims
    in_ledger = [name for name in names if ledger.get(claims[f"{NS}/{name}"].uid)]
    assert in_api == in_ledger, (in_api, in_ledger)
    return in_api


def ungated(cluster: FakeCluster, names: list[str]) -> list[str]:
    return [name for name in names if not cluster.gated(name)]


# --- joint planning, table-driven ------------------------------------------------------------------
@dataclass
class Case:
    """``gangs``: (name, members, min, GPUs each), created in order; ``lone``: pods outside any
    group (name, GPUs), created first; ``placed``: the pods ungated after the passes."""

    id: str
    nodes: int
    gpus: int
    gangs: list[tuple[str, int, int, int]]
    placed: set[str]
    lone: list[tuple[str, int]] = field(default_factory=list)


CASES = [
    Case("group fits", 2, 2, [("a", 4, 4, 1)], {"a-0", "a-1", "a-2", "a-3"}),
    Case("group does not fit: none placed", 1, 3, [("a", 4, 4, 1)], set()),
    Case("min below size: the minimum and what else fits", 1, 3, [("a", 4, 3, 1)], {"a-0", "a-1", "a-2"}),
    Case(
        "mixed with lone pods: the lone pod first, the gang does not fit beside it",
        1,
        4,
        [("a", 2, 2, 2)],
        {"solo"},
        lone=[("solo", 1)],
    ),
    Case(
        "mixed with lone pods: a lone pod takes what the gang leaves",
        1,
        4,
        [("a", 3, 3, 1)],
        {"solo", "a-0", "a-1", "a-2"},
        lone=[("solo", 1)],
    ),
    Case(
        "two 4-GPU gangs on 6 GPUs: the first placed, the second holds nothing",
        3,
        2,
        [("a", 4, 4, 1), ("b", 4, 4, 1)],
        {"a-0", "a-1", "a-2", "a-3"},
    ),
    Case(
        "two gangs that both fit",
        3,
        2,
        [("a", 2, 2, 1), ("b", 2, 2, 2)],
        {"a-0", "a-1", "b-0", "b-1"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_joint_planning(case: Case) -> None:
    cluster, _ = cluster_of(tuple(f"node-{i}" for i in range(case.nodes)), case.gpus)
    everyone = []
    for name, gpus in case.lone:
        member(cluster, name, None, gpus)
        everyone.append(name)
    for name, size, minimum, gpus in case.gangs:
        pod_group(cluster, name, minimum)
        everyone += gang(cluster, name, size, gpus)
    cluster.run(4)
    assert set(ungated(cluster, everyone)) == case.placed
    assert set(holds(cluster, everyone)) == case.placed  # the waiting members hold no device


def test_two_gangs_for_six_gpus_the_second_runs_when_the_first_ends() -> None:
    cluster, _ = cluster_of(("node-0", "node-1", "node-2"), 2)
    pod_group(cluster, "a", 4)
    pod_group(cluster, "b", 4)
    first, second = gang(cluster, "a", 4), gang(cluster, "b", 4)
    cluster.run()
    assert ungated(cluster, first) == first and holds(cluster, second) == []
    for name in first:  # the first gang ends: its pods and claims go
        cluster.remove(PODS, name)
        cluster.release(name)
    cluster.run()
    assert ungated(cluster, second) == second and holds(cluster, second) == second


def test_members_past_the_minimum_are_placed_one_by_one_as_room_appears() -> None:
    cluster, _ = cluster_of(("node-0",), 4)
    member(cluster, "hold", None)
    cluster.run()
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 4)
    cluster.run()
    assert ungated(cluster, names) == names[:3] and holds(cluster, names) == names[:3]
    assert cluster.reason("a-3") == "Unschedulable"  # its own reason: the gang has its minimum
    cluster.remove(PODS, "hold")
    cluster.release("hold")
    cluster.run()
    assert ungated(cluster, names) == names


def test_binpack_packs_a_gang_onto_one_node_and_spread_spreads_it() -> None:
    for policy, nodes_used in (("binpack", 1), ("spread", 2)):
        cluster, _ = cluster_of(("node-0", "node-1"), 4)
        pod_group(cluster, "a", 4)
        names = gang(cluster, "a", 4, annotations={"hami.io/node-scheduler-policy": policy})
        cluster.run()
        assert ungated(cluster, names) == names
        assert len({cluster.node_of(name) for name in names}) == nodes_used, policy


def test_the_joint_plan_leaves_the_ledger_as_it_was() -> None:
    """``plan_gang`` places members tentatively, one after another, then undoes every hold."""
    cluster, _ = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 4)
    names = gang(cluster, "a", 3)
    cluster.run(1)  # the pods are in the cache (their gang waits for its fourth member)
    controller = cluster.controller
    cache = controller.cache
    before = dict(cache.ledger.claims())
    ref = controller.gangs.index.ref(f"{NS}/a-0")
    assert ref is not None
    members = [cache.pods[f"{NS}/{name}"] for name in names]
    plan = plan_gang(controller.allocator, ref, controller.gangs.directory.policy(ref, {}), members)
    devices = [write.uses[0].device for placed in plan.placed for write in placed.writes]
    assert len(set(devices)) == 3  # each member saw the ones before it: three different cards
    assert not plan.ready and "3 of 3 members placeable now, needs 4" in plan.summary()
    assert "1 more member(s) not created yet" in plan.summary()
    assert dict(cache.ledger.claims()) == before


# --- the commit ------------------------------------------------------------------------------------
def test_every_allocation_is_written_before_any_gate_is_lifted() -> None:
    cluster, _ = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)
    cluster.run()
    writes = [(method, name) for method, plural, name in cluster.kube.calls if (method, plural) in {
        ("update/status", "resourceclaims"), ("patch", "pods")}]  # fmt: skip
    first_gate = next(i for i, (method, _) in enumerate(writes) if method == "patch")
    assert sorted(name for method, name in writes[:first_gate]) == names
    assert sorted(name for method, name in writes[first_gate:]) == names
    assert ungated(cluster, names) == names


def test_on_writer_threads_the_gates_follow_every_allocation_too() -> None:
    """The production pool (writes on threads, folded back by the worker's next pass)."""
    cluster, _ = cluster_of(("node-0",), 4)
    controller = cluster.controller
    controller.binding = BindingPool(controller.binder.bind, 2, threading.Event())
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)

    def passed() -> bool:  # a pass folds the writes that finished, and makes the next ones
        controller.run_once()
        return ungated(cluster, names) == names and not controller.binding

    try:
        wait_for(passed, 20, "the gang placed by the worker and its writers")
    finally:
        controller.binding.shutdown()
    assert holds(cluster, names) == names
    writes = [(method, name) for method, plural, name in cluster.kube.calls if (method, plural) in {
        ("update/status", "resourceclaims"), ("patch", "pods")}]  # fmt: skip
    first_gate = next(i for i, (method, _) in enumerate(writes) if method == "patch")
    assert sorted(name for method, name in writes[:first_gate]) == names


def test_a_failed_member_write_lifts_no_gate_and_the_gang_is_completed_next() -> None:
    cluster, clock = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)
    cluster.kube.fail("update/status", "resourceclaims", status=500)
    cluster.controller.run_once()
    assert ungated(cluster, names) == []  # one allocation was not written: every gate stays
    clock.now += 1  # the failed member's backoff ends
    cluster.run(4)
    assert ungated(cluster, names) == names and holds(cluster, names) == names


# --- waiting and its report ------------------------------------------------------------------------
def test_a_waiting_gang_is_quiet_until_its_timeout_then_every_member_says_why() -> None:
    cluster, clock = cluster_of(("node-0",), 2, timeout=30.0)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)
    cluster.run()
    assert [cluster.condition(name) for name in names] == [None] * 3
    assert cluster.controller.gangs.metrics.waiting._value.get() == 1
    clock.now += 31
    cluster.run()
    for name in names:
        condition = cluster.condition(name)
        assert condition is not None and condition["status"] == "False"
        assert condition["reason"] == "Unschedulable"
        assert "2 of 3 members placeable now, needs 3" in condition["message"], condition["message"]
    events = [e for e in cluster.kube.objects.values() if e.get("kind") == "Event"]
    warned = {e["involvedObject"]["name"] for e in events if e.get("reason") == "FailedAllocation"}
    assert warned == set(names)
    assert holds(cluster, names) == []


def test_a_quietly_waiting_members_claims_are_fenced_like_any_pending_pods() -> None:
    """A predecessor's allocation write still in flight can no longer land on a waiting member's
    claim (Binder.fence), report or not."""
    cluster, _ = cluster_of(("node-0",), 2, timeout=600.0)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)
    for name in names:  # the chart's admission puts our finalizer on every claim of our classes
        cluster.change(RESOURCE_CLAIMS, NS, name, lambda obj: obj["metadata"].update(finalizers=[FINALIZER]))
    cluster.run()
    assert [cluster.condition(name) for name in names] == [None] * 3
    fenced = [
        name
        for name in names
        if FENCE_ANNOTATION
        in cluster.kube.stored(RESOURCE_CLAIMS, NS, name)["metadata"].get("annotations", {})
    ]
    assert fenced == names


def test_the_pod_groups_own_schedule_timeout_replaces_the_flag() -> None:
    cluster, clock = cluster_of(("node-0",), 1, timeout=600.0)
    pod_group(cluster, "a", 2, scheduleTimeoutSeconds=5)
    names = gang(cluster, "a", 2)
    cluster.run()
    clock.now += 6
    cluster.run()
    assert all(cluster.condition(name) is not None for name in names)


def test_a_gang_waits_for_its_members_to_exist() -> None:
    cluster, _ = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 2)
    cluster.run()
    assert ungated(cluster, names) == [] and holds(cluster, names) == []
    member(cluster, "a-2", "a")
    cluster.run()
    assert ungated(cluster, [*names, "a-2"]) == [*names, "a-2"]


def test_without_a_pod_group_the_annotation_gives_the_minimum_and_without_either_the_pods_wait() -> None:
    cluster, clock = cluster_of(("node-0",), 4, timeout=10.0)
    names = gang(cluster, "a", 2, annotations={MIN_MEMBERS_ANNOTATION: "2"})
    lost = gang(cluster, "b", 2)
    cluster.run()
    assert ungated(cluster, names) == names
    clock.now += 11
    cluster.run()
    assert ungated(cluster, lost) == [] and holds(cluster, lost) == []
    condition = cluster.condition("b-0")
    assert (
        condition is not None
        and "PodGroup default/b (scheduling.x-k8s.io/v1alpha1) not found" in (condition["message"])
    )
    pod_group(cluster, "b", 2)  # the PodGroup arrives: its members are planned at once
    cluster.run()
    assert ungated(cluster, lost) == lost


def test_a_member_outside_our_gate_counts_towards_the_minimum() -> None:
    """An MPI launcher without GPUs (a neighbour pod) is one of the group's minMember."""
    cluster, _ = cluster_of(("node-0",), 2)
    pod_group(cluster, "a", 3)
    launcher = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "launcher", "namespace": NS, "labels": {POD_GROUP_LABEL: "a"}},
        "spec": {"containers": [{"name": "main", "image": "mpi"}]},
    }
    cluster.add(PODS, launcher)
    names = gang(cluster, "a", 2)
    cluster.run()
    assert ungated(cluster, names) == names


# --- the Workload API ------------------------------------------------------------------------------
def test_a_workload_api_pod_group_is_a_gang_and_a_basic_one_is_not() -> None:
    cluster, _ = cluster_of(("node-0",), 2)
    add_group(cluster, POD_GROUPS_V1ALPHA3, "train", {"schedulingPolicy": {"gang": {"minCount": 3}}})
    add_group(cluster, POD_GROUPS_V1ALPHA3, "serve", {"schedulingPolicy": {"basic": {}}})
    train = [f"train-{i}" for i in range(3)]
    for name in train:
        member(cluster, name, None, spec={"schedulingGroup": {"podGroupName": "train"}})
    member(cluster, "serve-0", None, spec={"schedulingGroup": {"podGroupName": "serve"}})
    cluster.run()
    assert ungated(cluster, train) == [] and holds(cluster, train) == []
    assert ungated(cluster, ["serve-0"]) == ["serve-0"]  # basic: placed alone


def test_a_1_35_workload_ref_names_a_gang_per_replica_key() -> None:
    cluster, _ = cluster_of(("node-0",), 3)
    gang_of_two = {"name": "w", "policy": {"gang": {"minCount": 2}}}
    add_group(cluster, WORKLOADS_V1ALPHA1, "job", {"podGroups": [gang_of_two]})
    for replica in ("0", "1"):
        for index in range(2):
            ref = {"name": "job", "podGroup": "w", "podGroupReplicaKey": replica}
            member(cluster, f"r{replica}-{index}", None, spec={"workloadRef": ref})
    cluster.run()
    assert ungated(cluster, ["r0-0", "r0-1", "r1-0", "r1-1"]) == ["r0-0", "r0-1"]
    assert holds(cluster, ["r1-0", "r1-1"]) == []


# --- crash between member writes -------------------------------------------------------------------
def restarted(first: FakeCluster) -> FakeCluster:
    """A new controller over what ``first``'s API holds (its informers list it all)."""
    successor, _ = cluster_of(
        tuple(first.nodes), len(first.controller.cache.ledger.inventory[first.nodes[0]].devices)
    )
    for plural, resource in (("podgroups", COSCHEDULING_POD_GROUPS), ("resourceclaims", RESOURCE_CLAIMS),
                             ("pods", PODS)):  # fmt: skip
        for (stored_plural, _, _), obj in sorted(first.kube.objects.items()):
            if stored_plural == plural:
                kind = event_kind(resource) if resource is COSCHEDULING_POD_GROUPS else None
                successor.add(resource, copy.deepcopy(obj), kind=kind)
    return successor


def test_a_leader_deposed_between_the_phases_lifts_no_gate_and_the_next_one_does() -> None:
    cluster, _ = cluster_of(("node-0",), 4)
    pod_group(cluster, "a", 3)
    names = gang(cluster, "a", 3)
    controller = cluster.controller
    leading = [True]
    controller.is_leader = lambda: leading[0]
    bind = controller.binding._bind
    held: list[str] = []

    def bind_then_lose_the_lease(placed: Any) -> Any:
        result = bind(placed)
        if placed.hold_gate:
            held.append(placed.pod.name)
            leading[0] = len(held) < len(names)  # the lease is lost once every allocation is written
        return result

    controller.binding._bind = bind_then_lose_the_lease
    controller.run_once()
    assert sorted(held) == names and [name for name in names if allocated(cluster, name)] == names
    assert ungated(cluster, names) == []
    successor = restarted(cluster)
    successor.run()
    assert ungated(successor, names) == names and holds(successor, names) == names


def crashed_mid_commit(extra: list[tuple[str, int, int]] | None = None) -> tuple[FakeCluster, list[str]]:
    """A controller that wrote 2 of a 4-member gang's allocations, then died; its successor is
    started on what the API holds (``extra`` pods, (name, GPUs, priority), created meanwhile)."""
    first, _ = cluster_of(("node-0",), 4)
    pod_group(first, "a", 4)
    names = gang(first, "a", 4)
    first.kube.fail("update/status", "resourceclaims", status=500, times=2)
    # Two allocation writes fail: two members are allocated, none ungated, and the process is
    # gone before its next pass.
    first.controller.run_once()
    assert [name for name in names if allocated(first, name)] == ["a-2", "a-3"]
    assert ungated(first, names) == []
    successor = restarted(first)
    for name, gpus, priority in extra or ():
        member(successor, name, None, gpus, priority=priority)
    return successor, names


def test_after_a_crash_mid_commit_the_successor_completes_the_gang_when_it_still_fits() -> None:
    cluster, names = crashed_mid_commit()
    assert [name for name in names if allocated(cluster, name)] == ["a-2", "a-3"]
    cluster.run()
    assert ungated(cluster, names) == names and holds(cluster, names) == names


def test_after_a_crash_mid_commit_the_successor_releases_a_gang_that_no_longer_fits() -> None:
    """A more important pod took the free cards meanwhile: the half-written gang is released, so
    its two allocated members hold nothing while it waits."""
    cluster, names = crashed_mid_commit(extra=[("urgent", 2, 1000)])
    cluster.run()
    assert ungated(cluster, ["urgent"]) == ["urgent"]
    assert ungated(cluster, names) == [] and holds(cluster, names) == []
    for name in ("a-2", "a-3"):
        status = cluster.kube.stored(RESOURCE_CLAIMS, NS, name).get("status") or {}
        assert "allocation" not in status and "reservedFor" not in status
    assert cluster.controller.gangs.metrics.released._value.get() == 2
    cluster.remove(PODS, "urgent")
    cluster.release("urgent")
    cluster.run()
    assert ungated(cluster, names) == names  # room again: the gang is placed whole
