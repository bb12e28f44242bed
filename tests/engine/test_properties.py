"""Property tests: invariants of the engine over random clusters and requests."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.engine import (
    MIB,
    ClusterState,
    DeviceShare,
    GpuCard,
    Placement,
    PlacementRequest,
    card_score,
    parse_policy_chain,
    place,
    place_and_allocate,
)

NAMES = ["mutex", "binpack", "spread", "numa", "topology-aware"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    node_count = draw(st.integers(1, 3))
    cards = []
    for node in range(node_count):
        for index in range(draw(st.integers(1, 5))):
            cards.append(
                GpuCard(
                    node=f"node-{node}",
                    index=index,
                    memory=draw(st.sampled_from([15360, 40960, 81920])) * MIB,
                    product_name="GPU",
                    numa_node=draw(st.integers(0, 1)),
                    slots=draw(st.integers(1, 4)),
                )
            )
    state = ClusterState(cards)
    for card in cards:
        for _ in range(draw(st.integers(0, card.slots))):
            share = DeviceShare(
                card.index, draw(st.integers(0, 4000)) * MIB, draw(st.sampled_from([0, 10, 30]))
            )
            try:
                state.allocate(Placement(card.node, (share,)))
            except ValueError:
                break
    return state


@st.composite
def requests(draw: st.DrawFn, chain: str | None = None) -> PlacementRequest:
    if chain is None:
        chain = ",".join(draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4)))
    use_percent = draw(st.booleans())
    return PlacementRequest(
        name="r",
        count=draw(st.integers(1, 3)),
        memory=None if use_percent else draw(st.integers(0, 20000)) * MIB,
        memory_percent=draw(st.sampled_from([None, 10, 50, 100])) if use_percent else None,
        cores=draw(st.sampled_from([0, 0, 20, 50, 100])),
        policy=parse_policy_chain(chain),
        numa_bind=draw(st.booleans()),
    )


@SETTINGS
@given(clusters(), requests())
def test_deterministic(state: ClusterState, request: PlacementRequest) -> None:
    assert place(state, request) == place(state, request)


@SETTINGS
@given(clusters(), requests(), st.data())
def test_chain_variants_place_identically(
    state: ClusterState, request: PlacementRequest, data: st.DataObject
) -> None:
    names = list(request.policy.policies)
    noisy = []
    for name in names:
        noisy.append(" " * data.draw(st.integers(0, 2)) + name.value + " " * data.draw(st.integers(0, 2)))
        if data.draw(st.booleans()):
            noisy.append(name.value)  # duplicate
    variant = PlacementRequest(
        name=request.name,
        count=request.count,
        memory=request.memory,
        memory_percent=request.memory_percent,
        cores=request.cores,
        policy=parse_policy_chain(",".join(noisy)),
        numa_bind=request.numa_bind,
    )
    assert variant.policy.policies == request.policy.policies
    assert place(state, variant).placement == place(state, request).placement


@SETTINGS
@given(clusters(), requests())
def test_mutex_never_picks_a_card_with_tenants(state: ClusterState, request: PlacementRequest) -> None:
    if not request.policy.mutex:
        return
    decision = place(state, request)
    if decision.placement is not None:
        node = state.nodes[decision.placement.node]
        assert all(node.usage[share.index].tenants == 0 for share in decision.placement.devices)


@SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=12))
def test_sequences_never_exceed_capacity(state: ClusterState, batch: list[PlacementRequest]) -> None:
    for request in batch:
        decision = place_and_allocate(state, request)
        if decision.placement is not None:
            assert len({share.index for share in decision.placement.devices}) == request.count
    for node in state.nodes.values():
        for card in node.cards:
            usage = node.usage[card.index]
            # Pre-existing usage respects capacity by construction; placements must keep it so.
            assert usage.tenants <= card.slots
            assert usage.used_memory <= card.memory
            assert usage.used_cores <= card.cores


@SETTINGS
@given(clusters(), requests(chain="binpack"), st.sampled_from(["binpack", "spread"]))
def test_binpack_picks_max_and_spread_min_score(
    state: ClusterState, request: PlacementRequest, key: str
) -> None:
    request = PlacementRequest(
        name="r",
        count=1,
        memory=request.memory,
        memory_percent=request.memory_percent,
        cores=request.cores,
        policy=parse_policy_chain(key),
    )
    decision = place(state, request)
    if decision.placement is None:
        return
    node = state.nodes[decision.placement.node]
    eligible = [card.score for card in decision.candidates if card.eligible]
    chosen = card_score(
        node.card(decision.placement.devices[0].index), node.usage[decision.placement.devices[0].index]
    )
    if key == "binpack":
        assert chosen >= max(eligible)
    else:
        assert chosen <= min(eligible)


@SETTINGS
@given(clusters())
def test_numa_binpack_vs_binpack_numa(state: ClusterState) -> None:
    """`binpack,numa` ranks by score first; `numa,binpack` by NUMA node first (the seed's rule 3)."""
    single = {"count": 1, "memory": 0}
    by_score = place(state, PlacementRequest(name="a", policy=parse_policy_chain("binpack,numa"), **single))
    by_numa = place(state, PlacementRequest(name="b", policy=parse_policy_chain("numa,binpack"), **single))
    if by_score.placement is None:
        assert by_numa.placement is None
        return
    assert by_numa.placement is not None and by_numa.node == by_score.node
    node = state.nodes[by_score.node or ""]
    eligible = [card for card in by_score.candidates if card.eligible]
    pick_score = next(c for c in eligible if c.index == by_score.placement.devices[0].index)
    pick_numa = next(c for c in eligible if c.index == by_numa.placement.devices[0].index)
    lowest_numa = min(c.numa_node for c in eligible if c.numa_node is not None)
    top_score = max(c.score for c in eligible)
    assert pick_score.score == top_score
    assert pick_score.numa_node == min(c.numa_node for c in eligible if c.score == top_score)
    assert pick_numa.numa_node == lowest_numa
    assert pick_numa.score == max(c.score for c in eligible if c.numa_node == lowest_numa)
    assert node.name == by_score.node


@SETTINGS
@given(clusters(), requests())
def test_prefilter_never_rejects_a_node_that_fits(state: ClusterState, request: PlacementRequest) -> None:
    from dra_driver.engine.place import could_fit, evaluate_node

    for node in state.nodes.values():
        if evaluate_node(node, request).reason is None:
            assert could_fit(node, request), node.name


@SETTINGS
@given(clusters(), requests())
def test_memoised_scores_match_fresh_scores(state: ClusterState, request: PlacementRequest) -> None:
    from dra_driver.engine import usage_score

    place_and_allocate(state, request)
    for node in state.nodes.values():
        for card in node.cards:
            usage = node.usage[card.index]
            fresh = usage_score(
                usage.tenants, usage.used_cores, usage.used_memory, card.slots, card.cores, card.memory
            )
            assert card_score(card, usage) == fresh
