#!/usr/bin/env python3
"""Benchmark the allocation controller end to end through the sandbox API server.

    .venv/bin/python hack/bench_controller.py [--nodes 100] [--gpus 8] [--pods 800]

The sandbox API server runs in a child process (its own interpreter, as a real API server would
be its own process); this process creates Nodes, one pool of ``--gpus`` simulated GPUs per node,
the DeviceClass, and ``--pods`` gated pods with one ResourceClaim each, while the controller is
held back (not leader). Then the controller is released and the clock runs until every claim is
allocated and every gate removed: finalizer Update + status UpdateStatus + pod Update per pod,
all with resourceVersions, plus the watch events they cause. Reported: claims/s over the drain,
the engine decision latency (p50/p99) per pod, and the CPU per claim of this process (the
controller, which does nearly all of this process's work during the drain) and of the sandbox API
server's process: CPU is less sensitive than wall time to other load on a shared machine. Anchor
(issue 6): kube-scheduler's DRA scheduling does about 240-270 pods/s at 500 nodes on 6 cores;
the goal is >= 200 claims/s here.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRIVER = "gpu.hami.io"


class TimedPlanner:
    """Wraps the allocator's planner to record how long each placement decision took."""

    def __init__(self, inner: Any, seconds: list[float]) -> None:
        self.inner, self.seconds = inner, seconds

    def plan(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.inner.plan(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def time_decisions(controller: Any) -> list[float]:
    seconds: list[float] = []
    controller.allocator.planner = TimedPlanner(controller.allocator.planner, seconds)
    return seconds


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of another process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(state_dir: str, ready: Any, stop: Any) -> None:
    from hami_dra_dev.sandbox import SandboxServer

    with SandboxServer.start(state_dir=Path(state_dir), history_window=200_000):
        ready.set()
        stop.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--profile", default="h100-80gb")
    parser.add_argument("--pods", type=int, default=800)
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--workers", type=int, default=4, help="controller writer threads")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--profile-out", default=None, help="write a cProfile of the controller passes here")
    args = parser.parse_args(argv)

    from kubernetes import config

    from dra_driver.config import ControllerDefaults
    from dra_driver.controller.controller import Controller
    from dra_driver.devices.simulated import profile_gpus

    try:
        from dra_driver.kube.api import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Kube
    except ImportError:  # an older checkout measured for an A/B comparison (PYTHONPATH=<worktree>)
        from dra_driver.controller.kube import (  # type: ignore[no-redef]
            DEVICE_CLASSES,
            NODES,
            PODS,
            RESOURCE_CLAIMS,
            RESOURCE_SLICES,
            Kube,
        )
    from dra_driver.resource.slice_builder import build_resource_slices
    from hami_dra_dev.sandbox.cluster import node_object

    state = tempfile.mkdtemp(prefix="hami-dra-bench-")
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    server = ctx.Process(target=serve, args=(state, ready, stop), daemon=True)
    server.start()
    if not ready.wait(30):
        print("sandbox did not start", file=sys.stderr)
        return 1
    kubeconfig = str(Path(state) / "kubeconfig")
    new_client: Any = config.new_client_from_config
    kube = Kube(new_client(config_file=kubeconfig))
    try:
        for index in range(args.nodes):
            name = f"node-{index:03d}"
            kube.create(NODES, None, node_object(name))
            gpus = profile_gpus(args.profile, node_name=name, gpus=args.gpus)
            for obj in build_resource_slices(gpus, node_name=name, driver_name=DRIVER):
                kube.create(RESOURCE_SLICES, None, obj)
        kube.create(
            DEVICE_CLASSES,
            None,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        leading = threading.Event()
        controller = Controller(
            Kube(new_client(config_file=kubeconfig)),
            DRIVER,
            ControllerDefaults(policy=args.policy),
            is_leader=leading.is_set,
            write_workers=args.workers,
        )
        decision_seconds = time_decisions(controller)
        controller.start()
        profiler = None
        if args.profile_out:
            import cProfile

            profiler = cProfile.Profile()
            run_once = controller.run_once

            def profiled() -> None:
                assert profiler is not None
                profiler.enable()
                try:
                    run_once()
                finally:
                    profiler.disable()

            controller.run_once = profiled  # type: ignore[method-assign]

        def create(number: int) -> None:
            client = clients[number % len(clients)]
            name = f"bench-{number:05d}"
            client.create(
                RESOURCE_CLAIMS,
                "default",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": DRIVER,
                                        "capacity": {"requests": {"memory": "8Gi", "cores": "10"}},
                                    },
                                }
                            ]
                        }
                    },
                },
            )
            client.create(
                PODS,
                "default",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {
                        "schedulingGates": [{"name": "gpu.hami.io/allocation"}],
                        "containers": [
                            {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    },
                },
            )

        clients = [Kube(new_client(config_file=kubeconfig)) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(create, range(args.pods)))
        deadline = time.monotonic() + 60
        while (
            len([p for p in controller.cache.pods.values() if p["spec"].get("schedulingGates")]) < args.pods
        ):
            if time.monotonic() > deadline:
                raise SystemExit("controller did not see all pods")
            time.sleep(0.05)
        started = time.perf_counter()
        cpu_started, server_cpu_started = time.process_time(), process_cpu(server.pid)
        leading.set()
        controller.wake()
        while controller.metrics.allocations._value.get() < args.pods:
            if time.perf_counter() - started > 600:
                raise SystemExit("timed out")
            time.sleep(0.01)
        while any(p["spec"].get("schedulingGates") for p in controller.cache.pods.values()):
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        server_cpu = process_cpu(server.pid) - server_cpu_started
        controller.stop()
        if profiler is not None:
            profiler.dump_stats(args.profile_out)
        latencies = sorted(decision_seconds)
        figures = {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus,
            "pods": args.pods,
            "policy": args.policy,
            "writer_threads": args.workers,
            "seconds": round(elapsed, 3),
            "claims_per_second": round(args.pods / elapsed, 1),
            "decision_p50_ms": round(statistics.median(latencies) * 1000, 3),
            "decision_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
            "conflicts": controller.metrics.conflicts._value.get(),
            "controller_cpu_ms_per_claim": round(cpu * 1000 / args.pods, 2),
            "apiserver_cpu_ms_per_claim": round(server_cpu * 1000 / args.pods, 2),
        }
        if args.json:
            print(json.dumps(figures))
        else:
            for key, value in figures.items():
                print(f"{key:>20}: {value}")
        return 0
    finally:
        stop.set()
        server.join(timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
