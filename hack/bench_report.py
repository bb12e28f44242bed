"""The arithmetic and bookkeeping behind the benchmarks' reports, without any cluster in sight.

hack/bench_cluster.py and hack/bench_scale.py measure; this module turns what they measured into
figures that can be trusted or at least judged: the median and spread of repeated rounds (never a
single run), ours / kube-scheduler per round (both paths measured back to back, so a drift of the
machine weighs on both), requests per pod by client and verb (from the API server's audit log:
its own metrics do not say who sent a request), and where the figures came from (the commit, the
machine, its load). hack/perf_tables.py renders the report into docs/performance.md.

Pure functions over plain data, unit-tested in tests/bench/test_bench_report.py.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: The verbs that read (the rest write). ``watch`` counts once, when the watch starts.
READ_VERBS = frozenset({"get", "list", "watch"})
#: The benchmark's own client (its creates and deletes are not the allocation path's).
BENCHMARK_AGENT = "hami-dra-bench"
#: The identities the benchmark gives our components (client certificates' common names).
CONTROLLER_USER = "hami-dra-bench-controller"
WEBHOOK_USER = "hami-dra-bench-webhook"
#: Clients whose requests are not the allocation path's: the benchmark itself.
NOT_THE_PATH = frozenset({"benchmark"})


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest rank (the value at ``q`` of the sorted values, no interpolation); NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: Iterable[float], digits: int = 3) -> dict[str, float]:
    """Median, min, max and the relative spread ((max - min) / median) of repeated figures."""
    values = list(values)
    if not values:
        return {"n": 0}
    median = statistics.median(values)
    relative = (max(values) - min(values)) / median if median else 0.0
    return {
        "median": round(median, digits), "min": round(min(values), digits),
        "max": round(max(values), digits), "rel_spread": round(relative, 3), "n": len(values),
    }  # fmt: skip


# --- requests by client ------------------------------------------------------------------------------
def client_of(username: str, user_agent: str) -> str:
    """Which component sent a request, from the audit event's user and user agent.

    kube-controller-manager runs each controller under its own service account
    (``--use-service-account-credentials``), so the resourceclaim controller is told apart from
    the garbage collector; both kube-schedulers (the cluster's and the unthrottled one) share the
    ``system:kube-scheduler`` identity and are one client here."""
    if user_agent.startswith(BENCHMARK_AGENT):
        return "benchmark"
    if username == CONTROLLER_USER:
        return "ours controller"
    if username == WEBHOOK_USER:
        return "ours webhook"
    if username == "system:kube-scheduler":
        return "kube-scheduler"
    if username == "system:kube-controller-manager":
        return "kube-controller-manager"
    prefix = "system:serviceaccount:kube-system:"
    if username.startswith(prefix):
        return f"kube-controller-manager ({username[len(prefix) :]})"
    if username == "system:apiserver":
        return "kube-apiserver"
    return username or "?"


def audit_requests(lines: Iterable[str | bytes]) -> Counter[tuple[str, str, str]]:
    """Requests by (client, verb, resource[/subresource]) from audit log lines (JSON, level
    Metadata or above). Each request counts once: a watch when it starts (``ResponseStarted``; it
    may outlive the window), any other request when it completes. Non-resource requests
    (/healthz, /metrics) are left out."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # a line cut at the window's edge
            continue
        verb, stage = event.get("verb", ""), event.get("stage", "")
        if stage != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource")
        if not resource:
            continue
        if ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        user = (event.get("user") or {}).get("username", "")
        counts[(client_of(user, event.get("userAgent", "")), verb, resource)] += 1
    return counts


def requests_per_pod(counts: Mapping[tuple[str, str, str], float], pods: int) -> dict[str, Any]:
    """``{client: {"verb resource": per pod}}`` and the path's totals (reads, writes: without the
    benchmark's own requests)."""
    by_client: dict[str, dict[str, float]] = {}
    reads = writes = 0.0
    for (client, verb, resource), count in sorted(counts.items()):
        by_client.setdefault(client, {})[f"{verb} {resource}"] = round(count / pods, 3)
        if client in NOT_THE_PATH:
            continue
        if verb in READ_VERBS:
            reads += count
        else:
            writes += count
    return {"by_client": by_client, "reads": round(reads / pods, 2), "writes": round(writes / pods, 2)}


# --- rounds --------------------------------------------------------------------------------------------
#: The path every other is compared with.
BASELINE = "kube-scheduler"


def measured(runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs that count: not the warm-up round's."""
    return [run for run in runs if not run.get("warmup")]


def _by_path_round(runs: list[Mapping[str, Any]], figure: Any) -> dict[str, dict[int, float]]:
    table: dict[str, dict[int, float]] = {}
    for run in runs:
        value = figure(run)
        if value is not None:
            table.setdefault(run["path"], {})[run["round"]] = float(value)
    return table


def _ratios(table: dict[str, dict[int, float]], path: str) -> list[float]:
    """``path`` / the baseline, round by round (only rounds with both)."""
    base = table.get(BASELINE, {})
    return [value / base[r] for r, value in sorted(table[path].items()) if base.get(r)]


#: Figures summarised per path: (name, how to read it from a run, higher is better).
FIGURES: tuple[tuple[str, Any], ...] = (
    ("burst_pods_per_second", lambda run: run["burst"]["pods_per_second"]),
    ("burst_p50_s", lambda run: run["burst"]["p50_s"]),
    ("burst_p99_s", lambda run: run["burst"]["p99_s"]),
    ("steady_p50_s", lambda run: (run.get("steady") or {}).get("p50_s")),
    ("steady_p99_s", lambda run: (run.get("steady") or {}).get("p99_s")),
    ("steady_achieved_per_second", lambda run: (run.get("steady") or {}).get("achieved_per_second")),
    ("speed_probe_ms", lambda run: probe_ms(run)),
    (
        "burst_pods_per_1000_probe_units",
        lambda run: run["burst"]["pods_per_second"] * probe_ms(run) if probe_ms(run) else None,
    ),
)


def probe_ms(run: Mapping[str, Any]) -> float | None:
    """The CPU milliseconds one unit of hack/speed_probe.py's work took during the run's burst
    (median; None in reports made before the probe existed)."""
    value = (run["burst"].get("speed_probe") or {}).get("ms_per_unit")
    return float(value) if value else None


def cpu_in_probe_units(run: Mapping[str, Any]) -> dict[str, float]:
    """Each component's CPU per pod in units of the probe's work measured over the same burst: a
    cost that does not move with the machine's speed, as far as the probe tracks it."""
    unit = probe_ms(run)
    if not unit:
        return {}
    return {name: ms / unit for name, ms in run["burst"].get("cpu_ms_per_pod", {}).items()}


def _median_of(dicts: list[Mapping[str, float]]) -> dict[str, float]:
    keys = sorted({key for d in dicts for key in d})
    return {key: round(statistics.median(d.get(key, 0.0) for d in dicts), 3) for key in keys}


def summarise_rounds(runs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per node count, per path: each figure's median and spread over the measured rounds, the
    ratio to kube-scheduler's run of the same round (median and spread of the per-round ratios),
    the CPU per pod of each component and the requests per pod (medians over the rounds)."""
    runs = measured(runs)
    rows = []
    for nodes in sorted({run["nodes"] for run in runs}):
        at = [run for run in runs if run["nodes"] == nodes]
        paths = sorted(dict.fromkeys(run["path"] for run in at), key=lambda path: path != BASELINE)
        row: dict[str, Any] = {"nodes": nodes, "rounds": len({run["round"] for run in at}), "paths": {}}
        for path in paths:
            of_path = [run for run in at if run["path"] == path]
            entry: dict[str, Any] = {"figures": {}, "ratio": {}}
            for name, figure in FIGURES:
                table = _by_path_round(at, figure)
                if path not in table:
                    continue
                entry["figures"][name] = spread(table[path].values())
                if path != BASELINE and BASELINE in table:
                    ratios = _ratios(table, path)
                    if ratios:
                        entry["ratio"][name] = {**spread(ratios), "per_round": [round(r, 3) for r in ratios]}
            entry["cpu_ms_per_pod"] = _median_of([run["burst"].get("cpu_ms_per_pod", {}) for run in of_path])
            in_units = [units for units in map(cpu_in_probe_units, of_path) if units]
            if in_units:
                entry["cpu_probe_units_per_pod"] = _median_of(in_units)
            requests = [run["burst"].get("requests_per_pod") for run in of_path]
            requests = [r for r in requests if r]
            if requests:
                clients = sorted({client for r in requests for client in r["by_client"]})
                entry["requests_per_pod"] = {
                    "reads": round(statistics.median(r["reads"] for r in requests), 2),
                    "writes": round(statistics.median(r["writes"] for r in requests), 2),
                    "by_client": {
                        client: _median_of([r["by_client"].get(client, {}) for r in requests])
                        for client in clients
                    },
                }
            row["paths"][path] = entry
        rows.append(row)
    return rows


# --- where the figures came from ----------------------------------------------------------------------
def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance() -> dict[str, Any]:
    """The commit measured (and whether tracked files differed from it), the machine and its load."""
    memory_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "commit": _git("rev-parse", "HEAD"),
        "commit_subject": _git("log", "-1", "--format=%s"),
        # The reports themselves are left out: a report of an earlier run not yet committed is no
        # change to the code measured.
        "dirty": bool(
            _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/bench")
        ),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(), "memory_gib": round(memory_kib / 2**20, 1),
            "cpu_model": _cpu_model(), "kernel": platform.release(), "python": platform.python_version(),
        },
    }  # fmt: skip


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []
