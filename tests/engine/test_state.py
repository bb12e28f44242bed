import pytest

from dra_driver.engine import ClusterState, DeviceShare, NodePolicy, Placement, StateError
from tests.engine.helpers import t4, tenants


def test_ranking_follows_usage_changes() -> None:
    state = ClusterState([t4(0, node="a"), t4(0, node="b")])
    assert [n.name for n in state.ranked_nodes(NodePolicy.BINPACK)] == ["a", "b"]
    tenants(state, "b", 0, 1)
    assert [n.name for n in state.ranked_nodes(NodePolicy.BINPACK)] == ["b", "a"]
    assert [n.name for n in state.ranked_nodes(NodePolicy.SPREAD)] == ["a", "b"]
    state.release(Placement("b", (DeviceShare(0, 1000 * 1024 * 1024, 0),)))
    assert [n.name for n in state.ranked_nodes(NodePolicy.BINPACK)] == ["a", "b"]


def test_release_refuses_double_release_and_keeps_state() -> None:
    state = ClusterState([t4(0)])
    placement = Placement("node-1", (DeviceShare(0, 1024, 0),))
    state.allocate(placement)
    state.release(placement)
    with pytest.raises(StateError, match="exceeds its recorded usage"):
        state.release(placement)
    assert state.nodes["node-1"].usage[0].tenants == 0


def test_allocate_refuses_overcommit_unless_observed() -> None:
    state = ClusterState([t4(0, slots=1)])
    state.allocate(Placement("node-1", (DeviceShare(0, 0, 0),)))
    with pytest.raises(StateError, match="overcommits"):
        state.allocate(Placement("node-1", (DeviceShare(0, 0, 0),)))
    state.allocate(Placement("node-1", (DeviceShare(0, 0, 0),)), strict=False)
    assert state.nodes["node-1"].usage[0].tenants == 2


def test_unknown_node_or_card_is_an_error_and_changes_nothing() -> None:
    state = ClusterState([t4(0)])
    with pytest.raises(StateError, match="unknown node"):
        state.allocate(Placement("nope", (DeviceShare(0, 0, 0),)))
    with pytest.raises(StateError, match="no gpu-7"):
        state.allocate(Placement("node-1", (DeviceShare(0, 0, 0), DeviceShare(7, 0, 0))), strict=False)
    assert state.nodes["node-1"].usage[0].tenants == 0


def test_set_node_keeps_usage_and_rejects_duplicates() -> None:
    state = ClusterState([t4(0)])
    tenants(state, "node-1", 0, 1)
    state.set_node("node-1", [t4(0), t4(1)])
    assert state.nodes["node-1"].usage[0].tenants == 1
    with pytest.raises(StateError, match="twice"):
        state.set_node("node-1", [t4(0), t4(0)])
    state.remove_node("node-1")
    assert list(state.ranked_nodes(NodePolicy.SPREAD)) == []


def test_the_idle_card_rankings_are_the_full_rankings_filtered() -> None:
    """Mutex requests scan only nodes with an idle card; that list must stay exactly the full
    ranking without the nodes whose every card has a tenant, through allocations, releases,
    unhealthy cards and inventory changes."""
    import random

    from dra_driver.engine import GpuCard

    rng = random.Random(7)
    state = ClusterState(t4(i, node=f"n{n}") for n in range(12) for i in range(2))
    placed: list[Placement] = []
    for step in range(400):
        node = f"n{rng.randrange(12)}"
        if placed and rng.random() < 0.4:
            state.release(placed.pop(rng.randrange(len(placed))))
        elif step % 97 == 0:
            cards = [
                GpuCard(node=node, index=i, memory=15360 * 2**20, healthy=rng.random() < 0.7)
                for i in range(2)
            ]
            placed = [p for p in placed if p.node != node]
            state.remove_node(node)
            state.set_node(node, cards)
        else:
            share = DeviceShare(rng.randrange(2), 2**30, 0)
            try:
                state.allocate(Placement(node, (share,)))
                placed.append(Placement(node, (share,)))
            except StateError:
                pass
        for policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
            full = [n.name for n in state.ranked_nodes(policy) if n.idle_cards]
            assert [n.name for n in state.ranked_nodes(policy, with_idle_card=True)] == full
    assert any(not n.idle_cards for n in state.nodes.values())  # the filter was exercised
