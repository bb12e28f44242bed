#!/usr/bin/env python3
"""docs/performance.md's tables, generated from the committed benchmark reports (never copied by hand).

    .venv/bin/python hack/perf_tables.py [--doc docs/performance.md] [--check]

Each generated section of the document sits between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` and is rewritten from its report:

- ``cluster``: docs/bench/cluster.json (hack/bench_cluster.py at full size: 100 and 500 nodes in one
  run, with our controller's CPU per pod at both), or while there is none,
  docs/bench/cluster-validation.json under a banner that says it is a harness validation;
- ``scale``: docs/bench/scale.json (hack/bench_scale.py at full size), or docs/bench/scale-validation.json.

Every table says which commit, machine and command its figures came from. ``--check`` rewrites
nothing and exits 1 when the document differs from what the reports give (tests/bench runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "hack"))

import bench_report  # noqa: E402

BENCH = ROOT / "docs" / "bench"
DOC = ROOT / "docs" / "performance.md"


def begin_marker(name: str) -> str:
    return f"<!-- generated: {name} (hack/perf_tables.py; do not edit by hand) -->"


def end_marker(name: str) -> str:
    return f"<!-- end generated: {name} -->"


# --- formatting ------------------------------------------------------------------------------------
def table(header: list[str], rows: Iterable[list[str]], align: str = "") -> list[str]:
    """A Markdown table; ``align``: one of ``l``/``r`` per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def ranged(figure: dict[str, float] | None, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    """``median (min-max)`` of a spread."""
    if not figure or not figure.get("n"):
        return "—"
    low, mid, high = (fmt.format(figure[k] * scale) for k in ("min", "median", "max"))
    return f"{mid} ({low}–{high})"


def provenance(report: dict[str, Any], path: Path) -> list[str]:
    commit = (report.get("commit") or "?")[:10]
    machine = report.get("machine") or {}
    load = report.get("load_average") or {}
    before, after = (", ".join(f"{v:g}" for v in load.get(k, [])) or "?" for k in ("before", "after"))
    lines = []
    if report.get("purpose") != "figures":
        lines += [
            "> **Validation run, not the figures**: a run smaller than the full one; it shows the "
            "harness works end to end; its numbers are too small and too few to compare paths. The full run: "
            f"`{report.get('full_command', 'make bench-cluster')}`.",
            "",
        ]
    cpus = machine.get("cpus") or 0
    busiest = max([*load.get("before", [])[:1], *load.get("after", [])[:1], 0.0])  # the 1-minute loads
    if cpus and busiest > cpus:
        lines += [
            f"> **Measured on a busy machine**: load average up to {busiest:g} on {cpus} CPUs (other work "
            "shared them). Wall-clock figures (seconds, rates, latencies) are inflated by that load; CPU "
            "seconds, memory and request counts much less.",
            "",
        ]
    dirty = " with uncommitted changes to tracked files" if report.get("dirty") else ""
    lines.append(
        f"Report `{path.relative_to(ROOT)}`: commit `{commit}`{dirty} "
        f"({report.get('commit_subject', '')[:80]}), {report.get('date', '?')}, "
        f"`{report.get('command', '?')}`; machine: {machine.get('cpus', '?')} CPUs "
        f"({machine.get('cpu_model', '?')}), {machine.get('memory_gib', '?')} GiB; "
        f"load average (1, 5, 15 min) before {before}, after {after}."
    )
    return lines


# --- the cluster report ------------------------------------------------------------------------------
#: Components in the order of the CPU table (the API server first: it is what both paths share).
COMPONENT_ORDER = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-scheduler (unthrottled)",
    "ours controller",
    "ours webhook",
    "benchmark",
)


def _rate(qps: object) -> str:
    return f"{qps:g} requests/s" if isinstance(qps, int | float) else str(qps)


