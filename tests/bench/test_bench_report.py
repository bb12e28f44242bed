"""The statistics and the report rendering behind ``make bench-cluster`` and ``make bench-scale``.

The benchmarks assert nothing about speed; what they compute from their measurements must still
be right: the warm-up round left out, the median and spread of the rounds, ours / kube-scheduler
taken round by round, requests attributed to the client that sent them (from the audit log), and
docs/performance.md's tables made from the committed reports (not copied by hand).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "cluster-report.json"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "hack"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report_lib() -> ModuleType:
    return load("bench_report")


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    return load("perf_tables")


@pytest.fixture
def fixture_report() -> dict[str, Any]:
    return dict(json.loads(FIXTURE.read_text()))


def test_percentile_is_the_nearest_rank(report_lib: ModuleType) -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert report_lib.percentile(values, 0.5) == 51.0
    assert report_lib.percentile(values, 0.99) == 100.0
    assert report_lib.percentile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert report_lib.percentile([], 0.5) != report_lib.percentile([], 0.5)  # NaN


def test_spread_gives_median_range_and_relative_spread(report_lib: ModuleType) -> None:
    figure = report_lib.spread([40.0, 50.0, 45.0, 48.0])
    assert figure == {"median": 46.5, "min": 40.0, "max": 50.0, "rel_spread": round(10 / 46.5, 3), "n": 4}
    assert report_lib.spread([]) == {"n": 0}


@pytest.mark.parametrize(
    ("user", "agent", "client"),
    [
        ("admin", "hami-dra-bench/1", "benchmark"),
        ("hami-dra-bench-controller", "OpenAPI-Generator/33.1.0/python", "ours controller"),
        ("hami-dra-bench-webhook", "OpenAPI-Generator/33.1.0/python", "ours webhook"),
        ("system:kube-scheduler", "kube-scheduler/v1.37.2", "kube-scheduler"),
        ("system:serviceaccount:kube-system:resource-claim-controller", "kube-controller-manager/v1.37.2",
         "kube-controller-manager (resource-claim-controller)"),
        ("system:kube-controller-manager", "kube-controller-manager/v1.37.2", "kube-controller-manager"),
        ("someone", "curl/8", "someone"),
    ],
)  # fmt: skip
def test_client_of_tells_the_components_apart(
    report_lib: ModuleType, user: str, agent: str, client: str
) -> None:
    assert report_lib.client_of(user, agent) == client


def audit_event(verb: str, stage: str, resource: str | None, user: str, sub: str = "") -> str:
    event: dict[str, Any] = {"verb": verb, "stage": stage, "user": {"username": user}, "userAgent": "x"}
    if resource is not None:
        event["objectRef"] = {"resource": resource, **({"subresource": sub} if sub else {})}
    return json.dumps(event)


def test_audit_requests_count_each_request_once(report_lib: ModuleType) -> None:
    scheduler = "system:kube-scheduler"
    lines = [
        audit_event("create", "ResponseComplete", "pods", scheduler, "binding"),
        audit_event("watch", "ResponseStarted", "pods", scheduler),  # a watch: counted when it starts
        audit_event("watch", "ResponseComplete", "pods", scheduler),  # ... not again when it ends
        audit_event("update", "ResponseStarted", "resourceclaims", scheduler),  # not a watch: not yet
        audit_event("update", "ResponseComplete", "resourceclaims", scheduler, "status"),
        audit_event("get", "ResponseComplete", None, scheduler),  # /healthz: no object
        '{"verb": "get", "stage": "ResponseComp',  # cut at the window's edge
    ]
    counts = report_lib.audit_requests(lines)
    assert counts == {
        ("kube-scheduler", "create", "pods/binding"): 1,
        ("kube-scheduler", "watch", "pods"): 1,
        ("kube-scheduler", "update", "resourceclaims/status"): 1,
    }


def test_requests_per_pod_totals_leave_out_the_benchmark(report_lib: ModuleType) -> None:
    counts = {
        ("benchmark", "create", "pods"): 100,
        ("ours controller", "update", "pods"): 100,
        ("ours controller", "get", "resourceclaims"): 50,
        ("kube-scheduler", "watch", "pods"): 2,
    }
    per_pod = report_lib.requests_per_pod(counts, 100)
    assert per_pod["reads"] == 0.52 and per_pod["writes"] == 1.0
    assert per_pod["by_client"]["benchmark"] == {"create pods": 1.0}
    assert per_pod["by_client"]["ours controller"] == {"get resourceclaims": 0.5, "update pods": 1.0}


def test_rounds_summary_drops_the_warm_up_and_takes_ratios_per_round(
    report_lib: ModuleType, fixture_report: dict[str, Any]
) -> None:
    # The fixture: kube-scheduler 10 (warm-up), 40, 50, 45 pods/s; ours 5 (warm-up), 20, 30, 27.
    (row,) = report_lib.summarise_rounds(fixture_report["rounds"]["runs"])
    assert row["nodes"] == 50 and row["rounds"] == 3
    baseline = row["paths"]["kube-scheduler"]
    ours = row["paths"]["ours binpack"]
    assert baseline["figures"]["burst_pods_per_second"] == {
        "median": 45.0, "min": 40.0, "max": 50.0, "rel_spread": round(10 / 45, 3), "n": 3,
    }  # fmt: skip
    assert baseline["ratio"] == {}
    ratio = ours["ratio"]["burst_pods_per_second"]
    assert ratio["per_round"] == [0.5, 0.6, 0.6]  # 20/40, 30/50, 27/45: never the warm-up's 5/10
    assert (ratio["median"], ratio["min"], ratio["max"]) == (0.6, 0.5, 0.6)
    # Steady p99 of round r is 0.2 (r + 1) on kube-scheduler's path, 0.4 (r + 1) on ours.
    assert ours["ratio"]["steady_p99_s"]["per_round"] == [2.0, 2.0, 2.0]
    # CPU per pod: the median of rounds 1-3 (15 + r on the API server for ours).
    assert ours["cpu_ms_per_pod"]["kube-apiserver"] == 17.0
    assert ours["requests_per_pod"]["reads"] == 0.5 and ours["requests_per_pod"]["writes"] == 5.0


def test_the_tables_are_made_from_the_report(
    tables: ModuleType, fixture_report: dict[str, Any], tmp_path: Path
) -> None:
    path = tables.BENCH / "fixture.json"
    lines = tables.cluster_section(fixture_report, path)
    text = "\n".join(lines)
    assert "Validation run" not in text
    assert "commit `0123456789`" in text and "load average (1, 5, 15 min) before 1, 1.5, 2" in text
    assert "| 50 | kube-scheduler | 45.0 (40.0–50.0) |" in text
    assert "| 50 | ours binpack | 27.0 (20.0–30.0) |" in text
    assert "| 50 | ours binpack | 0.60 (0.50–0.60) | 17% | 0.50, 0.60, 0.60 |" in text
    # The CPU table puts the API server first and totals the path without the benchmark.
    cpu_header = next(line for line in lines if line.startswith("| nodes | path | kube-apiserver"))
    assert cpu_header.split(" | ")[-1] == "total |"
    assert "| 50 | ours binpack | 17.0 | — | 22.0 | 3.0 | **39.0** |" in text
    assert "| ours webhook | get resourceclaimtemplates | — | 1.00 |" in text


def test_a_validation_report_is_marked_as_such(tables: ModuleType, fixture_report: dict[str, Any]) -> None:
    fixture_report["purpose"] = "validation of the harness (smaller than the full run)"
    text = "\n".join(tables.cluster_section(fixture_report, tables.BENCH / "fixture.json"))
    assert "**Validation run, not the figures**" in text and "`make bench-cluster`" in text


def test_rewrite_replaces_only_the_marked_section(tables: ModuleType) -> None:
    begin, end = tables.begin_marker("cluster"), tables.end_marker("cluster")
    doc = f"# Title\n\nprose\n{begin}\nold table\n{end}\nmore prose\n"
    new = tables.rewrite(doc, {"cluster": ["| new |"]})
    assert new == f"# Title\n\nprose\n{begin}\n| new |\n{end}\nmore prose\n"
    assert tables.rewrite(new, {"cluster": ["| new |"]}) == new
    with pytest.raises(ValueError, match="no section 'scale'"):
        tables.rewrite(doc, {"scale": []})


def test_docs_performance_is_what_the_committed_reports_give(tables: ModuleType) -> None:
    """docs/performance.md's generated sections are up to date with docs/bench/*.json: a figure
    edited by hand, or a report committed without `hack/perf_tables.py`, fails here."""
    assert tables.main(["--check"]) == 0


def test_the_controllers_growth_compares_medians_of_measured_rounds_across_sizes(
    tables: ModuleType, fixture_report: dict[str, Any]
) -> None:
    # The fixture's controller: 20 (warm-up), 21, 22, 23 ms per pod at 50 nodes.
    large = json.loads(json.dumps(fixture_report))
    for run in large["rounds"]["runs"]:
        run["nodes"] = 250
        cpu = run["burst"]["cpu_ms_per_pod"]
        if "ours controller" in cpu:
            cpu["ours controller"] = 1.5 * cpu["ours controller"]  # 30 (warm-up), 31.5, 33, 34.5
    assert tables.controller_growth_rows(fixture_report, large) == [
        ["ours binpack", "50 → 250", "22.00 → 33.00", "1.50"]
    ]
    assert tables.controller_growth_rows(large, fixture_report) == []  # only a smaller size is a base


def test_a_run_at_two_sizes_shows_the_controllers_growth_from_that_run(
    tables: ModuleType, fixture_report: dict[str, Any]
) -> None:
    # `--nodes 50 --large-nodes 250` in one run: the runs of both sizes in one report.
    report = json.loads(json.dumps(fixture_report))
    larger = json.loads(json.dumps(report["rounds"]["runs"]))
    for run in larger:
        run["nodes"] = 250
        cpu = run["burst"]["cpu_ms_per_pod"]
        if "ours controller" in cpu:
            cpu["ours controller"] = 1.1 * cpu["ours controller"]
    report["rounds"]["runs"] += larger
    report["config"]["large_nodes"] = 250
    text = "\n".join(tables.cluster_section(report, tables.BENCH / "fixture.json"))
    assert "50 and 250 simulated nodes" in text
    assert "both sizes from this one run" in text
    assert "| ours binpack | 50 → 250 | 22.00 → 24.20 | 1.10 |" in text
    # One size only: no growth table.
    single = "\n".join(tables.cluster_section(fixture_report, tables.BENCH / "fixture.json"))
    assert "as the cluster grows" not in single and "50 simulated nodes" in single


def test_a_run_without_prepare_shows_another_reports_prepare_and_says_so(
    tables: ModuleType, fixture_report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare = {
        "summary": {
            "callers=1": {
                "ours": {"p50_ms": {"median": 4.0}, "p99_ms": {"median": 9.0}},
                "dra-example-driver": {"p50_ms": {"median": 5.0}, "p99_ms": {"median": 10.0}},
                "ratio ours/dra-example-driver": {
                    "p50": {"median_of_rounds": 0.8, "per_round": [0.7, 0.8, 0.9]},
                    "p99": {"median_of_rounds": 0.9, "per_round": [0.8, 0.9, 1.1]},
                },
            }
        }
    }
    other = {"commit": "abcdef0123456789", "date": "2026-12-06T17:00:00Z", "command": "x --only prepare"}
    bench = tmp_path / "docs" / "bench"
    bench.mkdir(parents=True)
    (bench / "prepare.json").write_text(json.dumps({**other, "prepare": prepare}))
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "BENCH", bench)
    rounds_only = {**fixture_report, "prepare": None}
    text = "\n".join(tables.cluster_section(rounds_only, bench / "cluster.json"))
    assert "| 1 | 4.0 / 9.0 | 5.0 / 10.0 | 0.80 (0.70–0.90) | 0.90 (0.80–1.10) |" in text
    assert "Prepare latency from `docs/bench/prepare.json` (commit `abcdef0123`" in text
    # A report that measured the plugins' CPU per claim gets its columns.
    figures = prepare["summary"]["callers=1"]
    figures["ours"]["cpu_ms_per_claim"] = {"median": 2.3}
    figures["dra-example-driver"]["cpu_ms_per_claim"] = {"median": 2.5}
    figures["ratio ours/dra-example-driver"]["cpu_ms_per_claim"] = {
        "median_of_rounds": 0.92,
        "per_round": [0.9, 0.95],
    }
    with_cpu = "\n".join(tables.prepare_table(prepare))
    assert (
        "| 1 | 4.0 / 9.0 | 5.0 / 10.0 | 0.80 (0.70–0.90) | 0.90 (0.80–1.10) | 2.30 / 2.50 | "
        "0.92 (0.90–0.95) |" in with_cpu
    )
    # The larger-size section leaves it out (the main section has it).
    assert "Prepare latency" not in "\n".join(
        tables.cluster_section(rounds_only, bench / "cluster.json", quality_fallback=False)
    )


def test_the_speed_probe_turns_cpu_and_throughput_into_machine_independent_figures(
    report_lib: ModuleType, fixture_report: dict[str, Any]
) -> None:
    """A burst measured while the machine ran a third slower costs a third more CPU per pod and
    gives a quarter fewer pods/s; in units of the probe's work both come out as on a fast machine."""
    runs = [run for run in fixture_report["rounds"]["runs"] if not run.get("warmup")]
    slow = json.loads(json.dumps(runs[0]))
    slow["burst"]["speed_probe"] = {"units": 100, "ms_per_unit": 2.0}
    slow["burst"]["cpu_ms_per_pod"] = {"kube-apiserver": 30.0}
    slow["burst"]["pods_per_second"] = 30.0
    fast = json.loads(json.dumps(runs[0]))
    fast["burst"]["speed_probe"] = {"units": 100, "ms_per_unit": 1.5}
    fast["burst"]["cpu_ms_per_pod"] = {"kube-apiserver": 22.5}
    fast["burst"]["pods_per_second"] = 40.0
    in_units = {"kube-apiserver": 15.0}
    assert report_lib.cpu_in_probe_units(slow) == report_lib.cpu_in_probe_units(fast) == in_units
    figure = dict(report_lib.FIGURES)["burst_pods_per_1000_probe_units"]
    assert figure(slow) == figure(fast) == 60.0
    # Reports made before the probe: no figure, no units, and the summary leaves them out.
    assert report_lib.probe_ms(runs[0]) is None and report_lib.cpu_in_probe_units(runs[0]) == {}
    (row,) = report_lib.summarise_rounds(fixture_report["rounds"]["runs"])
    assert "cpu_probe_units_per_pod" not in row["paths"]["ours binpack"]
    assert "speed_probe_ms" not in row["paths"]["ours binpack"]["figures"]


