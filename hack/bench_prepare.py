#!/usr/bin/env python3
"""NodePrepareResources latency over the plugin's real unix socket, with 8 concurrent callers.

Three processes, as on a node: the sandbox API server, ``hami-dra kubelet-plugin`` (simulated
H200 x 8), and this script playing kubelet with a client compiled from kubelet's protos (kubelet's
own files when they are beside the repository, else ours in api/kubelet). Every prepare is a
first prepare: the plugin reads the claim from the API server, runs the capacity check, writes
the claim's record and CDI spec and one checkpoint. Claims are prepared in rounds of 80 (the node's share
slots), each round followed by concurrent unprepares (timed separately), so capacity never runs
out.

    .venv/bin/python hack/bench_prepare.py [--callers 8] [--claims 400] [--json] [--profile FILE]

``--profile FILE`` runs the plugin's DRA handlers under cProfile, on each handler thread's CPU
clock (``time.thread_time``: waits on the API server, locks and fsyncs cost nothing), and writes
the merged pstats to FILE when the plugin stops (``python -m pstats FILE``).

Goal (issue 5): p50 <= 5 ms, p99 <= 25 ms.

The callers form a closed loop (each sends its next prepare as soon as the last one returns), so
by Little's law the mean latency is ``callers / throughput``: with 8 callers a 5 ms p50 needs
about 1600 prepares/s, i.e. under 1.25 ms of CPU per prepare for plugin, API server and this
client together on a 2-core machine. ``closed_loop_mean_ms`` prints that bound next to the
measured figures.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hami_dra_dev.kubelet import KubeletProtocol, PluginClient  # noqa: E402

NODE = "bench-node"
CLI = [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())"]
#: The plugin, its DRA handlers profiled per thread (CPU time); the merged stats go to argv[1].
PROFILED_CLI = [
    sys.executable,
    "-c",
    """
import atexit, cProfile, pstats, sys, threading, time
from dra_driver.kubeletplugin import dra_service
out, profiles, local, lock = sys.argv.pop(1), [], threading.local(), threading.Lock()
def profiled(handler):
    def run(self, request, context):
        profile = getattr(local, "profile", None)
        if profile is None:
            profile = local.profile = cProfile.Profile(time.thread_time)
            with lock:
                profiles.append(profile)
        profile.enable()
        try:
            return handler(self, request, context)
        finally:
            profile.disable()
    return run
for name in ("node_prepare_resources", "node_unprepare_resources"):
    setattr(dra_service.DraService, name, profiled(getattr(dra_service.DraService, name)))
