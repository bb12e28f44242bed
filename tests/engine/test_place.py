"""Placement rules from the seed and design.md, one test per rule."""

from dra_driver.engine import (
    MIB,
    ClusterState,
    DeviceShare,
    GpuCard,
    Placement,
    place,
    place_and_allocate,
)
from tests.engine.helpers import request, t4, tenants, worked_example


def _chosen(state: ClusterState, policy: str | None, **kwargs: object) -> list[int]:
    decision = place(state, request(policy, **kwargs))  # type: ignore[arg-type]
    assert decision.placement is not None, decision.reason
    return [share.index for share in decision.placement.devices]


def test_worked_example_mutex_binpack_picks_gpu2_with_seed_scores() -> None:
    state = worked_example()
    decision = place(state, request("mutex,binpack"))
    assert decision.placement == Placement("node-1", (DeviceShare(index=2, memory=1000 * MIB, cores=0),))
    assert [round(card.score, 6) for card in decision.candidates] == [3.302083, 1.651042, 0.0, 0.0]
    assert [card.eligible for card in decision.candidates] == [False, False, True, True]
    assert [card.chosen for card in decision.candidates] == [False, False, True, False]


def test_worked_example_plain_binpack_picks_gpu0() -> None:
    assert _chosen(worked_example(), "binpack") == [0]


def test_default_policy_is_spread() -> None:
    assert _chosen(worked_example(), None) == [2]
    assert _chosen(worked_example(), "spread") == [2]


def test_sort_key_order_matters() -> None:
    # GPU0 on NUMA 1 is the busiest; GPU2/GPU3 on NUMA 0 are less used.
    state = ClusterState([t4(0, numa=1), t4(1, numa=1), t4(2, numa=0), t4(3, numa=0)])
    tenants(state, "node-1", 0, 2)
    tenants(state, "node-1", 2, 1)
    assert _chosen(state, "binpack,numa") == [0]
    assert _chosen(state, "numa,binpack") == [2]
    assert _chosen(state, "numa,spread") == [3]
    assert _chosen(state, "numa") == [2]  # numa alone: lowest NUMA, then lowest index


def test_plain_binpack_breaks_score_ties_by_numa_then_index() -> None:
    state = ClusterState([t4(0, numa=1), t4(1, numa=0), t4(2, numa=0)])
    assert _chosen(state, "binpack") == [1]
    assert _chosen(state, "mutex,binpack") == [0]  # a chain without numa: index only


def test_unknown_numa_sorts_last() -> None:
    state = ClusterState([t4(0, numa=None), t4(1, numa=3)])
    assert _chosen(state, "spread,numa") == [1]


def test_multi_gpu_takes_first_n_in_sorted_order() -> None:
    state = ClusterState([t4(i) for i in range(4)])
    tenants(state, "node-1", 3, 2)
    tenants(state, "node-1", 1, 1)
    assert _chosen(state, "binpack", count=2) == [3, 1]
    assert _chosen(state, "spread", count=2) == [0, 2]


def test_numa_bind_keeps_all_gpus_on_one_numa_node() -> None:
    state = ClusterState([t4(0, numa=0), t4(1, numa=1), t4(2, numa=1), t4(3, numa=0)])
    tenants(state, "node-1", 0, 3)
    tenants(state, "node-1", 3, 3)  # NUMA 0 is full for mutex
    assert sorted(_chosen(state, "binpack", count=2, numa_bind=True)) == [0, 3]
    assert sorted(_chosen(state, "mutex", count=2, numa_bind=True)) == [1, 2]
    # Without numaBind, spread takes the two idle cards wherever they are.
    assert sorted(_chosen(state, "spread", count=2)) == [1, 2]


def test_numa_bind_failure_reasons_match_hami() -> None:
    state = ClusterState([t4(0, numa=0), t4(1, numa=1)])
    decision = place(state, request("spread", count=2, numa_bind=True))
    assert not decision.allocated
    assert decision.reason == "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"


def test_node_policy_binpack_and_spread_with_name_ties() -> None:
    state = ClusterState([t4(0, node="b"), t4(0, node="a"), t4(0, node="c")])
    tenants(state, "c", 0, 1)
    assert place(state, request("spread", node_policy="binpack")).node == "c"
    assert place(state, request("spread", node_policy="spread")).node == "a"


def test_node_falls_through_to_next_when_best_does_not_fit() -> None:
    state = ClusterState([t4(0, node="busy"), t4(0, node="idle")])
    tenants(state, "busy", 0, 1)
    decision = place(state, request("mutex", node_policy="binpack"))
    assert decision.node == "idle"


def test_allowed_nodes_restricts_placement() -> None:
    state = ClusterState([t4(0, node="a"), t4(0, node="b")])
    assert place(state, request(allowed_nodes=frozenset({"b"}))).node == "b"
    decision = place(state, request(allowed_nodes=frozenset()))
    assert not decision.allocated and "no node" in (decision.reason or "")


def test_pending_across_nodes_aggregates_card_reasons() -> None:
    state = ClusterState([t4(0, node="a"), t4(1, node="a"), t4(0, node="b")])
    for node, index in (("a", 0), ("a", 1), ("b", 0)):
        tenants(state, node, index, 1)
    decision = place(state, request("mutex"), max_candidates=2)
    assert decision.reason == "3/3 ExclusiveDeviceAllocateConflict"
    assert len(decision.candidates) == 2
    assert {outcome.node for outcome in decision.nodes} == {"a", "b"}


def test_count_above_node_cards_reports_node_insufficient_device() -> None:
    state = ClusterState([t4(0)])
    decision = place(state, request(count=2))
    assert "NodeInsufficientDevice" in (decision.reason or "")


def test_place_and_allocate_updates_usage_incrementally() -> None:
    state = ClusterState([t4(0), t4(1)])
    first = place_and_allocate(state, request("binpack"))
    second = place_and_allocate(state, request("binpack"))
    assert first.placement is not None and second.placement is not None
    assert first.placement.devices[0].index == second.placement.devices[0].index == 0
    assert state.nodes["node-1"].usage[0].tenants == 2


def test_topology_aware_single_gpu_leaves_best_connected_cards() -> None:
    links = {
        0: {1: 200, 2: 10, 3: 10},
        1: {0: 200, 2: 10, 3: 10},
        2: {0: 10, 1: 10, 3: 10},
        3: {0: 10, 1: 10, 2: 10},
    }
    cards = [
        GpuCard(node="n", index=i, memory=80 * 1024 * MIB, product_name="H100", numa_node=0, links=links[i])
        for i in range(4)
    ]
    state = ClusterState(cards)
    assert _chosen(state, "topology-aware") == [2]
    assert sorted(_chosen(state, "topology-aware", count=2)) == [0, 1]
    assert _chosen(state, "topology-aware", count=4) == [0, 1, 2, 3]
