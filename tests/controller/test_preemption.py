"""Share-aware preemption's choice of victims (dra_driver/controller/preemption.py), table-driven
over the controller's own cache and planner: cards with shares held by pods of given priorities,
a pending preemptor, and the victims (and node) the controller would choose, or none.

The search itself (reprieve, then fewer victims within a budget) is tested with a toy oracle at the
end, where a case needs more pods than a card holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dra_driver.controller.allocator import Unschedulable
from dra_driver.controller.preemption import (
    Holder,
    Site,
    best_on,
    candidates_for,
    cost_of,
    epoch,
    merged,
    refusal,
    select,
    select_joint,
    sites_for,
)
from dra_driver.controller.reasons import Reason
from dra_driver.kube.api import Obj
from dra_driver.resource.objects import PodView
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.worlds import CacheWorld

#: A T4's memory as the simulated profile publishes it (15360Mi less 393Mi reserved).
T4 = 14967
NOW = epoch("2026-12-01T12:00:00Z")


@dataclass(frozen=True)
class Share:
    """A running pod ``name`` holding one allocation of ours: ``memory`` MiB on ``device`` of
    ``node`` (None: the whole card), at ``priority``, created at hour ``hour`` of the day."""

    name: str
    memory: int | None
    priority: int = 0
    device: str = "gpu-0"
    node: str = "node-1"
    hour: int = 1
    deleting: bool = False
    namespace: str = NS


def allocation(share: Share) -> Obj:
    result: Obj = {"request": "gpu", "driver": DRIVER, "pool": share.node, "device": share.device}
    if share.memory is not None:
        result["shareID"] = f"{abs(hash(share.name)) % 10**8:08d}-0000-0000-0000-000000000000"
        result["consumedCapacity"] = {"memory": f"{share.memory}Mi", "cores": "0", "slots": "1"}
    return {"devices": {"results": [result]}}


def running(world: CacheWorld, share: Share) -> None:
    """The share's claim, allocated, and its pod bound to the node."""
    body = claim(share.name, request(memory=None if share.memory is None else f"{share.memory}Mi"))
    body["metadata"]["namespace"] = share.namespace
    body["status"] = {"allocation": allocation(share)}
    world.add_claim(body)
    holder = pod(share.name, {"gpu": f"claim:{share.name}"}, gated=False)
    holder["metadata"]["namespace"] = share.namespace
    holder["metadata"]["creationTimestamp"] = f"2026-12-01T{share.hour:02d}:00:00Z"
    holder["spec"]["nodeName"] = share.node
    holder["spec"]["priority"] = share.priority
    if share.deleting:
        holder["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:00Z"
    world.add_pod(holder)


def preemptor(
    world: CacheWorld,
    memory: int | None,
    priority: int,
    *,
    count: int = 1,
    annotations: dict[str, str] | None = None,
    namespace: str = NS,
) -> PodView:
    body = claim("p", request(memory=None if memory is None else f"{memory}Mi", count=count))
    body["metadata"]["namespace"] = namespace
    world.add_claim(body)
    gated = pod("p", {"gpu": "claim:p"}, annotations=annotations)
    gated["metadata"]["namespace"] = namespace
    gated["spec"]["priority"] = priority
    return world.add_pod(gated)


@dataclass(frozen=True)
class Case:
    id: str
    shares: tuple[Share, ...]
    memory: int | None  # the preemptor's request per card (None: whole cards)
    priority: int
    expected: tuple[str, ...] | None  # the victims chosen; None: no candidate
    node: str = "node-1"
    count: int = 1
    gpus: int = 1
    nodes: tuple[str, ...] = ("node-1",)
    refused: frozenset[str] = frozenset()
    annotations: dict[str, str] = field(default_factory=dict)


CASES = (
    Case(
        "the one cheapest share is enough",
        (Share("a", 7000, priority=1), Share("b", 7000, priority=2)),
        memory=6000, priority=10, expected=("a",),
    ),
    Case(
        "fewest victims before lower priorities (the reprieve alone would pick b and c)",
        (Share("a", 8000, priority=5), Share("b", 3400, priority=1), Share("c", 3400, priority=1)),
        memory=7000, priority=10, expected=("a",),
    ),
    Case(
        "among one-victim sets the lowest priority",
        (Share("a", 7400, priority=5), Share("b", 7400, priority=1)),
        memory=7000, priority=10, expected=("b",),
    ),
    Case(
        "same priority: the youngest (the least GPU time lost)",
        (Share("old", 7400, priority=1, hour=1), Share("young", 7400, priority=1, hour=9)),
        memory=7000, priority=10, expected=("young",),
    ),
    Case(
        "a pod of equal priority is never a victim",
        (Share("peer", 7400, priority=10), Share("low", 7400, priority=1)),
        memory=10000, priority=10, expected=None,
    ),
    Case(
        "nor one of higher priority",
        (Share("high", 14000, priority=100),),
        memory=7000, priority=10, expected=None,
    ),
    Case(
        "two victims where one is not enough",
        (Share("a", 5000), Share("b", 5000), Share("c", 4900, priority=50)),
        memory=9000, priority=10, expected=("a", "b"),
    ),
    Case(
        "the node with fewer victims",
        (
            Share("a1", 5000, node="node-1"), Share("a2", 5000, node="node-1"),
            Share("a3", 4900, node="node-1"),
            Share("b1", 12000, priority=3, node="node-2"), Share("b2", 2900, priority=100, node="node-2"),
        ),
        memory=9000, priority=10, expected=("b1",), node="node-2", nodes=("node-1", "node-2"),
    ),
    Case(
        "a pod a PodDisruptionBudget protects is left out: the next cheapest set",
        (Share("guarded", 7400, priority=1), Share("other", 7400, priority=2)),
        memory=7000, priority=10, expected=("other",), refused=frozenset({f"{NS}/guarded"}),
    ),
    Case(
        "every pod that could make room protected: no candidate",
        (Share("guarded", 7400, priority=1), Share("high", 7400, priority=20)),
        memory=7000, priority=10, expected=None, refused=frozenset({f"{NS}/guarded"}),
    ),
    Case(
        "a terminating pod frees enough: no new victim, the preemptor waits for it",
        (Share("leaving", 7400, priority=1, deleting=True), Share("b", 7400, priority=1)),
        memory=7000, priority=10, expected=(),
    ),
    Case(
        "a whole card: the card with the fewest tenants is emptied",
        (
            Share("a", 3000, device="gpu-0"), Share("b", 3000, device="gpu-0"),
            Share("c", 10000, priority=3, device="gpu-1"),
        ),
        memory=None, priority=10, expected=("c",), gpus=2,
    ),
    Case(
        "a share on a card held whole: the whole-card tenant goes (mutex with everything)",
        (Share("whole", None, priority=1, device="gpu-0"), Share("s", 14000, priority=2, device="gpu-1")),
        memory=1000, priority=10, expected=("whole",), gpus=2,
    ),
    Case(
        "the mutex policy needs an empty card: the card with one tenant",
        (
            Share("a", 1000, device="gpu-0"), Share("b", 1000, device="gpu-0"),
            Share("c", 1000, priority=5, device="gpu-1"),
        ),
        memory=1000, priority=10, expected=("c",), gpus=2,
        annotations={"hami.io/gpu-scheduler-policy": "mutex"},
    ),
    Case(
        "two cards on one node, across both",
        (Share("a", 14000, device="gpu-0"), Share("b", 14000, device="gpu-1"), Share("c", 500)),
        memory=7000, priority=10, count=2, expected=("a", "b"), gpus=2,
    ),
)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_victims_chosen(case: Case) -> None:
    world = CacheWorld(case.gpus, nodes=case.nodes)
    for share in case.shares:
        running(world, share)
    view = preemptor(world, case.memory, case.priority, count=case.count, annotations=case.annotations)
    outcome = world.allocator.allocate(view)
    assert isinstance(outcome, Unschedulable) and outcome.reason == Reason.UNSCHEDULABLE, outcome
    refused = frozenset(case.refused)
    found = candidates_for(world.allocator, view, refused=refused, now=NOW)
    if case.expected is None:
        assert found == []
        return
    assert found, "a candidate was expected"
    best = found[0]
    assert best.node == case.node
    assert sorted(victim.key.partition("/")[2] for victim in best.victims) == sorted(case.expected)
    # What was freed is really enough: hidden from the ledger, the pod fits there.
    with world.cache.ledger.hiding(best.freed):
        assert not isinstance(world.allocator.plan_on(view, best.node), Unschedulable)
    # And the what-if left the ledger as it was.
    assert isinstance(world.allocator.allocate(view), Unschedulable)


def test_a_claim_shared_with_a_pod_that_may_not_go_is_never_freed() -> None:
    """Two pods use one claim, the low one and one of the preemptor's priority: evicting the low
    one frees nothing, so the node has no candidate."""
    world = CacheWorld(1)
    running(world, Share("shared", 14000, priority=1))
    peer = pod("peer", {"gpu": "claim:shared"}, gated=False)
    peer["spec"]["nodeName"] = "node-1"
    peer["spec"]["priority"] = 10
    world.add_pod(peer)
    view = preemptor(world, 7000, 10)
    assert candidates_for(world.allocator, view, now=NOW) == []
    # The control: without the peer the low pod's eviction frees the claim.
    world.deliver("Pod", {**peer, "status": {"phase": "Succeeded"}})
    (best,) = candidates_for(world.allocator, view, now=NOW)
    assert [victim.key for victim in best.victims] == [f"{NS}/shared"]


def test_a_preemptor_over_its_quota_finds_no_victims() -> None:
    """GpuQuota is never exceeded by preemption: room made on a card does not help a pod its
    namespace's quota refuses."""
    world = CacheWorld(1)
    running(world, Share("low", 14000, priority=1, namespace="team"))
    world.deliver("GpuQuota", {
        "apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuQuota",
        "metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {"memory": "16Gi"}},
    })  # fmt: skip
    view = preemptor(world, 7000, 10, namespace="team")
    assert candidates_for(world.allocator, view, now=NOW) == []
    # The control: another namespace's pod of the same request finds the victim.
    other = CacheWorld(1)
    running(other, Share("low", 14000, priority=1, namespace="team"))
    assert len(candidates_for(other.allocator, preemptor(other, 7000, 10), now=NOW)) == 1


@pytest.mark.parametrize(
    ("policy", "reason", "expected"),
    [
        ("PreemptLowerPriority", Reason.UNSCHEDULABLE, None),
        ("Never", Reason.UNSCHEDULABLE, "its preemptionPolicy is Never"),
        ("PreemptLowerPriority", Reason.QUOTA_EXCEEDED, "it waits for GpuQuotaExceeded, not for capacity"),
        ("PreemptLowerPriority", Reason.INVALID_REQUEST, "it waits for InvalidRequest, not for capacity"),
    ],
)
def test_who_may_preempt(policy: str, reason: Reason, expected: str | None) -> None:
    view = PodView.parse({"metadata": {"name": "p"}, "spec": {"priority": 10, "preemptionPolicy": policy}})
    assert refusal(view, reason) == expected


def test_an_unset_preemption_policy_preempts() -> None:
    assert refusal(PodView.parse({"metadata": {"name": "p"}, "spec": {}}), Reason.UNSCHEDULABLE) is None


# --- the search, with a toy oracle: the preemptor needs ``need`` units freed -------------------------
def units_site(*holders: tuple[str, int, int, float], node: str = "n") -> tuple[Site, dict[str, int]]:
    """A site of holders (name, priority, units, started), each with one claim of its own."""
    site = Site(
        node,
        tuple(Holder(name, name, rank, started, frozenset({name})) for name, rank, _, started in holders),
        {name: frozenset({name}) for name, *_ in holders},
    )
    return site, {name: units for name, _, units, _ in holders}


def needs(units: dict[str, int], need: int, calls: list[frozenset[str]] | None = None):  # type: ignore[no-untyped-def]
    def fits(_node: str, freed: frozenset[str]) -> bool:
        if calls is not None:
            calls.append(freed)
        return sum(units[claim] for claim in freed) >= need

    return fits


def test_the_search_finds_fewer_victims_than_the_reprieve() -> None:
    # The reprieve keeps the most important first (big, priority 5) and evicts the four small.
    site, units = units_site(("big", 5, 4, 0.0), *((f"s{i}", 1, 1, 0.0) for i in range(4)))
    best = best_on(site, 10, needs(units, 4), now=100.0)
    assert best is not None and [victim.key for victim in best.victims] == ["big"]


def test_the_search_stops_at_its_budget_with_the_reprieve_s_answer() -> None:
    site, units = units_site(("big", 5, 4, 0.0), *((f"s{i}", 1, 1, 0.0) for i in range(4)))
    calls: list[frozenset[str]] = []
    best = best_on(site, 10, needs(units, 4, calls), now=100.0, budget=0)
    assert best is not None and sorted(victim.key for victim in best.victims) == ["s0", "s1", "s2", "s3"]
    with_budget: list[frozenset[str]] = []
    best_on(site, 10, needs(units, 4, with_budget), now=100.0)
    assert len(with_budget) > len(calls)


def test_nodes_are_chosen_by_the_ordered_criteria() -> None:
    now = 1000.0
    one_high, units_a = units_site(("a", 7, 2, 0.0), node="n-a")
    one_low_old, units_b = units_site(("b", 3, 2, 0.0), node="n-b")
    one_low_young, units_c = units_site(("c", 3, 2, 900.0), node="n-c")
    two_lowest, units_d = units_site(("d1", 0, 1, 0.0), ("d2", 0, 1, 0.0), node="n-d")
    units = {**units_a, **units_b, **units_c, **units_d}
    found = select([two_lowest, one_high, one_low_old, one_low_young], 10, needs(units, 2), now=now)
    assert [candidate.node for candidate in found] == ["n-c", "n-b", "n-a", "n-d"]
    assert cost_of(found[0].victims, now) == (1, 3, 3, 100.0)


def test_a_node_where_evicting_everything_is_not_enough_is_no_candidate() -> None:
    site, units = units_site(("a", 1, 1, 0.0), ("b", 1, 1, 0.0))
    assert best_on(site, 10, needs(units, 3), now=0.0) is None
    assert best_on(site, 1, needs(units, 1), now=0.0) is None  # equal priority: nobody to evict


def test_no_further_node_is_looked_at_once_the_total_budget_is_spent() -> None:
    first, units_a = units_site(("a", 1, 2, 0.0), node="n-a")
    second, units_b = units_site(("b", 0, 2, 0.0), node="n-b")
    calls: list[frozenset[str]] = []
    fits = needs({**units_a, **units_b}, 2, calls)
    assert [c.node for c in select([first, second], 10, fits, now=0.0, total_budget=1)] == ["n-a"]
    assert [c.node for c in select([first, second], 10, fits, now=0.0)] == ["n-b", "n-a"]


def test_sites_are_looked_at_terminating_pods_first_then_the_lowest_priority() -> None:
    world = CacheWorld(1, nodes=("node-1", "node-2", "node-3"))
    running(world, Share("mid", 7000, priority=5, node="node-1"))
    running(world, Share("low", 7000, priority=1, node="node-2"))
    running(world, Share("leaving", 7000, priority=50, node="node-3", deleting=True))
    view = preemptor(world, 7000, 10)
    sites = sites_for(world.cache, view, ("node-1", "node-2", "node-3"), lambda pod: pod.deleting)
    assert [site.node for site in sites] == ["node-3", "node-2", "node-1"]


# --- pods placed together (a gang): the same search over several nodes at once ----------------------
def joint_needs(units: dict[str, int], need: int, calls: list[frozenset[str]] | None = None):  # type: ignore[no-untyped-def]
    def fits(freed: frozenset[str]) -> bool:
        if calls is not None:
            calls.append(freed)
        return sum(units[claim] for claim in freed) >= need

    return fits


def test_a_gang_s_victims_are_taken_over_as_few_nodes_as_needed_the_cheapest_first() -> None:
    low, units_a = units_site(("a1", 1, 2, 0.0), ("a2", 1, 2, 0.0), node="n-a")
    lower, units_b = units_site(("b1", 0, 2, 0.0), node="n-b")
    high, units_c = units_site(("c1", 8, 9, 0.0), node="n-c")
    units = {**units_a, **units_b, **units_c}
    # In the order sites_below gives them: the lowest possible victim first.
    chosen = select_joint([lower, low, high], 10, joint_needs(units, 4), now=100.0)
    assert chosen is not None
    # b1 alone is not enough; b1 and one of n-a's (the youngest, same age: by key) are.
    assert sorted(victim.key for victim in chosen.victims) == ["a2", "b1"]
    assert chosen.node == "n-b+n-a"


def test_a_gang_never_evicts_pods_of_its_priority_or_higher() -> None:
    site, units = units_site(("peer", 10, 5, 0.0), ("boss", 20, 5, 0.0))
    assert select_joint([site], 10, joint_needs(units, 1), now=0.0) is None


def test_a_gang_s_search_is_bounded() -> None:
    sites = []
    units: dict[str, int] = {}
    for index in range(12):
        site, more = units_site(*((f"p{index}-{i}", 1, 1, float(i)) for i in range(6)), node=f"n-{index:02d}")
        sites.append(site)
        units |= more
    calls: list[frozenset[str]] = []
    chosen = select_joint(sites, 10, joint_needs(units, 40, calls), now=100.0, max_nodes=8)
    assert chosen is not None and len(chosen.victims) >= 40
    # 2 calls per prefix at most before it fits, then the bounded reprieve and search.
    assert len(calls) <= 2 * 8 + 24 + 8
    assert select_joint(sites, 10, joint_needs(units, 60), now=100.0, max_nodes=8) is None


def test_merged_sites_keep_each_holder_s_node() -> None:
    world = CacheWorld(1, nodes=("node-1", "node-2"))
    running(world, Share("x", 7000, priority=1, node="node-1"))
    running(world, Share("y", 7000, priority=1, node="node-2"))
    view = preemptor(world, 7000, 10)
    sites = sites_for(world.cache, view, ("node-1", "node-2"), lambda pod: pod.deleting)
    site = merged(sites)
    assert site.node == "node-1+node-2"
    assert {holder.key: holder.node for holder in site.holders} == {f"{NS}/x": "node-1", f"{NS}/y": "node-2"}
