"""NodePrepareResources latency of our kubelet plugin and of dra-example-driver's, side by side.

Used by hack/bench_cluster.py while its real cluster runs (both plugins read their claims from the
real API server). One client plays kubelet for both (dra_driver/sandbox/kubelet.py: registration
over the plugin's socket, then the DRA service it offers), with the same claims: one simulated GPU
each, 8 per round (one per device: the example driver's GPUs take one claim each), unprepared
after every round; every prepare is a first prepare (API read, checkpoint, CDI spec).

The peer is ``sigs.k8s.io/dra-example-driver``'s ``dra-example-kubeletplugin`` at the version of
hack/cluster/versions.env, built by ``hack/cluster/build.sh dra-example-driver``. Its client is
rate-limited to 5 requests/s by default (``--kube-api-qps``), which alone would cap it at 5
prepares/s; it runs with 1000 so that what is compared is the plugins' own work.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench_prepare import percentile, run_parallel  # the same closed-loop callers as hack/bench_prepare.py

ROOT = Path(__file__).resolve().parents[1]
PEER_DRIVER = "gpu.example.com"
OURS_DRIVER = "gpu.hami.io"
DEVICES = 8
NAMESPACE = "bench-prepare"


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
        name = f"prep-{driver.split('.')[1]}-{index}"
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


def measure(client: Any, refs: list[dict[str, str]], callers: int) -> dict[str, float]:
    latencies: list[float] = []
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
    for begin in range(0, len(refs), DEVICES):
        batch = refs[begin : begin + DEVICES]
        run_parallel(prepare, batch, callers)
        for ref in batch:
            client.unprepare([ref])
    if errors:
        raise RuntimeError(f"{len(errors)} prepares failed, first: {errors[0]}")
    return {
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 0.99),
        "prepares": len(latencies),
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


def compare(api: Any, kubeconfig: Path, work: Path, claims: int = 200) -> dict[str, Any]:
    """Start both plugins for two simulated nodes, measure 1 and 8 callers each; stop them."""
    from dra_driver.sandbox.kubelet import KubeletProtocol, PluginClient

    peer = peer_binary()
    if peer is None:
        return {"skipped": "dra-example-driver not built (hack/cluster/build.sh dra-example-driver)"}
    create_namespace(api)
    for node in ("prep-ours", "prep-peer"):
        api.call(
            "POST",
            "/api/v1/nodes",
            {"metadata": {"name": node, "labels": {"gpu.hami.io/simulated-node": "true"}}},
        )
    work.mkdir(parents=True, exist_ok=True)
    (work / "boot_id").write_text("bench\n")
    processes: list[subprocess.Popen[Any]] = []
    logs = open(work / "plugins.log", "w")  # noqa: SIM115 - closed in finally
    try:
        ours = subprocess.Popen(
            [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())",
             "kubelet-plugin", "--node-name", "prep-ours", "--source", "simulated", "--profile", "h100-80gb",
             "--gpus", str(DEVICES), "--kubeconfig", str(kubeconfig),
             "--plugin-dir", str(work / "ours/plugin"),
             "--registry-dir", str(work / "ours/registry"), "--cdi-dir", str(work / "ours/cdi"),
             "--boot-id-file", str(work / "boot_id"), "--publish=false", "--metrics-bind-address", "0"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=logs,
        )  # fmt: skip
        processes.append(ours)
        for directory in ("peer/cdi", "peer/registry", f"peer/plugins/{PEER_DRIVER}"):
            (work / directory).mkdir(parents=True, exist_ok=True)  # the peer does not create them
        theirs = subprocess.Popen(
            [str(peer), "--node-name", "prep-peer", "--cdi-root", str(work / "peer/cdi"),
             "--num-devices", str(DEVICES), "--kubelet-registrar-directory-path", str(work / "peer/registry"),
             "--kubelet-plugins-directory-path", str(work / "peer/plugins"), "--kubeconfig", str(kubeconfig),
             "--kube-api-qps", "1000", "--kube-api-burst", "1000"],
            stdout=logs, stderr=logs,
        )  # fmt: skip
        processes.append(theirs)
        protocol = KubeletProtocol.own(ROOT)
        clients = {
            "ours": PluginClient(protocol, wait_for_file(work / "ours/registry", ".sock", ours)),
            "dra-example-driver": PluginClient(
                protocol, wait_for_file(work / "peer/registry", ".sock", theirs)
            ),
        }
        for client in clients.values():
            client.register()
        refs = {
            "ours": allocated_claims(api, "prep-ours", OURS_DRIVER, claims, shared=True),
            "dra-example-driver": allocated_claims(api, "prep-peer", PEER_DRIVER, claims, shared=False),
        }
        figures: dict[str, Any] = {}
        for callers in (1, 8):
            for name, client in clients.items():
                figures[f"{name} callers={callers}"] = measure(client, refs[name], callers)
        for client in clients.values():
            client.close()
        return figures
    finally:
        for process in processes:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        logs.close()
        for node in ("prep-ours", "prep-peer"):
            api.call("DELETE", f"/api/v1/nodes/{node}")
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
