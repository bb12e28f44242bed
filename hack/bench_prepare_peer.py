#!/usr/bin/env python3
"""NodePrepareResources latency of our kubelet plugin and of dra-example-driver's, side by side.

Used by hack/bench_cluster.py while its real cluster runs (both plugins read their claims from the
real API server), and on its own (``main``): against a running cluster's kubeconfig, or else a
sandbox API server it starts. One client plays kubelet for every plugin (dev/hami_dra_dev/kubelet.py:
registration over the plugin's socket, then the DRA service it offers), with the same claims: one
simulated GPU each, 8 per batch (one per device: the example driver's GPUs take one claim each),
unprepared after every batch; every prepare is a first prepare (API read, checkpoint, CDI spec).

Rounds: each round measures every plugin at 1 and then 8 callers, the plugins in turn, the one
that starts rotating from round to round; the first round is a warm-up and is dropped. The summary
gives, per plugin and caller count, the median of the kept rounds' p50 and p99 with their min and
max, the plugin process's CPU per claim (prepare and unprepare, from /proc: the figure the
machine's load moves least), and the ratio ours/peer per round and of the medians.
``--baseline DIR`` (a ``git worktree add DIR COMMIT`` of an earlier commit) adds that commit's
plugin as a third contender in the same rounds, so a before/after comparison shares the
machine's load. The report keeps every latency.

    .venv/bin/python hack/bench_prepare_peer.py [--kubeconfig FILE] [--rounds 6] [--claims 200] \\
        [--baseline DIR] [--report build/bench-prepare-peer.json]

The peer is ``sigs.k8s.io/dra-example-driver``'s ``dra-example-kubeletplugin`` at the version of
hack/cluster/versions.env, built by ``hack/cluster/build.sh dra-example-driver``. Its client is
rate-limited to 5 requests/s by default (``--kube-api-qps``), which alone would cap it at 5
prepares/s; it runs with 1000 so that what is compared is the plugins' own work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The closed-loop callers and the process CPU clock of hack/bench_prepare.py.
from bench_prepare import cpu_seconds, percentile, run_parallel

ROOT = Path(__file__).resolve().parents[1]
PEER_DRIVER = "gpu.example.com"
OURS_DRIVER = "gpu.hami.io"
DEVICES = 8
NAMESPACE = "bench-prepare"
PEER = "dra-example-driver"
OURS = "ours"
BASELINE = "ours-baseline"
CALLERS = (1, 8)
NODES = {OURS: "prep-ours", PEER: "prep-peer", BASELINE: "prep-base"}


def peer_binary() -> Path | None:
    versions = dict(
        line.split("=", 1)
        for line in (ROOT / "hack/cluster/versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    cache = Path(os.environ.get("HAMI_DRA_CACHE", Path.home() / ".cache/hami-dra"))
    path = (
        cache
        / "dra-example-driver"
        / f"v{versions['DRA_EXAMPLE_DRIVER_VERSION']}"
        / "bin/dra-example-kubeletplugin"
    )
    return path if path.exists() else None


def wait_for_file(
    pattern_dir: Path, suffix: str, process: subprocess.Popen[Any], timeout: float = 60
) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(pattern_dir.glob(f"*{suffix}")) if pattern_dir.is_dir() else []
        if found:
            return found[0]
        if process.poll() is not None:
            raise RuntimeError(
                f"plugin exited ({process.returncode}) before creating *{suffix} in {pattern_dir}"
            )
        time.sleep(0.1)
    raise TimeoutError(f"no *{suffix} in {pattern_dir} within {timeout:.0f}s")


def allocated_claims(api: Any, node: str, driver: str, count: int, shared: bool) -> list[dict[str, str]]:
    """Create ``count`` claims allocated on ``node``'s devices of ``driver``; their references."""
    refs: list[dict[str, str]] = []
    base = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    for index in range(count):
        name = f"prep-{node}-{index}"
        body = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}},
        }  # fmt: skip
        created = api.call("POST", base, body)
        result: dict[str, Any] = {
            "request": "gpu",
            "driver": driver,
            "pool": node,
            "device": f"gpu-{index % DEVICES}",
        }
        if shared:  # our GPUs are shared: every allocation is one share of the card
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {"memory": "1Gi", "cores": "10", "slots": "1"}
        created["status"] = {"allocation": {"devices": {"results": [result]}}}
        api.call("PUT", f"{base}/{name}/status", created)
        refs.append({"namespace": NAMESPACE, "name": name, "uid": created["metadata"]["uid"]})
    return refs