def test_the_speed_probe_summary_drops_its_first_unit() -> None:
    probe = load("speed_probe")
    costs = [9.0] + [1.0 + i / 100 for i in range(100)]  # the first unit pays the warm-up
    figures = probe.summary(costs)
    assert figures["units"] == 100 and figures["ms_per_unit"] == 1.495
    assert figures["p10_ms"] == 1.1 and figures["p90_ms"] == 1.9
    assert probe.summary([9.0]) == {"units": 0}


def test_the_speed_probe_runs_beside_a_measurement_and_stops_with_it() -> None:
    probe_module = load("speed_probe")
    probe = probe_module.SpeedProbe()
    deadline = time.monotonic() + 60
    while len(probe._costs) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    figures = probe.stop()
    assert figures["units"] >= 4 and 0 < figures["p10_ms"] <= figures["ms_per_unit"] <= figures["p90_ms"]
    assert probe._process.poll() is not None  # the child is gone


def test_the_tables_show_the_speed_probe_beside_the_raw_figures(
    tables: ModuleType, fixture_report: dict[str, Any]
) -> None:
    """Each measured burst of ours ran while the probe read 2.0 ms per unit, kube-scheduler's at
    1.0: ours / kube-scheduler pods/s 0.5, 0.6, 0.6 raw become 1.0, 1.2, 1.2 in probe units."""
    for run in fixture_report["rounds"]["runs"]:
        slow = run["path"] != "kube-scheduler"
        run["burst"]["speed_probe"] = {"units": 50, "ms_per_unit": 2.0 if slow else 1.0}
    text = "\n".join(tables.cluster_section(fixture_report, tables.BENCH / "fixture.json"))
    assert "**The machine's speed during the bursts**" in text
    # Ours: apiserver 17 + controller 22 + webhook 3 = 39.0 ms per pod, 19.5 probe units.
    assert (
        "| 50 | ours binpack | 2.00 (2.00–2.00) | 2.00 (2.00–2.00) | 1.20 (1.00–1.20) "
        "| 1.00, 1.20, 1.20 | 19.5 | 39.0 |" in text
    )
    assert "| 50 | kube-scheduler | 1.00 (1.00–1.00) | — | — | — |" in text
    # Without the probe (reports made before it), no such table.
    for run in fixture_report["rounds"]["runs"]:
        del run["burst"]["speed_probe"]
    assert "speed during the bursts" not in "\n".join(
        tables.cluster_section(fixture_report, tables.BENCH / "fixture.json")
    )