atexit.register(lambda: profiles and pstats.Stats(*profiles).dump_stats(out))
from dra_driver.cli import main
sys.exit(main())
""",
]
SANDBOX = (
    "import sys, time; from hami_dra_dev.sandbox.server import SandboxServer; "
    "s = SandboxServer.start(state_dir=__import__('pathlib').Path(sys.argv[1])); "
    "print(s.kubeconfig_path, flush=True); time.sleep(3600)"
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to show where the time goes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_parallel(target: Any, chunk: list[dict[str, str]], callers: int) -> None:
    """``callers`` threads, each calling ``target`` with its share of ``chunk``; waits for all."""
    threads = [threading.Thread(target=target, args=(chunk[i::callers],)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--profile", type=Path, help="write the plugin handlers' CPU profile (pstats) here")
    args = parser.parse_args()

    from kubernetes import client as k8s
    from kubernetes import config

    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        sandbox = subprocess.Popen(
            [sys.executable, "-c", SANDBOX, str(work / "sandbox")],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(sandbox)
        assert sandbox.stdout is not None
        kubeconfig = sandbox.stdout.readline().strip()
        api_client = config.new_client_from_config(config_file=kubeconfig)
        k8s.CoreV1Api(api_client).create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        )
        boot = work / "boot_id"
        boot.write_text("bench\n")
        cli = [*PROFILED_CLI, str(args.profile.resolve())] if args.profile else CLI
        plugin = subprocess.Popen(
            [*cli, "kubelet-plugin", "--node-name", NODE, "--source", "simulated", "--profile", "h200",
             "--gpus", "8", "--kubeconfig", kubeconfig, "--plugin-dir", str(work / "plugin"),
             "--registry-dir", str(work / "registry"), "--cdi-dir", str(work / "cdi"),
             "--boot-id-file", str(boot), "--publish=false"],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(plugin)
        assert plugin.stdout is not None
        socket = Path(plugin.stdout.readline().split(":", 1)[1].strip())

        upstream = REPO / ".." / "shared" / "reference" / "upstream" / "kubernetes" / "kubelet"
        protocol = KubeletProtocol.compile(upstream) if upstream.is_dir() else KubeletProtocol.own(REPO)
        kubelet = PluginClient(protocol, socket)
        kubelet.register()

        resource = k8s.ResourceV1Api(api_client)
        refs = []
        for i in range(args.claims):
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{i}", "namespace": "default"},
                "spec": {
                    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}]}
                },
            }
            created = json.loads(
                resource.create_namespaced_resource_claim("default", body, _preload_content=False).data
            )
            created["status"] = {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.hami.io", "pool": NODE, "device": f"gpu-{i % 8}",
                "shareID": str(uuid.uuid4()),
                "consumedCapacity": {"memory": "1Gi", "cores": "10", "slots": "1"},
            }]}}}  # fmt: skip
            resource.replace_namespaced_resource_claim_status(
                f"c{i}", "default", created, _preload_content=False
            )
            refs.append({"namespace": "default", "name": f"c{i}", "uid": created["metadata"]["uid"]})

        kubelet.prepare([refs[0]])  # warm-up: channel, first API connection
        kubelet.unprepare([refs[0]])
        prepare_ms: list[float] = []
        unprepare_ms: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def caller(chunk: list[dict[str, str]]) -> None:
            for ref in chunk:
                started = time.perf_counter()
                response = kubelet.prepare([ref])
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    prepare_ms.append(elapsed)
                    if response.claims[ref["uid"]].error:
                        errors.append(response.claims[ref["uid"]].error)

        def unprepare_all(chunk: list[dict[str, str]]) -> None:
            for ref in chunk:
                started = time.perf_counter()
                kubelet.unprepare([ref])
                with lock:
                    unprepare_ms.append((time.perf_counter() - started) * 1000)

        # Rounds of `capacity` claims (H200 x 8 with 10 slots each): prepare them concurrently
        # (timed), then unprepare them concurrently (timed separately) so the next round fits.
        capacity = 80
        pending = refs[1:]
        wall = 0.0
        pids = {"plugin": plugin.pid, "sandbox": sandbox.pid, "kubelet": os.getpid()}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        while pending:
            batch, pending = pending[:capacity], pending[capacity:]
            started = time.perf_counter()
            run_parallel(caller, batch, args.callers)
            wall += time.perf_counter() - started
            run_parallel(unprepare_all, batch, args.callers)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        figures = {
            "callers": args.callers,
            "prepares": len(prepare_ms),
            "errors": len(errors),
            "prepare_p50_ms": round(statistics.median(prepare_ms), 2),
            "prepare_p99_ms": round(percentile(prepare_ms, 0.99), 2),
            "unprepare_p50_ms": round(statistics.median(unprepare_ms), 2),
            "unprepare_p99_ms": round(percentile(unprepare_ms, 0.99), 2),
            "throughput_per_s": round(len(prepare_ms) / wall, 1),
            "closed_loop_mean_ms": round(args.callers * wall * 1000 / len(prepare_ms), 2),
            **{
                f"cpu_ms_per_claim_{name}": round(seconds * 1000 / len(prepare_ms), 2)
                for name, seconds in cpu.items()
            },
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        if args.json:
            print(json.dumps(figures))
        else:
            for key, value in figures.items():
                print(f"{key:>18}: {value}")
        if errors:
            print(f"first error: {errors[0]}", file=sys.stderr)
        kubelet.close()
        return 1 if errors else 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