def measure(client: Any, refs: list[dict[str, str]], callers: int, pid: int) -> dict[str, Any]:
    """Prepare every claim (``callers`` concurrent, 8 per batch), unpreparing each batch after it.

    ``cpu_ms_per_claim``: the CPU the plugin process (``pid``) spent per claim prepared and
    unprepared, the figure that the machine's load disturbs least (latencies queue behind it).
    """
    latencies: list[float] = []
    unprepares: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def prepare(chunk: list[dict[str, str]]) -> None:
        for ref in chunk:
            started = time.perf_counter()
            response = client.prepare([ref])
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                latencies.append(elapsed)
                if response.claims[ref["uid"]].error:
                    errors.append(response.claims[ref["uid"]].error)

    client.prepare([refs[0]])  # warm-up: channel, first API connection
    client.unprepare([refs[0]])
    cpu_before = cpu_seconds(pid)
    for begin in range(0, len(refs), DEVICES):
        batch = refs[begin : begin + DEVICES]
        run_parallel(prepare, batch, callers)
        for ref in batch:
            started = time.perf_counter()
            client.unprepare([ref])
            unprepares.append((time.perf_counter() - started) * 1000)
    cpu_ms = (cpu_seconds(pid) - cpu_before) * 1000
    if errors:
        raise RuntimeError(f"{len(errors)} prepares failed, first: {errors[0]}")
    return {
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "unprepare_p50_ms": round(statistics.median(unprepares), 3),
        "cpu_ms_per_claim": round(cpu_ms / len(latencies), 3),
        "prepares": len(latencies),
        "latencies_ms": [round(value, 3) for value in latencies],
    }


def create_namespace(api: Any, timeout: float = 120) -> None:
    """Create the namespace; one left by an earlier run may still be terminating."""
    from dra_driver.kube.errors import KubeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            return
        except KubeError as err:
            if err.status != 409 or time.monotonic() > deadline:
                raise
            time.sleep(1)


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of the kept rounds' figures."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarise(measures: list[dict[str, Any]], plugins: list[str]) -> dict[str, Any]:
    """Per caller count: each plugin's p50/p99 over the kept rounds, and ours (and the baseline)
    against the peer and against each other, per round and of the medians."""
    kept = [m for m in measures if not m["warmup"]]
    summary: dict[str, Any] = {}
    for callers in CALLERS:
        at = {
            plugin: {m["round"]: m for m in kept if m["plugin"] == plugin and m["callers"] == callers}
            for plugin in plugins
        }
        row: dict[str, Any] = {}
        for plugin in plugins:
            row[plugin] = {
                key: spread([m[key] for m in at[plugin].values()])
                for key in ("p50_ms", "p99_ms", "unprepare_p50_ms", "cpu_ms_per_claim")
                if all(key in m for m in at[plugin].values())  # reports before the CPU figure
            }
        pairs = [(OURS, PEER)] + ([(BASELINE, PEER), (OURS, BASELINE)] if BASELINE in plugins else [])
        for mine, theirs in pairs:
            ratios: dict[str, Any] = {}
            for key in ("p50_ms", "p99_ms", "cpu_ms_per_claim"):
                if key not in row[mine] or key not in row[theirs]:
                    continue
                rounds = sorted(set(at[mine]) & set(at[theirs]))
                per_round = [at[mine][r][key] / at[theirs][r][key] for r in rounds]
                ratios[key.removesuffix("_ms")] = {
                    "of_medians": round(row[mine][key]["median"] / row[theirs][key]["median"], 3),
                    "median_of_rounds": round(statistics.median(per_round), 3),
                    "per_round": [round(r, 3) for r in per_round],
                }
            row[f"ratio {mine}/{theirs}"] = ratios
        summary[f"callers={callers}"] = row
    return summary