def _components(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [c for c in COMPONENT_ORDER if c in names] + sorted(names - set(COMPONENT_ORDER))


def cluster_section(report: dict[str, Any], path: Path, quality_fallback: bool = True) -> list[str]:
    """``quality_fallback``: where the report did not measure placement quality, show another
    report's (the main section does; a second section would only repeat it)."""
    lines = provenance(report, path)
    rounds = report.get("rounds")
    if rounds:
        # The summary is made again from the raw runs: the tables never depend on a stored summary.
        rounds = {**rounds, "summary": bench_report.summarise_rounds(rounds["runs"])}
        config = report["config"]
        lines += [
            "",
            f"{_sizes(config)} simulated nodes × {config['gpus_per_node']} {config['profile']} "
            f"(Kubernetes {report.get('kubernetes', '?')}); each pod one GPU with a "
            f"{config['memory_gib']} GiB slice, its claim made from a ResourceClaimTemplate by "
            f"kube-controller-manager; "
            f"{rounds['scheduler']} with its client at {rounds['scheduler_qps']:g} requests/s (burst "
            f"{rounds['scheduler_burst']}), kube-controller-manager's at "
            f"{_rate(config.get('controller_manager_qps', 'its default (20, burst 30)'))}; "
            f"{config.get('foreign_pods', 0):,} foreign pods (no claims) bound to the nodes. "
            f"{config['warmup']} warm-up round(s) dropped, then "
            f"{config['rounds']} measured rounds, the paths alternating; a burst of {config['pods']} pods "
            f"and "
            f"a steady state of {config['steady_pods']} pods arriving at {config['steady_rate']:g}/s (each "
            f"deleted {config['steady_lifetime_s']:g} s after it is bound) per path and round. Figures: "
            f"median (min–max) over the rounds; create → bound as a watch sees it (no kubelet runs "
            f"the pods).",
            "",
        ]
        rows, ratio_rows, cpu_rows, phase_rows, probe_rows = [], [], [], [], []
        components: set[str] = set()
        for row in rounds["summary"]:
            for entry in row["paths"].values():
                components |= set(entry["cpu_ms_per_pod"])
        components_ordered = _components(components)
        for row in rounds["summary"]:
            for name, entry in row["paths"].items():
                f = entry["figures"]
                rows.append(
                    [
                        str(row["nodes"]),
                        name,
                        ranged(f.get("burst_pods_per_second")),
                        ranged(f.get("burst_p50_s"), "{:.2f}"),
                        ranged(f.get("burst_p99_s"), "{:.2f}"),
                        ranged(f.get("steady_p50_s"), "{:.0f}", 1000),
                        ranged(f.get("steady_p99_s"), "{:.0f}", 1000),
                        ranged(f.get("steady_achieved_per_second")),
                    ]
                )
                ratio = entry["ratio"]
                if ratio:
                    per_round = ", ".join(f"{r:.2f}" for r in ratio["burst_pods_per_second"]["per_round"])
                    ratio_rows.append(
                        [
                            str(row["nodes"]),
                            name,
                            ranged(ratio.get("burst_pods_per_second"), "{:.2f}"),
                            f"{ratio['burst_pods_per_second'].get('rel_spread', 0):.0%}",
                            per_round,
                            ranged(ratio.get("steady_p50_s"), "{:.2f}"),
                            ranged(ratio.get("steady_p99_s"), "{:.2f}"),
                        ]
                    )
                cpu = entry["cpu_ms_per_pod"]
                path_only = [c for c in components_ordered if c != "benchmark"]
                total = sum(cpu.get(c, 0.0) for c in path_only)
                units = entry.get("cpu_probe_units_per_pod")
                if units:
                    probe_rows.append(probe_row(row["nodes"], name, entry, total, units))
                cpu_rows.append(
                    [str(row["nodes"]), name]
                    + [f"{cpu[c]:.1f}" if c in cpu else "—" for c in components_ordered]
                    + [f"**{total:.1f}**"]
                )
        lines += ["**Throughput and latency**", ""]
        lines += table(
            [
                "nodes",
                "path",
                "burst pods/s",
                "burst p50 s",
                "burst p99 s",
                "steady p50 ms",
                "steady p99 ms",
                "steady bound/s",
            ],
            rows,
            "rl" + "r" * 6,
        )
        if ratio_rows:
            lines += [
                "",
                "**Ours / kube-scheduler, round by round** (each round's runs back to back; "
                "spread: (max − min) / median of the per-round ratios)",
                "",
            ]
            lines += table(
                [
                    "nodes",
                    "path",
                    "pods/s ratio",
                    "spread",
                    "per round",
                    "steady p50 ratio",
                    "steady p99 ratio",
                ],
                ratio_rows,
                "rlrrlrr",
            )
        lines += [
            "",
            "**CPU per pod (ms) per component** (/proc/<pid>/stat over each burst, divided by its "
            "pods; medians over the rounds; total without the benchmark's own client; the idle "
            "rate is not subtracted)",
            "",
        ]
        lines += table(
            ["nodes", "path", *components_ordered, "total"],
            cpu_rows,
            "rl" + "r" * (len(components_ordered) + 1),
        )
        if probe_rows:
            lines += [
                "",
                "**The machine's speed during the bursts** (hack/speed_probe.py: the CPU milliseconds "
                "one fixed unit of work took beside each burst, median per burst; the same figures "
                "as above divided by it. These are steadier than the raw figures across rounds, not "
                "exact: the components do not follow the probe in proportion. Ratios per round, "
                "as above)",
                "",
            ]
            lines += table(
                [
                    "nodes",
                    "path",
                    "probe ms per unit",
                    "probe ratio",
                    "pods/s ratio in probe units",
                    "per round",
                    "CPU per pod, probe units (total)",
                    "raw total ms",
                ],
                probe_rows,
                "rlrrrlrr",
            )
        for idle in rounds.get("idle", []):
            lines += [
                "",
                f"Idle at {idle['nodes']} nodes (CPU seconds per second, nothing created): "
                + ", ".join(f"{k} {v:.3f}" for k, v in idle["cpu_per_s"].items())
                + ".",
            ]
        lines += requests_tables(rounds)
        for row in rounds["summary"]:
            for name in row["paths"]:
                phases = _median_phases(rounds["runs"], row["nodes"], name)
                if phases:
                    phase_rows.append(
                        [str(row["nodes"]), name, ", ".join(f"{k} {v:.3f}" for k, v in phases.items())]
                    )
        if phase_rows:
            lines += ["", "**Steps per pod in the bursts** (p50 seconds, median over the rounds)", ""]
            lines += table(["nodes", "path", "steps"], phase_rows, "rll")
    quality = report.get("quality") or []
    if quality:
        lines += quality_table(quality)
    elif quality_fallback:
        lines += quality_elsewhere(path)
    if rounds and len({run["nodes"] for run in rounds["runs"]}) > 1:
        lines += growth_lines(controller_growth_rows(report, report), "both sizes from this one run")
    if report.get("prepare"):
        lines += prepare_table(report["prepare"])
    elif quality_fallback:
        lines += prepare_elsewhere(path)
    return lines


def probe_row(
    nodes: int, path: str, entry: dict[str, Any], total_ms: float, units: dict[str, float]
) -> list[str]:
    """One path's figures beside the speed probe's: its reading, ours / kube-scheduler's reading
    and pods/s in probe units round by round, the path's CPU per pod in probe units (the
    benchmark's own client left out, as in the raw total)."""
    ratio = entry["ratio"]
    adjusted = ratio.get("burst_pods_per_1000_probe_units")
    per_round = ", ".join(f"{r:.2f}" for r in adjusted["per_round"]) if adjusted else "—"
    total_units = sum(v for component, v in units.items() if component != "benchmark")
    return [
        str(nodes),
        path,
        ranged(entry["figures"].get("speed_probe_ms"), "{:.2f}"),
        ranged(ratio.get("speed_probe_ms"), "{:.2f}"),
        ranged(adjusted, "{:.2f}"),
        per_round,
        f"{total_units:.1f}",
        f"{total_ms:.1f}",
    ]


def _sizes(config: dict[str, Any]) -> str:
    """The node counts of a run: ``100``, or ``100 and 500`` for one with ``--large-nodes``."""
    large = config.get("large_nodes") or 0
    return f"{config['nodes']} and {large}" if large > config["nodes"] else str(config["nodes"])


#: Reports that may hold the prepare comparison, newest kind first: ``--only prepare`` writes
#: prepare.json when the rounds were run apart from it.
PREPARE_REPORTS = ("prepare.json", "cluster.json", "cluster-validation.json")


def prepare_elsewhere(path: Path) -> list[str]:
    """A report run without the prepare section keeps another report's prepare comparison on the
    page, said to be from that report (its own commit and load)."""
    for name in PREPARE_REPORTS:
        other = BENCH / name
        if other == path or not other.exists():
            continue
        report = json.loads(other.read_text())
        if report.get("prepare"):
            return [
                *prepare_table(report["prepare"]),
                "",
                f"Prepare latency from `docs/bench/{name}` (commit `{report['commit'][:10]}`, "
                f"{report['date']}, `{report['command']}`): the run above did not measure it.",
            ]
    return []


def quality_elsewhere(path: Path) -> list[str]:
    """A report run without the quality section (``--only``) keeps the newest other report's
    placement quality on the page, said to be from that report."""
    for name in SECTIONS["cluster"][0]:
        other = BENCH / name
        if other == path or not other.exists():
            continue
        report = json.loads(other.read_text())
        if report.get("quality"):
            purpose = "" if report.get("purpose") == "figures" else "; a validation run of the harness"
            return [
                *quality_table(report["quality"]),
                "",
                f"Placement quality from `docs/bench/{name}` (commit `{report['commit'][:10]}`, "
                f"{report['date']}, `{report['command']}`{purpose}): the run above did not measure it.",
            ]
    return []


def _median_phases(runs: list[dict[str, Any]], nodes: int, path: str) -> dict[str, float]:
    import statistics

    measured = [r for r in runs if r["nodes"] == nodes and r["path"] == path and not r.get("warmup")]
    steps: dict[str, list[float]] = {}
    for run in measured:
        for step, figures in run["burst"].get("phases", {}).items():
            steps.setdefault(step, []).append(figures["p50_s"])
    return {step: statistics.median(values) for step, values in steps.items()}


def requests_tables(rounds: dict[str, Any]) -> list[str]:
    """Requests per pod by client and verb, reads included: one table per node count, a column per path."""
    lines: list[str] = []
    for row in rounds["summary"]:
        paths = [p for p, e in row["paths"].items() if e.get("requests_per_pod")]
        if not paths:
            continue
        keys = sorted(
            {
                (client, request)
                for p in paths
                for client, requests in row["paths"][p]["requests_per_pod"]["by_client"].items()
                for request in requests
            }
        )
        rows = []
        for client, request in keys:
            values = [
                row["paths"][p]["requests_per_pod"]["by_client"].get(client, {}).get(request) for p in paths
            ]
            if all(v is None or v < 0.005 for v in values):
                continue
            rows.append([client, request] + ["—" if v is None else f"{v:.2f}" for v in values])
        rows.append(
            ["**path total**", "reads"]
            + [f"**{row['paths'][p]['requests_per_pod']['reads']:.2f}**" for p in paths]
        )
        rows.append(
            ["**path total**", "writes"]
            + [f"**{row['paths'][p]['requests_per_pod']['writes']:.2f}**" for p in paths]
        )
        lines += [
            "",
            f"**Requests per pod by client and verb at {row['nodes']} nodes** (kube-apiserver's audit "
            "log: user and user agent of each request; a watch counts when it starts; medians over "
            "the rounds; the path totals leave out the benchmark's own client; under 0.005 left out)",
            "",
        ]
        lines += table(["client", "request", *paths], rows, "ll" + "r" * len(paths))
    return lines


def quality_table(qualities: list[dict[str, Any]]) -> list[str]:
    if not qualities:
        return []
    rows = [
        [
            q["label"],
            str(q["idle_gpus"]),
            str(q["pending"]),
            str(q["pending_fragmentation"]),
            f"{q['stranded_gib'] / 1024:.2f}",
            str(q["placed"]),
        ]
        for q in qualities
    ]
    return [
        "",
        "**Placement quality** (the same seeded stream through each path)",
        "",
        *table(
            [
                "path",
                "idle GPUs",
                "pending",
                "of which by fragmentation",
                "free TiB on partly used cards",
                "placed",
            ],
            rows,
        ),
    ]


def prepare_table(prepare: dict[str, Any]) -> list[str]:
    if not prepare:
        return []
    if "skipped" in prepare:
        return ["", f"NodePrepareResources against dra-example-driver: skipped ({prepare['skipped']})."]
    summary = prepare.get("summary")
    if not summary:  # an older report: one figure per path
        return _prepare_table_flat(prepare)
    baseline = any("ours-baseline" in summary[key] for key in summary)
    header = ["callers", "ours p50 / p99", *(["before p50 / p99"] if baseline else [])]
    header += ["dra-example-driver p50 / p99", "ours/peer p50, per round", "ours/peer p99, per round"]
    # The plugins' CPU per claim (prepare + unprepare, from /proc), where the report measured it.
    cpu = all("cpu_ms_per_claim" in figures["ratio ours/dra-example-driver"] for figures in summary.values())
    if cpu:
        header += ["CPU ms per claim ours / peer", "ours/peer CPU, per round"]
    rows = []
    for key, figures in summary.items():
        ratio = figures["ratio ours/dra-example-driver"]

        def both(path: str, figures: dict[str, Any] = figures) -> str:
            f = figures[path]
            return f"{f['p50_ms']['median']:.1f} / {f['p99_ms']['median']:.1f}"

        def per_round(which: str, ratio: dict[str, Any] = ratio) -> str:
            rounds = ratio[which]["per_round"]
            return f"{ratio[which]['median_of_rounds']:.2f} ({min(rounds):.2f}–{max(rounds):.2f})"

        rows.append(
            [
                key.removeprefix("callers="),
                both("ours"),
                *([both("ours-baseline")] if baseline else []),
                both("dra-example-driver"),
                per_round("p50"),
                per_round("p99"),
                *(
                    [
                        f"{figures['ours']['cpu_ms_per_claim']['median']:.2f} / "
                        f"{figures['dra-example-driver']['cpu_ms_per_claim']['median']:.2f}",
                        per_round("cpu_ms_per_claim"),
                    ]
                    if cpu
                    else []
                ),
            ]
        )
    rounds = len(next(iter(summary.values()))["ratio ours/dra-example-driver"]["p50"]["per_round"])
    return [
        "",
        f"**NodePrepareResources** (one client playing kubelet; ms, medians over {rounds} alternated "
        "rounds; the ratios taken per round: median (min–max))",
        "",
        *table(header, rows),
    ]


def _prepare_table_flat(prepare: dict[str, Any]) -> list[str]:
    rows = []
    for callers in (1, 8):
        ours, peer = prepare[f"ours callers={callers}"], prepare[f"dra-example-driver callers={callers}"]
        rows.append(
            [
                str(callers),
                f"{ours['p50_ms']:.1f} / {ours['p99_ms']:.1f}",
                f"{peer['p50_ms']:.1f} / {peer['p99_ms']:.1f}",
                f"{ours['p50_ms'] / peer['p50_ms']:.2f}",
            ]
        )
    return [
        "",
        "**NodePrepareResources** (one client playing kubelet, ms)",
        "",
        *table(["callers", "ours p50 / p99", "dra-example-driver p50 / p99", "ratio ours/peer (p50)"], rows),
    ]


# --- the scale report ------------------------------------------------------------------------------
def scale_section(report: dict[str, Any], path: Path) -> list[str]:
    lines = provenance(report, path)
    config = report["config"]
    lines += [
        "",
        f"{config['nodes']:,} nodes × {config['gpus']} GPUs, {config['pods']:,} pods "
        f"({config['ours_pods']:,} ours, the rest foreign), objects shaped like the API server's "
        f"(managed fields, status; {report['objects']['pod_bytes_mean']:,} bytes per pod in JSON, "
        f"{report['objects']['total_mib']:,.0f} MiB in all); the controller in process over an in-memory API "
        f"that serves them as JSON (lists, then watch events).",
        "",
    ]
    r = report["results"]
    rows = [
        ["initial sync (every informer listed, the first pass done)", f"{r['initial_sync_s']:.1f} s"],
        [
            "controller RSS after the sync (the process's RSS less the API's own objects)",
            f"{r['controller_rss_mib']:,.0f} MiB"
            + (
                f" ({r['controller_rss_after_scrape_mib']:,.0f} MiB once scraped: each piece's text kept)"
                if "controller_rss_after_scrape_mib" in r
                else ""
            ),
        ],
        [
            "decision p50 / p99 (planning one of our pods)",
            f"{r['decision_p50_ms']:.1f} / {r['decision_p99_ms']:.1f} ms ({r['decisions']:,} decisions)",
        ],
        [
            "/metrics scrape (the page served to Prometheus)"
            if "scrape_ms_first" in r
            else "/metrics scrape (render the controller's registry)",
            (
                (
                    f"rendered in the background after the first publish in {r['scrape_warm_up_ms']:.0f} ms; "
                    if "scrape_warm_up_ms" in r
                    else ""
                )
                + f"first {r['scrape_ms_first']:.0f} ms, then {r['scrape_ms_median']:.0f} ms median, "
                f"{r['scrape_ms_max']:.0f} ms max; {r['scrape_kib']:,.0f} KiB"
                f" (every sample rendered: {r['collect_all_ms']:.0f} ms)"
                if "scrape_ms_first" in r
                else f"{r['scrape_ms_median']:.0f} ms median, {r['scrape_ms_max']:.0f} ms max, "
                f"{r['scrape_kib']:,.0f} KiB"
            ),
        ],
        [
            f"controller CPU while only foreign pods churn ({r['foreign_churn_per_s']:g} pods/s created and "
            f"deleted for {r['foreign_churn_s']:g} s)",
            f"{r['foreign_churn_cpu_per_s']:.3f} CPU-s per s "
            f"({r['foreign_churn_cpu_ms_per_event']:.2f} ms per event)",
        ],
        [
            f"our pods ending and arriving ({r['ours_churn_pods']:,} replaced)",
            f"{r['ours_churn_cpu_ms_per_pod']:.1f} ms CPU per pod in all, "
            f"{r['ours_churn_s']:.1f} s until every new pod's gate was lifted",
        ],
    ]
    lines += table(["", "figure"], rows, "lr")
    if report.get("real_cluster"):
        lines += ["", report["real_cluster"]]
    return lines


def _controller_cpu_per_pod(report: dict[str, Any]) -> dict[int, dict[str, float]]:
    """nodes -> path -> the median over measured rounds of our controller's CPU ms per pod."""
    runs = (report.get("rounds") or {}).get("runs", [])
    figures: dict[int, dict[str, list[float]]] = {}
    for run in runs:
        cpu = (run.get("burst") or {}).get("cpu_ms_per_pod", {})
        if run.get("warmup") or "ours controller" not in cpu:
            continue
        figures.setdefault(run["nodes"], {}).setdefault(run["path"], []).append(cpu["ours controller"])
    return {
        nodes: {path: sorted(values)[len(values) // 2] for path, values in paths.items()}
        for nodes, paths in figures.items()
    }


def controller_growth_rows(small: dict[str, Any], large: dict[str, Any]) -> list[list[str]]:
    """Per path: our controller's CPU ms per pod at each smaller size of ``small`` and each larger
    size of ``large``, and their ratio."""
    rows = []
    small_cpu = _controller_cpu_per_pod(small)
    for nodes, paths in sorted(_controller_cpu_per_pod(large).items()):
        for name, value in sorted(paths.items()):
            for small_nodes, small_paths in sorted(small_cpu.items()):
                if name in small_paths and small_nodes < nodes:
                    base = small_paths[name]
                    rows.append(
                        [name, f"{small_nodes} → {nodes}", f"{base:.2f} → {value:.2f}", f"{value / base:.2f}"]
                    )
    return rows


def growth_lines(rows: list[list[str]], source: str) -> list[str]:
    """The table of our controller's CPU per pod as the cluster grows (the issue's bar: no more
    than 1.2 times the smaller size's), ``source`` saying where each size's figure comes from."""
    if not rows:
        return []
    return [
        "",
        "**Our controller's CPU per pod as the cluster grows** (medians over the measured rounds; "
        f"{source}):",
        "",
        *table(["path", "nodes", "controller CPU ms per pod", "ratio"], rows, "llrr"),
    ]


# --- the document ----------------------------------------------------------------------------------
def pick(*names: str) -> Path | None:
    """The first report that exists."""
    for name in names:
        if (BENCH / name).exists():
            return BENCH / name
    return None


SECTIONS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any], Path], list[str]]]] = {
    "cluster": (("cluster.json", "cluster-validation.json"), cluster_section),
    "scale": (("scale.json", "scale-validation.json"), scale_section),
}


def generate(name: str) -> list[str]:
    names, render = SECTIONS[name]
    path = pick(*names)
    if path is None:
        return [f"No report yet ({' or '.join(f'docs/bench/{n}' for n in names)})."]
    return render(json.loads(path.read_text()), path)


def rewrite(text: str, sections: dict[str, list[str]]) -> str:
    """``text`` with each marked section's body replaced; a marker missing is an error."""
    for name, body in sections.items():
        begin, end = begin_marker(name), end_marker(name)
        if begin not in text or end not in text:
            raise ValueError(f"the document has no section {name!r}: add the lines\n{begin}\n{end}")
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + begin + "\n" + "\n".join(body) + "\n" + end + tail
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is not up to date")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    new = rewrite(text, {name: generate(name) for name in SECTIONS})
    if args.check:
        if new != text:
            print(f"{args.doc} is not what the reports give: run hack/perf_tables.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
        print(f"rewrote the generated sections of {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
