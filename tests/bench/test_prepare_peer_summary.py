"""The arithmetic behind hack/bench_prepare_peer.py's summary: warm-up dropped, medians, ratios.

The benchmark reports and asserts nothing; what it summarises must still be right: the warm-up
round never counts, each figure is the median of the kept rounds with their range, and a ratio
pairs the two plugins of the same round.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "hack"))
    spec = importlib.util.spec_from_file_location(
        "bench_prepare_peer", ROOT / "hack" / "bench_prepare_peer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(round_: int, plugin: str, callers: int, p50: float, p99: float) -> dict[str, Any]:
    return {"round": round_, "warmup": round_ == 0, "plugin": plugin, "callers": callers,
            "p50_ms": p50, "p99_ms": p99, "unprepare_p50_ms": 1.0}  # fmt: skip


def test_the_warm_up_is_dropped_and_ratios_pair_rounds(bench: ModuleType) -> None:
    ours, peer = bench.OURS, bench.PEER
    measures = [measure(0, ours, 1, 100.0, 900.0), measure(0, peer, 1, 1.0, 1.0)]  # a cold start
    for round_, (mine, theirs) in enumerate([(4.0, 2.0), (6.0, 4.0), (3.0, 3.0)], start=1):
        measures += [measure(round_, ours, 1, mine, 2 * mine), measure(round_, peer, 1, theirs, 2 * theirs)]
    for round_ in range(4):
        measures += [measure(round_, ours, 8, 10.0, 20.0), measure(round_, peer, 8, 5.0, 40.0)]
    summary = bench.summarise(measures, [ours, peer])
    one = summary["callers=1"]
    assert one[ours]["p50_ms"] == {"median": 4.0, "min": 3.0, "max": 6.0}
    assert one[peer]["p99_ms"] == {"median": 6.0, "min": 4.0, "max": 8.0}
    ratio = one[f"ratio {ours}/{peer}"]["p50"]
    assert ratio["per_round"] == [2.0, 1.5, 1.0]
    assert (ratio["of_medians"], ratio["median_of_rounds"]) == (round(4.0 / 3.0, 3), 1.5)
    eight = summary["callers=8"][f"ratio {ours}/{peer}"]
    assert (eight["p50"]["of_medians"], eight["p99"]["of_medians"]) == (2.0, 0.5)


def test_a_baseline_is_compared_with_the_peer_and_with_ours(bench: ModuleType) -> None:
    plugins = [bench.OURS, bench.PEER, bench.BASELINE]
    figures = {bench.OURS: 2.0, bench.PEER: 4.0, bench.BASELINE: 8.0}
    measures = [
        measure(round_, plugin, callers, figures[plugin], figures[plugin])
        for round_ in range(3)
        for callers in bench.CALLERS
        for plugin in plugins
    ]
    row = bench.summarise(measures, plugins)["callers=8"]
    assert row[f"ratio {bench.BASELINE}/{bench.PEER}"]["p50"]["of_medians"] == 2.0
    assert row[f"ratio {bench.OURS}/{bench.BASELINE}"]["p50"]["per_round"] == [0.25, 0.25]
