"""The arithmetic behind ``make bench-cluster``'s placement-quality figures (hack/bench_cluster.py).

The benchmark itself reports figures and asserts nothing; what it counts must still be right:
which cards are idle, how much memory is stranded, and which pending pods are pending by
fragmentation (the cluster's free cards would hold them, no single node's do).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
CARD = 80 * GIB


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cluster", ROOT / "hack" / "bench_cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_cluster"] = module
    spec.loader.exec_module(module)
    return module


class FakeApi:
    def __init__(self, claims: list[dict[str, Any]]) -> None:
        self.claims = claims

    def items(self, path: str) -> list[dict[str, Any]]:
        assert path.endswith("/resourceclaims")
        return self.claims


def allocated(*results: tuple[str, str, str | None]) -> dict[str, Any]:
    entries = []
    for pool, device, memory in results:
        entry: dict[str, Any] = {"pool": pool, "device": device}
        if memory is not None:
            entry["consumedCapacity"] = {"memory": memory}
        entries.append(entry)
    return {"status": {"allocation": {"devices": {"results": entries}}}}


def test_cards_count_consumed_memory_sharers_and_whole_card_holders(bench: ModuleType) -> None:
    memory = {(node, f"gpu-{i}"): CARD for node in ("a", "b") for i in range(2)}
    api = FakeApi([
        allocated(("a", "gpu-0", "30Gi"), ("a", "gpu-1", "10Gi")),
        allocated(("a", "gpu-0", "20Gi")),
        allocated(("b", "gpu-0", None)),  # no consumed memory: the whole card
        {"status": {}},  # pending: nothing allocated
    ])  # fmt: skip
    cards = bench.cards_after(api, memory)
    assert cards[("a", "gpu-0")].free == 30 * GIB and cards[("a", "gpu-0")].sharers == 2
    assert cards[("a", "gpu-1")].free == 70 * GIB
    assert cards[("b", "gpu-0")].whole and cards[("b", "gpu-0")].free == 0
    assert [key for key, card in cards.items() if card.idle] == [("b", "gpu-1")]


def test_pending_by_fragmentation_needs_enough_cards_in_the_cluster_but_not_on_one_node(
    bench: ModuleType,
) -> None:
    Card, Shape = bench.Card, bench.Shape
    cards = {
        ("a", "gpu-0"): Card(CARD, 50 * GIB, sharers=1),
        ("a", "gpu-1"): Card(CARD, 10 * GIB, sharers=1),
        ("b", "gpu-0"): Card(CARD, 50 * GIB, sharers=1),
        ("b", "gpu-1"): Card(CARD, CARD),  # idle
    }
    assert bench.fits_cluster_not_node(Shape(3, 40), cards)  # a:1 + b:2 cards with 40 GiB free
    assert not bench.fits_cluster_not_node(Shape(2, 40), cards), "node b holds it: not fragmentation"
    assert not bench.fits_cluster_not_node(Shape(4, 40), cards), (
        "three suitable cards: capacity, not fragmentation"
    )
    assert not bench.fits_cluster_not_node(Shape(2, 0), cards), "whole cards need idle ones: only one"
    full = {key: Card(CARD, CARD, sharers=bench.SLOTS) for key in cards}
    assert not any(card.takes(Shape(1, 4)) for card in full.values()), "no free slot left"


def test_the_stream_is_seeded_and_within_the_documented_ranges(bench: ModuleType) -> None:
    first, again = bench.make_stream(500, seed=3), bench.make_stream(500, seed=3)
    assert first == again and first != bench.make_stream(500, seed=4)
    for arrival in first:
        assert 1 <= arrival.shape.gpus <= 4
        assert arrival.shape.memory_gib == 0 or 4 <= arrival.shape.memory_gib <= 40
        assert 600 <= arrival.leaves_after - arrival.index <= 1600
    whole = sum(1 for arrival in first if arrival.shape.whole)
    assert 20 <= whole <= 90, whole  # about one in ten


def test_pod_steps_split_create_to_bound_into_what_each_component_did(bench: ModuleType) -> None:
    """Burst and steady state alike: create -> claim made -> allocated -> gate lifted -> bound, each
    step from the watches' times; a pod whose claim the watch missed counts that step as 0."""
    watch = SimpleNamespace(bound={"p-0": 10.0, "p-1": 20.0}, ungated={"p-0": 9.0, "p-1": 19.5})
    claims = SimpleNamespace(created={"p-0": 2.0}, allocated={"p-0": 6.0, "p-1": 15.0})
    steps = bench.pod_steps({"p-0": 1.0, "p-1": 12.0}, watch, claims)
    assert list(steps) == ["create->claim", "claim->allocated", "allocated->ungated", "ungated->bound"]
    assert steps["create->claim"]["p99_s"] == 3.0  # p-1's claim was never seen made: 15 - 12
    one = bench.pod_steps({"p-0": 1.0}, watch, claims)
    assert {step: figures["p50_s"] for step, figures in one.items()} == {
        "create->claim": 1.0,
        "claim->allocated": 4.0,
        "allocated->ungated": 3.0,
        "ungated->bound": 1.0,
    }
    other = bench.pod_steps({"p-1": 12.0}, watch, claims)
    assert other["claim->allocated"]["p50_s"] == 0.0 and other["allocated->ungated"]["p50_s"] == 4.5
    # kube-scheduler's path lifts no gate: allocated -> bound in one step.
    watch.ungated = {}
    assert list(bench.pod_steps({"p-0": 1.0}, watch, claims)) == [
        "create->claim",
        "claim->allocated",
        "allocated->bound",
    ]
