"""The engine's MIG placement (engine/mig.py): which existing instance a request gets, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from dra_driver.engine import parse_node_policy, parse_policy_chain
from dra_driver.engine.mig import (
    MigRequest,
    MigState,
    free_blocks,
    is_mig_index,
    mig_cores,
    place_mig,
    place_mig_and_allocate,
)
from dra_driver.engine.model import DeviceShare, Placement
from dra_driver.engine.reasons import Reason
from dra_driver.quantity import GIB
from tests.engine.mig_helpers import SEVEN_1G, mig_card


def request(profile: str | None = "1g.18gb", policy: str = "binpack", **kwargs: object) -> MigRequest:
    node_policy = kwargs.pop("node_policy", None)
    return MigRequest(
        name=str(kwargs.pop("name", "req")),
        profile=profile,
        policy=parse_policy_chain(policy),
        node_policy=parse_node_policy(node_policy if isinstance(node_policy, str) else None),
        **kwargs,  # type: ignore[arg-type]
    )


def chosen(state: MigState, req: MigRequest) -> list[str]:
    decision = place_mig_and_allocate(state, req)
    assert decision.placement is not None, decision.reason
    names = {c.index: c.device for c in decision.candidates}
    return [names[share.index] for share in decision.placement.devices]


def where(state: MigState, name: str) -> tuple[int, int | None]:
    instance = next(i for n in state.nodes for i in state.instances(n) if i.name == name)
    return instance.parent, instance.placement_start


@pytest.mark.parametrize(
    ("covered", "blocks"),
    [
        ([], (8,)),
        ([0], (4, 2, 1)),
        ([0, 1, 2], (4, 1)),
        ([4], (4, 2, 1)),
        ([0, 4], (2, 2, 1, 1)),
        (range(8), ()),
    ],
)
def test_free_blocks_cut_free_slices_into_aligned_placements(
    covered: list[int], blocks: tuple[int, ...]
) -> None:
    assert free_blocks(covered) == blocks


@dataclass(frozen=True)
class Case:
    name: str
    cards: list[tuple[int, list[str]]]
    in_use: list[tuple[int, int]]  # (parent, placement start) already taken
    requests: Sequence[tuple[str | None, str]]  # (profile, policy), placed one after another
    expected: list[tuple[int, int]]  # (parent, placement start) of each request


CASES = [
    Case(
        "binpack: three 1g on one card, slices 0-2, keeping 4-7 whole; the 7g on the untouched card",
        [(0, SEVEN_1G), (1, ["7g.141gb"]), (2, SEVEN_1G)],
        [],
        [("1g.18gb", "binpack")] * 3 + [("7g.141gb", "binpack")],
        [(0, 0), (0, 1), (0, 2), (1, 0)],
    ),
    Case(
        "binpack keeps the largest free placement: next to a 1g in use at slice 4, not first fit",
        [(0, SEVEN_1G)],
        [(0, 4)],
        [("1g.18gb", "binpack")] * 2,
        [(0, 5), (0, 6)],
    ),
    Case(
        "binpack prefers the card with more instances in use over an untouched one",
        [(0, SEVEN_1G), (1, SEVEN_1G)],
        [(1, 3)],
        [("1g.18gb", "binpack")],
        [(1, 2)],
    ),
    Case(
        "spread: one 1g per card, the card with fewer in use first",
        [(0, SEVEN_1G), (1, SEVEN_1G), (2, SEVEN_1G)],
        [(0, 0)],
        [("1g.18gb", "spread")] * 3,
        [(1, 0), (2, 0), (0, 1)],
    ),
    Case(
        "mutex: only cards with no instance in use",
        [(0, SEVEN_1G), (1, SEVEN_1G)],
        [(0, 0)],
        [("1g.18gb", "mutex,binpack")],
        [(1, 0)],
    ),
    Case(
        "a profile not on the busier card goes where it is",
        [(0, ["3g.71gb", "1g.18gb@4", "1g.18gb@5", "1g.18gb@6"]), (1, ["3g.71gb", "3g.71gb"])],
        [(0, 4)],
        [("3g.71gb", "binpack"), ("3g.71gb", "binpack")],
        [(0, 0), (1, 0)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_mig_placement_follows_the_chain(case: Case) -> None:
    state = MigState([i for parent, profiles in case.cards for i in mig_card(parent, profiles)])
    for parent, start in case.in_use:
        instance = next(
            i for i in state.instances("node-1") if i.parent == parent and i.placement_start == start
        )
        state.allocate(Placement("node-1", (_share(instance.index),)))
    got = []
    for profile, policy in case.requests:
        (name,) = chosen(state, request(profile, policy))
        got.append(where(state, name))
    assert got == case.expected


def _share(index: int) -> DeviceShare:
    return DeviceShare(index, 0, 0)


def test_a_memory_request_takes_the_smallest_instance_with_enough_memory_first() -> None:
    state = MigState(mig_card(0, ["3g.71gb", "1g.35gb@4", "1g.18gb@6"]) + mig_card(1, SEVEN_1G))
    state.allocate(Placement("node-1", (_share(state.instances("node-1")[0].index),)))  # the 3g, card 0
    # 20 GiB: only the 1g.35gb (card 0) has it; 10 GiB: a 1g.18gb, the one on the busier card 0.
    assert [where(state, n) for n in chosen(state, request(None, memory=20 * GIB))] == [(0, 4)]
    assert [where(state, n) for n in chosen(state, request(None, memory=10 * GIB))] == [(0, 6)]
    decision = place_mig(state, request(None, memory=80 * GIB))
    assert decision.placement is None
    assert "CardInsufficientMemory" in (decision.reason or "")


def test_a_pending_request_names_each_instance_reason() -> None:
    state = MigState(mig_card(0, ["3g.71gb", "1g.18gb@4"]))
    state.allocate(Placement("node-1", (_share(state.instances("node-1")[1].index),)))
    decision = place_mig(state, request("1g.18gb"))
    assert decision.placement is None
    assert decision.reason == "1/2 MigInstanceInUse, 1/2 MigProfileMismatch"
    reasons = {c.device: c.reason for c in decision.candidates}
    assert reasons == {
        "gpu-0-mig-1-0": Reason.MIG_PROFILE_MISMATCH,
        "gpu-0-mig-11-0": Reason.MIG_INSTANCE_IN_USE,
    }


def test_candidates_explain_placement_and_what_is_left_free() -> None:
    state = MigState(mig_card(0, SEVEN_1G))
    decision = place_mig(state, request())
    assert decision.placement is not None
    (share,) = decision.placement.devices
    assert is_mig_index(share.index)
    assert share.memory == 16896 * 1024 * 1024 and share.cores == mig_cores(1) == 14
    first = next(c for c in decision.candidates if c.chosen)
    assert first.device == "gpu-0-mig-7-0"
    assert first.note == "1g.18gb at slice 0 of gpu-0 (0 in use); leaves free blocks 4+2+1 (of 8)"
    # On an empty card every 1g leaves 4+2+1 (slice 4: 0-3, 6-7, 5): the lowest start breaks the tie.
    others = [c for c in decision.candidates if not c.chosen]
    assert len(others) == 6 and all(c.eligible and c.note.endswith("blocks 4+2+1 (of 8)") for c in others)
    state.allocate(decision.placement)
    second = place_mig(state, request())
    notes = {c.device: c.note for c in second.candidates}
    assert notes["gpu-0-mig-7-0"] == "1g.18gb at slice 0 of gpu-0 (1 in use)"  # in use: nothing left
    assert notes["gpu-0-mig-8-0"].endswith("(1 in use); leaves free blocks 4+2 (of 4+2+1)")  # chosen, slice 1
    assert notes["gpu-0-mig-11-0"].endswith("(1 in use); leaves free blocks 2+2+1+1 (of 4+2+1)")  # slice 4
    assert [c.device for c in second.candidates if c.chosen] == ["gpu-0-mig-8-0"]


def test_count_two_under_binpack_takes_neighbours_on_one_card_and_numa_bind_one_node() -> None:
    state = MigState(mig_card(0, SEVEN_1G, numa=0) + mig_card(1, SEVEN_1G, numa=1))
    names = chosen(state, request(count=2))
    assert [where(state, n) for n in names] == [(0, 0), (0, 1)]
    # spread on the busier state: the emptier card 1 twice (it stays the emptier after one).
    assert [where(state, n) for n in chosen(state, request(count=2, policy="spread"))] == [(1, 0), (1, 1)]
    fresh = MigState(mig_card(0, SEVEN_1G, numa=0) + mig_card(1, SEVEN_1G, numa=1))
    assert [where(fresh, n) for n in chosen(fresh, request(count=2, policy="spread"))] == [(0, 0), (1, 0)]
    fresh = MigState(mig_card(0, SEVEN_1G, numa=0) + mig_card(1, SEVEN_1G, numa=1))
    bound = chosen(fresh, request(count=2, policy="spread", numa_bind=True))
    assert [where(fresh, n) for n in bound] == [(0, 0), (0, 1)]


def test_unhealthy_selector_excluded_and_allowed_nodes() -> None:
    state = MigState(mig_card(0, SEVEN_1G, healthy=False) + mig_card(1, SEVEN_1G, node="node-2"))
    decision = place_mig(state, request(allowed_nodes=frozenset({"node-1"})))
    assert decision.placement is None and decision.reason == "7/7 CardNotHealth"
    allowed = frozenset({("node-2", state.instances("node-2")[3].index)})
    (name,) = chosen(state, request(allowed_devices=allowed))
    assert where(state, name) == (1, 3)


def test_the_state_refuses_double_use_and_double_release() -> None:
    state = MigState(mig_card(0, ["7g.141gb"]))
    placement = Placement("node-1", (_share(state.instances("node-1")[0].index),))
    state.allocate(placement)
    with pytest.raises(ValueError, match="in use already"):
        state.allocate(placement)
    state.release(placement)
    with pytest.raises(ValueError, match="not in use"):
        state.release(placement)


@pytest.mark.parametrize(("node_policy", "node"), [("binpack", "node-b"), ("spread", "node-a")])
def test_nodes_are_ranked_by_instances_in_use_under_the_node_policy(node_policy: str, node: str) -> None:
    state = MigState(mig_card(0, SEVEN_1G, node="node-a") + mig_card(0, SEVEN_1G, node="node-b"))
    state.allocate(Placement("node-b", (_share(state.instances("node-b")[6].index),)))
    decision = place_mig(state, request(node_policy=node_policy))
    assert decision.placement is not None and decision.placement.node == node