def start_ours(tree: Path, node: str, kubeconfig: Path, work: Path, logs: TextIO) -> subprocess.Popen[Any]:
    """Our plugin from the checkout at ``tree`` (its code, run from its root)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())",
         "kubelet-plugin", "--node-name", node, "--source", "simulated", "--profile", "h100-80gb",
         "--gpus", str(DEVICES), "--kubeconfig", str(kubeconfig),
         "--plugin-dir", str(work / "plugin"),
         "--registry-dir", str(work / "registry"), "--cdi-dir", str(work / "cdi"),
         "--boot-id-file", str(work.parent / "boot_id"), "--publish=false", "--metrics-bind-address", "0"],
        cwd=tree, stdout=subprocess.DEVNULL, stderr=logs,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )  # fmt: skip


def start_peer(peer: Path, node: str, kubeconfig: Path, work: Path, logs: TextIO) -> subprocess.Popen[Any]:
    for directory in ("cdi", "registry", f"plugins/{PEER_DRIVER}"):
        (work / directory).mkdir(parents=True, exist_ok=True)  # the peer does not create them
    return subprocess.Popen(
        [str(peer), "--node-name", node, "--cdi-root", str(work / "cdi"),
         "--num-devices", str(DEVICES), "--kubelet-registrar-directory-path", str(work / "registry"),
         "--kubelet-plugins-directory-path", str(work / "plugins"), "--kubeconfig", str(kubeconfig),
         "--kube-api-qps", "1000", "--kube-api-burst", "1000"],
        stdout=logs, stderr=logs,
    )  # fmt: skip


def git_commit(tree: Path) -> str:
    run = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        return "unknown"
    return run.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def compare(
    api: Any,
    kubeconfig: Path,
    work: Path,
    claims: int = 200,
    rounds: int = 6,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """Start the plugins for simulated nodes, measure them in alternated rounds; stop them.

    Returns ``{"<plugin> callers=<n>": {"p50_ms", "p99_ms", "prepares"}}`` (the medians over the
    kept rounds, as hack/bench_cluster.py prints them) next to ``summary`` and every ``measures``.
    """
    from hami_dra_dev.kubelet import KubeletProtocol, PluginClient

    peer = peer_binary()
    if peer is None:
        return {"skipped": "dra-example-driver not built (hack/cluster/build.sh dra-example-driver)"}
    if rounds < 2:
        raise ValueError("rounds: at least 2 (the first is a warm-up and is dropped)")
    plugins = [OURS, PEER] + ([BASELINE] if baseline is not None else [])
    commits = {OURS: git_commit(ROOT), **({BASELINE: git_commit(baseline)} if baseline else {})}  # as started
    create_namespace(api)
    for plugin in plugins:
        api.call(
            "POST",
            "/api/v1/nodes",
            {"metadata": {"name": NODES[plugin], "labels": {"gpu.hami.io/simulated-node": "true"}}},
        )
    work.mkdir(parents=True, exist_ok=True)
    (work / "boot_id").write_text("bench\n")
    processes: dict[str, subprocess.Popen[Any]] = {}
    logs = open(work / "plugins.log", "w")  # noqa: SIM115 - closed in finally
    try:
        processes[OURS] = start_ours(ROOT, NODES[OURS], kubeconfig, work / "ours", logs)
        processes[PEER] = start_peer(peer, NODES[PEER], kubeconfig, work / "peer", logs)
        if baseline is not None:
            processes[BASELINE] = start_ours(baseline, NODES[BASELINE], kubeconfig, work / "base", logs)
        protocol = KubeletProtocol.own(ROOT)
        directories = {OURS: "ours", PEER: "peer", BASELINE: "base"}
        clients = {
            name: PluginClient(
                protocol, wait_for_file(work / directories[name] / "registry", ".sock", process)
            )
            for name, process in processes.items()
        }
        for client in clients.values():
            client.register()
        refs = {
            name: allocated_claims(api, NODES[name], PEER_DRIVER if name == PEER else OURS_DRIVER,
                                   claims, shared=name != PEER)
            for name in plugins
        }  # fmt: skip
        measures: list[dict[str, Any]] = []
        for round_ in range(rounds):
            order = plugins[round_ % len(plugins) :] + plugins[: round_ % len(plugins)]
            for callers in CALLERS:
                for name in order:
                    figures = measure(clients[name], refs[name], callers, processes[name].pid)
                    measures.append(
                        {"round": round_, "warmup": round_ == 0, "plugin": name, "callers": callers,
                         "load_avg_1m": round(os.getloadavg()[0], 2), **figures}
                    )  # fmt: skip
                    print(
                        f"round {round_}{' (warm-up)' if round_ == 0 else ''} {name:<18} callers={callers}: "
                        f"p50 {figures['p50_ms']:.2f} ms p99 {figures['p99_ms']:.2f} ms "
                        f"cpu {figures['cpu_ms_per_claim']:.2f} ms/claim",
                        file=sys.stderr, flush=True,
                    )  # fmt: skip
        for client in clients.values():
            client.close()
    finally:
        for process in processes.values():
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        logs.close()
        for plugin in plugins:
            api.call("DELETE", f"/api/v1/nodes/{NODES[plugin]}")
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
    summary = summarise(measures, plugins)
    report: dict[str, Any] = {
        "method": {
            "claims_per_measure": claims, "batch": DEVICES, "rounds": rounds, "warmup_rounds_dropped": 1,
            "order": "per round: callers 1 then 8, the plugins in turn, the first rotating by round",
            "percentile": "nearest rank over one measure's prepares; the summary is over the kept rounds",
        },
        "commits": commits,
        "peer": str(peer),
        "cpus": os.cpu_count(),
        "summary": summary,
        "measures": measures,
    }  # fmt: skip
    for callers in CALLERS:
        for plugin in plugins:
            row = summary[f"callers={callers}"][plugin]
            report[f"{plugin} callers={callers}"] = {
                "p50_ms": row["p50_ms"]["median"], "p99_ms": row["p99_ms"]["median"], "prepares": claims,
            }  # fmt: skip
    return report


def print_summary(report: dict[str, Any]) -> None:
    for key, row in report["summary"].items():
        print(f"{key}:")
        for name, figures in row.items():
            if name.startswith("ratio "):
                p50, p99 = figures["p50"], figures["p99"]
                cpu = figures.get("cpu_ms_per_claim")
                cpu_text = f"  cpu {cpu['of_medians']:.2f} (rounds {cpu['per_round']})" if cpu else ""
                print(f"  {name:<40} p50 {p50['of_medians']:.2f} (rounds {p50['per_round']})"
                      f"  p99 {p99['of_medians']:.2f} (rounds {p99['per_round']}){cpu_text}")  # fmt: skip
            else:
                p50, p99, cpu = figures["p50_ms"], figures["p99_ms"], figures.get("cpu_ms_per_claim")
                print(f"  {name:<18} p50 {p50['median']:6.2f} ms [{p50['min']:.2f}-{p50['max']:.2f}]"
                      f"  p99 {p99['median']:6.2f} ms [{p99['min']:.2f}-{p99['max']:.2f}]"
                      + (f"  cpu/claim {cpu['median']:.2f} ms [{cpu['min']:.2f}-{cpu['max']:.2f}]"
                         if cpu else ""))  # fmt: skip


class _Api:
    """``call(method, path, body)`` over the kubernetes client, as hack/bench_cluster.py's Api."""

    def __init__(self, api_client: Any) -> None:
        from dra_driver.kube import api

        self.kube = api.Kube(api_client, request_timeout=120)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self.kube._call(method, path, query={}, body=body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kubeconfig", type=Path, default=None,
        help="a running cluster's API server (default: a sandbox API server of ours)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6, help="rounds, the first a dropped warm-up")
    parser.add_argument("--claims", type=int, default=200, help="prepares per plugin, caller count and round")
    parser.add_argument(
        "--baseline", type=Path, default=None,
        help="a checkout of an earlier commit (git worktree add DIR COMMIT), measured in the same rounds",
    )  # fmt: skip
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "bench-prepare-peer.json")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (the first is a warm-up and is dropped)")
    if args.baseline is not None and not (args.baseline / "dra_driver" / "cli.py").is_file():
        parser.error(f"--baseline: {args.baseline} is not a checkout of this repository")

    from kubernetes import config

    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-peer-"))
    sandbox = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from hami_dra_dev.sandbox.server import SandboxServer

        sandbox = SandboxServer.start(state_dir=work / "sandbox")
        kubeconfig = sandbox.kubeconfig_path
    try:
        api = _Api(config.new_client_from_config(config_file=str(kubeconfig)))
        started = time.monotonic()
        report = compare(api, kubeconfig, work / "plugins", args.claims, args.rounds, args.baseline)
        if "skipped" in report:
            print(f"bench_prepare_peer: {report['skipped']}", file=sys.stderr)
            return 2
        report["api_server"] = "sandbox" if sandbox is not None else f"kubeconfig {kubeconfig}"
        report["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
        report["wall_s"] = round(time.monotonic() - started, 1)
        report["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    finally:
        if sandbox is not None:
            sandbox.stop()
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(report)
    print(f"(report: {args.report})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
