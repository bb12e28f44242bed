#!/usr/bin/env python3
"""Benchmarks on the real control plane, side by side with kube-scheduler's own DRA allocator.

    .venv/bin/python hack/bench_cluster.py [--nodes 100] [--pods 1000] [--stream 2000] [--seed 1]
        [--only throughput,quality,prepare,unthrottled] [--unthrottled-qps 5000] [--large-nodes 500]
        [--rounds 2] [--profile-controller DIR]

One run, one cluster (``hami-dra cluster up --no-driver``, the upstream binaries of
hack/cluster/versions.env), ``--nodes`` simulated nodes (dra_driver/cluster/fakenodes.py) with
``--gpus`` simulated H100 80GB each, published as our kubelet plugin publishes them:

1. Throughput: ``--pods`` pods, each with one ResourceClaim for one GPU with a memory slice.
   (a) kube-scheduler alone: a DeviceClass of our driver, claims that tolerate the policy taint,
   no webhook, no controller of ours: kube-scheduler allocates first fit with consumable capacity.
   (b) our webhook and controller, DeviceClasses with ``binpack`` and then ``mutex,binpack``.
   A pod counts as placed when a watch sees it bound (its claim is allocated before that on both
   paths); times run from just before the pod's create call. API writes per pod come from the API
   server's ``apiserver_request_total`` before and after, per verb and resource, without the
   benchmark's own creates and the simulated nodes' Lease renewals.
2. Placement quality: the same seeded stream of ``--stream`` claims (1-4 GPUs, 4-40 GiB per GPU,
   one in ten a whole-card ``mutex`` claim) arriving and leaving on the same cluster, through
   kube-scheduler's first fit, ours with ``binpack`` and ours with ``spread``; at the end: GPUs
   left idle, pods left pending although the cluster's free cards would hold them (fragmentation),
   and free memory on partly used cards.
3. Prepare latency against a peer: hack/bench_prepare_peer.py (run by ``make bench-cluster``).
4. Unthrottled throughput, as kube-scheduler's scheduler_perf runs it: a second kube-scheduler
   (profile ``hami-bench-unthrottled``; the cluster's own default-scheduler stays up, idle for these
   pods) whose client may send ``--unthrottled-qps`` requests/s with that burst (scheduler_perf: 5000;
   the default is 50, burst 100), and the throughput pods name it in ``spec.schedulerName``; our
   controller's client has no client-side rate limit in any run. Both paths at ``--nodes`` and then
   at ``--large-nodes`` simulated nodes, ``--rounds`` times each, kube-scheduler and ours
   alternating (ours stopped, its webhook configurations removed, for kube-scheduler's runs).
   Per pod the phases as the benchmark's watches see them (create -> claim allocated -> gate
   lifted -> bound) and, per run, the CPU seconds of each component (kube-apiserver, etcd,
   kube-scheduler, our controller and webhook, the benchmark itself; before the runs at each size,
   what each burns idle per second), kube-scheduler's own client figures (requests per pod, time
   in its rate limiter: its /metrics) and the API server's own latency per write kind;
   ``--profile-controller DIR`` records our controller with py-spy (all threads, idle ones too,
   raw collapsed stacks) during our runs. Sections 1 and 4 report the same per-run figures.

``--only`` picks sections (default all four; section 1's throughput runs are ``throughput``).

Figures, not assertions. The last lines are machine-readable (issue 15's form: the throughput
ratio, idle GPUs, pending by fragmentation, then one line per node count of section 4); the whole
report is also written to build/bench-cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "hack"))

import bench_prepare_peer  # noqa: E402

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver.contract import policy_taint_key  # noqa: E402

DRIVER = DEFAULT_DRIVER_NAME
NAMESPACE = "bench"
GIB = 1024**3
PAUSE = "registry.k8s.io/pause:3.10"
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}
#: Writes that are not the allocation path's: the simulated nodes' heartbeats and what
#: kube-controller-manager writes to new Node objects.
NOT_ALLOCATION = {"leases", "nodes"}


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- objects ---------------------------------------------------------------------------------------
def device_class(name: str, policy: str | None, node_policy: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}
    if policy is not None:
        parameters = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "policy": policy}
        if node_policy:
            parameters["nodePolicy"] = node_policy
        spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": parameters}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


@dataclass(frozen=True)
class Shape:
    """What one claim asks for: ``gpus`` devices with ``memory_gib`` each, or whole cards."""

    gpus: int
    memory_gib: int  # 0: whole cards (the class's default: the card's full memory)

    @property
    def whole(self) -> bool:
        return self.memory_gib == 0


def claim_body(name: str, class_name: str, shape: Shape, tolerate_policy_taint: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": class_name, "count": shape.gpus}
    if not shape.whole:
        exactly["capacity"] = {"requests": {"memory": f"{shape.memory_gib}Gi"}}
    if tolerate_policy_taint:
        exactly["tolerations"] = [
            {"key": policy_taint_key(DRIVER), "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_body(name: str, claim: str, scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def _kube_api() -> Any:
    """dra_driver.kube.api (older commits: dra_driver.controller.kube), so that this script can
    measure an older checkout's controller (PYTHONPATH=<worktree>) for A/B comparisons."""
    try:
        from dra_driver.kube import api
    except ImportError:
        from dra_driver.controller import kube as api  # type: ignore[attr-defined,no-redef]
    return api


# --- the API ---------------------------------------------------------------------------------------
class Api:
    """The few calls the benchmark makes, without deserialising responses into client models (the
    benchmark's own CPU would otherwise compete with the components it measures)."""

    def __init__(self, api_client: Any) -> None:
        self.client = api_client
        self.kube = _kube_api().Kube(api_client, request_timeout=120)

    def call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> Any:
        return self.kube._call(method, path, query=dict(query or ()), body=body)

    def create(self, path: str, body: dict[str, Any]) -> None:
        self.call("POST", path, body)

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.call("GET", path)["items"])

    def metrics(self) -> Counter[tuple[str, str, str]]:
        """``apiserver_request_total`` writes by (verb, resource, subresource)."""
        return self.request_metrics()[0]

    def request_metrics(self) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str, str]]]:
        """Writes by (verb, resource, subresource): ``apiserver_request_total`` and the seconds the
        API server spent on them (``apiserver_request_duration_seconds_sum``: its own latency, without
        the client's)."""
        text = self.kube._call("GET", "/metrics", stream=True).data.decode()
        counts: Counter[tuple[str, str, str]] = Counter()
        seconds: Counter[tuple[str, str, str]] = Counter()
        for line in text.splitlines():
            for prefix, into in (("apiserver_request_total{", counts),
                                 ("apiserver_request_duration_seconds_sum{", seconds)):  # fmt: skip
                if not line.startswith(prefix):
                    continue
                labels_text, _, value = line.rpartition(" ")
                labels = dict(part.split("=", 1) for part in labels_text[len(prefix) : -1].split(","))
                labels = {key: raw.strip('"') for key, raw in labels.items()}
                if labels.get("verb") in WRITE_VERBS:
                    into[(labels["verb"], labels.get("resource", ""), labels.get("subresource", ""))] += (
                        float(value)
                    )
        return counts, seconds


class Watch:
    """One resource of the namespace as a watch sees it, resumed after errors (a 410 or a dropped
    connection: listed again). Subclasses record what they need in ``seen`` (under the watch's
    clock: ``time.perf_counter()`` when the event arrived)."""

    resource_name = ""
    path = ""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.objects: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._version = self._relist()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def seen(self, name: str, obj: dict[str, Any], now: float) -> None:
        pass

    def _relist(self) -> str:
        listing = self.api.call("GET", self.path)
        self.objects = {obj["metadata"]["name"]: obj for obj in listing["items"]}
        now = time.perf_counter()
        for name, obj in self.objects.items():
            self.seen(name, obj, now)
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        resource = getattr(_kube_api(), self.resource_name)
        while not self._stop.is_set():
            try:
                for event in self.api.kube.watch(resource, self._version, timeout_seconds=60):
                    self._event(event)
                    if self._stop.is_set():
                        return
            except Exception as err:  # a 410 (too old) or a dropped connection: list again
                log(f"{self.resource_name.lower()} watch: {err}; relisting")
                self._version = self._relist()

    def _event(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        self._version = obj["metadata"].get("resourceVersion", self._version)
        if event["type"] == "BOOKMARK" or obj["metadata"].get("namespace") != NAMESPACE:
            return
        name = obj["metadata"]["name"]
        if event["type"] == "DELETED":
            self.objects.pop(name, None)
            return
        self.objects[name] = obj
        self.seen(name, obj, time.perf_counter())

    def stop(self) -> None:
        self._stop.set()


class PodWatch(Watch):
    """The namespace's pods, when each was first seen bound and (gated pods) first seen ungated.

    A pod is *settled* once it is bound or its allocator says it does not fit now: kube-scheduler's
    ``PodScheduled=False`` with reason ``Unschedulable``, or our controller's
    ``gpu.hami.io/Allocated=False``. A gated pod (``SchedulingGated``) is not settled: our
    controller has not decided yet.
    """

    resource_name = "PODS"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"

    def __init__(self, api: Api) -> None:
        self.bound: dict[str, float] = {}
        self.gated: set[str] = set()
        self.ungated: dict[str, float] = {}
        super().__init__(api)

    @property
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.objects

    def seen(self, name: str, pod: dict[str, Any], now: float) -> None:
        if pod["spec"].get("schedulingGates"):
            self.gated.add(name)
        elif name in self.gated:
            self.ungated.setdefault(name, now)
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, now)

    def settled(self, name: str) -> bool:
        pod = self.pods.get(name)
        if pod is None:
            return False
        if pod["spec"].get("nodeName"):
            return True
        for condition in pod.get("status", {}).get("conditions") or ():
            if condition.get("status") != "False":
                continue
            if condition.get("type") == "gpu.hami.io/Allocated":
                return True
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return True
        return False


class ClaimWatch(Watch):
    """When each claim of the namespace was first seen with a finalizer and with its allocation."""

    resource_name = "RESOURCE_CLAIMS"
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"

    def __init__(self, api: Api) -> None:
        self.finalized: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        super().__init__(api)

    def seen(self, name: str, claim: dict[str, Any], now: float) -> None:
        if claim["metadata"].get("finalizers"):
            self.finalized.setdefault(name, now)
        if (claim.get("status") or {}).get("allocation"):
            self.allocated.setdefault(name, now)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f}s: {what}")
        time.sleep(poll)


def parallel(action: Callable[[Any], None], items: list[Any], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


def reset_namespace(api: Api, timeout: float = 300) -> None:
    """Delete every pod (at once: nothing runs them) and claim of the namespace; wait until gone."""
    api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods", query=[("gracePeriodSeconds", "0")])
    api.call("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
    wait_until(
        lambda: (
            not api.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
            and not api.items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        ),
        timeout,
        "every benchmark pod and claim deleted",
        poll=0.5,
    )


# --- 1. throughput ---------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds each named process spent between ``start`` and ``stop``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._before = {name: cpu_seconds(pid) for name, pid in pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pid) - self._before[name], 2) for name, pid in self.pids.items()}


class SchedulerClient:
    """kube-scheduler's own client figures from its /metrics (``rest_client_*``): requests by method
    and the time its client-side rate limiter held them back. Read with the admin certificate."""

    def __init__(self, port: int, cert: Path, key: Path) -> None:
        import ssl

        self.url = f"https://127.0.0.1:{port}/metrics"
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE
        self.context.load_cert_chain(str(cert), str(key))

    def read(self) -> Counter[str]:
        import urllib.request

        figures: Counter[str] = Counter()
        try:
            with urllib.request.urlopen(self.url, timeout=10, context=self.context) as response:
                text = response.read().decode()
        except OSError as err:
            log(f"kube-scheduler metrics: {err}")
            return figures
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("rest_client_requests_total{"):
                method = re.search(r'method="([A-Z]+)"', name)
                figures[f"requests {method.group(1) if method else '?'}"] += float(value)
            elif name.startswith("rest_client_rate_limiter_duration_seconds_sum"):
                figures["rate limiter wait s"] += float(value)
            elif name.startswith("rest_client_rate_limiter_duration_seconds_count"):
                figures["rate limited requests"] += float(value)
        return figures


def py_spy() -> str | None:
    """py-spy beside this interpreter (pip install py-spy into the venv) or on PATH."""
    return shutil.which(
        "py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )


class PySpy:
    """py-spy recording one process (all threads, idle ones too: raw collapsed stacks) until ``stop``."""

    def __init__(self, pid: int, out: Path) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.process = subprocess.Popen(
            [py_spy() or "py-spy", "record", "--pid", str(pid), "--rate", "100", "--nonblocking",
             "--threads", "--idle", "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        log(f"controller profile: {self.out}")


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(percentile(values, 0.5), 3), "p99_s": round(percentile(values, 0.99), 3)}


@dataclass
class Throughput:
    label: str
    pods: int
    seconds: float
    p50: float
    p99: float
    writes: dict[str, float] = field(default_factory=dict)
    #: create -> claim allocated -> gate lifted (ours) -> bound, p50/p99 of each step per pod
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    #: seconds from the first create until the last claim was allocated / the last gate lifted
    allocated_by: float = 0.0
    ungated_by: float = 0.0
    #: CPU seconds per component over the run (create to last bound)
    cpu: dict[str, float] = field(default_factory=dict)
    scheduler: str = "default-scheduler"
    #: kube-scheduler's client over the run: requests per pod by method, rate-limiter wait
    scheduler_client: dict[str, float] = field(default_factory=dict)
    #: the API server's own mean latency (ms) per write kind over the run
    server_ms: dict[str, float] = field(default_factory=dict)

    @property
    def pods_per_second(self) -> float:
        return self.pods / self.seconds

    def row(self) -> str:
        per_pod = sum(self.writes.values())
        return (
            f"{self.label:<40} {self.pods_per_second:8.1f} pods/s   p50 {self.p50 * 1000:7.0f} ms   "
            f"p99 {self.p99 * 1000:7.0f} ms   {per_pod:4.1f} writes/pod"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "scheduler": self.scheduler, "pods": self.pods,
            "seconds": round(self.seconds, 2), "pods_per_second": round(self.pods_per_second, 2),
            "p50_s": round(self.p50, 3), "p99_s": round(self.p99, 3),
            "writes_per_pod": {k: round(v, 2) for k, v in sorted(self.writes.items())},
            "phases": self.phases, "allocated_by_s": round(self.allocated_by, 2),
            "ungated_by_s": round(self.ungated_by, 2), "cpu_s": self.cpu,
            "scheduler_client": self.scheduler_client, "server_ms": self.server_ms,
        }  # fmt: skip

    def phase_row(self) -> str:
        steps = ", ".join(
            f"{step} p50 {v['p50_s']:.2f} s p99 {v['p99_s']:.2f} s" for step, v in self.phases.items()
        )
        last = f"last allocation at {self.allocated_by:.1f} s"
        if self.ungated_by:
            last += f", last gate lifted at {self.ungated_by:.1f} s"
        return f"{self.label:<40} {steps}; {last}, last bound at {self.seconds:.1f} s"

    def cpu_row(self) -> str:
        return f"{self.label:<40} " + ", ".join(f"{name} {sec:.1f}" for name, sec in self.cpu.items())

    def scheduler_row(self) -> str:
        return f"{self.label:<40} " + ", ".join(f"{k} {v:g}" for k, v in self.scheduler_client.items())


def throughput(
    api: Api,
    label: str,
    class_name: str,
    pods: int,
    tolerate: bool,
    memory_gib: int,
    *,
    scheduler: str | None = None,
    pids: dict[str, int] | None = None,
    profile: tuple[int, Path] | None = None,
    scheduler_client: SchedulerClient | None = None,
) -> Throughput:
    """``pods`` pods with one claim each, created at once; until every one is bound. ``scheduler``:
    the pods' ``spec.schedulerName``; ``pids``: processes whose CPU is measured over the run;
    ``profile``: (pid, output) to record with py-spy over the run; ``scheduler_client``: the
    kube-scheduler whose client figures are read before and after."""
    log(f"throughput {label}: {pods} claims")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    shape = Shape(1, memory_gib)
    parallel(
        lambda i: api.create(claims, claim_body(f"c-{i}", class_name, shape, tolerate)), list(range(pods))
    )
    watch, claim_watch = PodWatch(api), ClaimWatch(api)
    before, seconds_before = api.request_metrics()
    created: dict[str, float] = {}

    def create(i: int) -> None:
        created[f"p-{i}"] = time.perf_counter()
        api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(f"p-{i}", f"c-{i}", scheduler))

    log(f"throughput {label}: {pods} pods")
    meter = CpuMeter({**(pids or {}), "benchmark": os.getpid()})
    client_before = scheduler_client.read() if scheduler_client is not None else Counter()
    spy = PySpy(*profile) if profile is not None else None
    try:
        parallel(create, list(range(pods)))
        wait_until(lambda: len(watch.bound) >= pods, 900, f"{pods} pods bound ({label})", poll=0.2)
    finally:
        if spy is not None:
            spy.stop()
    cpu = meter.stop()
    client_after = scheduler_client.read() if scheduler_client is not None else Counter()
    client = {
        (k if k.endswith(" s") else f"{k} per pod"): round(
            (v - client_before[k]) / (1 if k.endswith(" s") else pods), 2
        )
        for k, v in sorted(client_after.items())
        if v - client_before[k] > 0
    }
    watch.stop()
    claim_watch.stop()
    after, seconds_after = api.request_metrics()
    allocated = [c for c in api.items(claims) if (c.get("status") or {}).get("allocation")]
    if len(allocated) != pods:
        raise RuntimeError(
            f"{label}: {len(allocated)} of {pods} claims allocated although every pod is bound"
        )
    start, end = min(created.values()), max(watch.bound.values())
    latencies = [watch.bound[name] - created[name] for name in created]
    # The steps of each pod as the watches saw them (a watch event's arrival, so each step includes
    # its delivery; the same for every step and both paths).
    claim_of = {f"p-{i}": f"c-{i}" for i in range(pods)}
    allocated_at = {
        pod: claim_watch.allocated.get(claim, watch.bound[pod]) for pod, claim in claim_of.items()
    }
    phases = {"create->allocated": summary([allocated_at[p] - created[p] for p in created])}
    if watch.ungated:
        phases["allocated->ungated"] = summary(
            [watch.ungated.get(p, watch.bound[p]) - allocated_at[p] for p in created]
        )
        phases["ungated->bound"] = summary(
            [watch.bound[p] - watch.ungated.get(p, watch.bound[p]) for p in created]
        )
    else:
        phases["allocated->bound"] = summary([watch.bound[p] - allocated_at[p] for p in created])
    writes = after - before
    # The API server's own mean latency per write kind over the run (ms), beside what our writers see.
    server_ms = {
        f"{verb} {resource}{'/' + sub if sub else ''}": round(
            1000 * (seconds_after[key] - seconds_before[key]) / (after[key] - before[key]), 1
        )
        for key in after
        for verb, resource, sub in [key]
        if resource not in NOT_ALLOCATION and after[key] - before[key] >= pods / 2
    }
    own = {("POST", "pods", ""): pods}  # the benchmark's creates (claims were created before `before`)
    per_pod: dict[str, float] = {}
    for (verb, resource, sub), count in writes.items():
        if resource in NOT_ALLOCATION:
            continue
        count -= own.get((verb, resource, sub), 0)
        if count > 0:
            per_pod[f"{verb} {resource}{'/' + sub if sub else ''}"] = count / pods
    result = Throughput(
        label, pods, end - start, percentile(latencies, 0.5), percentile(latencies, 0.99), per_pod,
        phases=phases,
        allocated_by=max(allocated_at.values()) - start,
        ungated_by=(max(watch.ungated.values()) - start) if watch.ungated else 0.0,
        cpu=cpu, scheduler=scheduler or "default-scheduler", scheduler_client=client, server_ms=server_ms,
    )  # fmt: skip
    log(result.row())
    log(result.phase_row())
    log(result.cpu_row())
    if client:
        log(result.scheduler_row())
    log(
        f"{label:<40} API server latency (ms): "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(server_ms.items()))
    )
    reset_namespace(api)
    return result


# --- 2. placement quality --------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    index: int
    shape: Shape
    leaves_after: int  # the arrival index after which this claim leaves


def make_stream(count: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    stream = []
    for index in range(count):
        if rng.random() < 0.1:
            shape = Shape(rng.choice((1, 1, 2)), 0)
        else:
            gpus = rng.choices((1, 2, 3, 4), weights=(50, 25, 10, 15))[0]
            shape = Shape(gpus, rng.randrange(4, 41, 4))
        stream.append(Arrival(index, shape, index + rng.randint(600, 1600)))
    return stream


@dataclass
class Quality:
    label: str
    idle_gpus: int
    pending: int
    pending_fragmentation: int
    stranded_gib: float
    placed: int

    def row(self) -> str:
        return (
            f"{self.label:<16} idle GPUs {self.idle_gpus:4d}   pending {self.pending:4d} "
            f"(fragmentation {self.pending_fragmentation:3d})   free memory on partly used cards "
            f"{self.stranded_gib / 1024:6.2f} TiB   placed {self.placed}"
        )


@dataclass
class Card:
    """What is left of one GPU at the end of a stream."""

    memory: int  # bytes the card has
    free: int  # bytes not consumed by any allocation
    sharers: int = 0
    whole: bool = False  # some allocation holds all of it

    @property
    def idle(self) -> bool:
        return self.sharers == 0

    def takes(self, shape: Shape) -> bool:
        if shape.whole:
            return self.idle
        return not self.whole and self.sharers < SLOTS and self.free >= shape.memory_gib * GIB


#: Tenants one simulated card admits (its ``slots`` capacity: dra_driver/devices/model.py).
SLOTS = 10


def cards_after(api: Api, card_memory: dict[tuple[str, str], int]) -> dict[tuple[str, str], Card]:
    """Every card (pool, device) with what the namespace's allocated claims consume of it."""
    from dra_driver.quantity import parse_bytes

    cards = {key: Card(memory, memory) for key, memory in card_memory.items()}
    for claim in api.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"):
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            card = cards[(result["pool"], result["device"])]
            card.sharers += 1
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            used = card.memory if consumed is None else parse_bytes(consumed)
            card.free -= used
            card.whole = card.whole or used >= card.memory
    return cards


def quality(api: Api, label: str, classes: dict[bool, str], stream: list[Arrival], tolerate: bool,
            card_memory: dict[tuple[str, str], int], step: int = 100) -> Quality:  # fmt: skip
    log(f"stream {label}: {len(stream)} claims")
    watch = PodWatch(api)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    live: dict[str, Arrival] = {}

    def arrive(arrival: Arrival) -> None:
        name = f"s-{arrival.index}"
        api.create(claims, claim_body(name, classes[arrival.shape.whole], arrival.shape, tolerate))
        api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(name, name))

    def leave(name: str) -> None:
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", query=[("gracePeriodSeconds", "0")])
        api.call("DELETE", f"{claims}/{name}")

    for begin in range(0, len(stream), step):
        batch = stream[begin : begin + step]
        last = batch[-1].index
        leaving = [name for name, arrival in live.items() if arrival.leaves_after <= last]
        for name in leaving:
            del live[name]
        parallel(leave, leaving)
        parallel(arrive, batch)
        live.update({f"s-{arrival.index}": arrival for arrival in batch})
        names = [f"s-{arrival.index}" for arrival in batch]
        wait_until(
            lambda names=names: all(watch.settled(n) for n in names),  # type: ignore[misc]
            600,
            f"stream {label}: arrivals {begin}-{last} placed or reported unschedulable",
            poll=0.2,
        )
    wait_until(lambda: all(watch.settled(n) for n in live), 600, f"stream {label}: every live pod settled")

    # Let retries after the last departures finish: until the bound count stays put for 15 s.
    def bound_now() -> int:
        return sum(1 for n in live if n in watch.bound)

    stable_since, seen = time.monotonic(), bound_now()
    while time.monotonic() - stable_since < 15:
        time.sleep(0.5)
        if bound_now() != seen:
            stable_since, seen = time.monotonic(), bound_now()
    watch.stop()
    pods = {p["metadata"]["name"]: p for p in api.items(f"/api/v1/namespaces/{NAMESPACE}/pods")}
    pending = [name for name in live if not pods.get(name, {}).get("spec", {}).get("nodeName")]
    cards = cards_after(api, card_memory)
    idle = sum(1 for card in cards.values() if card.idle)
    partly = sum(card.free for card in cards.values() if not card.idle and not card.whole)
    fragmentation = sum(1 for name in pending if fits_cluster_not_node(live[name].shape, cards))
    result = Quality(label, idle, len(pending), fragmentation, partly / GIB, len(live) - len(pending))
    log(result.row())
    reset_namespace(api)
    return result


def fits_cluster_not_node(shape: Shape, cards: dict[tuple[str, str], Card]) -> bool:
    """Pending by fragmentation: enough suitable cards are free in the cluster, just not on one node."""
    per_node: Counter[str] = Counter(pool for (pool, _), card in cards.items() if card.takes(shape))
    return sum(per_node.values()) >= shape.gpus and max(per_node.values(), default=0) < shape.gpus


# --- the run ---------------------------------------------------------------------------------------
#: (label, card policy chain, node policy) of our classes; whole-card claims get the mutex variant.
OUR_STREAM_POLICIES = (("binpack", "binpack", "binpack"), ("spread", "spread", "spread"))


def create_classes(api: Api, classes: list[dict[str, Any]]) -> None:
    for body in classes:
        api.create("/apis/resource.k8s.io/v1/deviceclasses", body)


def delete_classes(api: Api, names: list[str]) -> None:
    for name in names:
        api.call("DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")


#: What ``--only`` picks from.
SECTIONS = ("throughput", "quality", "prepare", "unthrottled")
#: The unthrottled kube-scheduler's profile (the throughput pods of section 4 name it).
UNTHROTTLED = "hami-bench-unthrottled"
UNTHROTTLED_PORT = 10269
#: kube-scheduler's own default client rate (KubeSchedulerConfiguration clientConnection).
DEFAULT_SCHEDULER_QPS, DEFAULT_SCHEDULER_BURST = 50, 100
#: How long the idle CPU of the components is measured before section 4's runs at each size.
IDLE_SECONDS = 15.0
#: The kube-scheduler-side components whose CPU every throughput run reports.
CLUSTER_COMPONENTS = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager")


def cluster_pids(layout: Any) -> dict[str, int]:
    """The running cluster's control-plane pids (``hami-dra cluster up`` records them)."""
    state = json.loads(layout.state_file.read_text())
    return {c["name"]: int(c["pid"]) for c in state["components"] if c["name"] in CLUSTER_COMPONENTS}


def scheduler_client(layout: Any, port: int) -> SchedulerClient:
    return SchedulerClient(port, layout.pki / "admin.crt", layout.pki / "admin.key")


def scheduler_config(kubeconfig: Path, qps: float) -> dict[str, Any]:
    """kube-scheduler's configuration as scheduler_perf runs it: its client at ``qps`` with that
    burst, one default profile named UNTHROTTLED, no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": int(qps)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": UNTHROTTLED}],
    }


def start_unthrottled_scheduler(toolchain: Any, layout: Any, qps: float) -> Any:
    """A second kube-scheduler (the cluster's binary, its identity, its feature gates) with its
    client at ``qps``; the cluster's own default-scheduler keeps running (these pods are not its)."""
    from dra_driver.cluster.configs import FEATURE_GATES
    from dra_driver.cluster.processes import HostProcess, Probe

    kubeconfig = layout.kubeconfig("scheduler")
    config = layout.root / "bench-unthrottled-scheduler.json"  # JSON is YAML
    config.write_text(json.dumps(scheduler_config(kubeconfig, qps), indent=2) + "\n")
    process = HostProcess(
        "kube-scheduler-unthrottled",
        [str(toolchain.path("kube-scheduler")), f"--config={config}",
         f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
         "--bind-address=127.0.0.1", f"--secure-port={UNTHROTTLED_PORT}",
         f"--feature-gates={FEATURE_GATES}", "--v=2"],
        layout.logs,
        probe=Probe(f"https://127.0.0.1:{UNTHROTTLED_PORT}/healthz"),
    )  # fmt: skip
    process.wait_ready(60)
    log(f"kube-scheduler with its client at {qps:g} requests/s (burst {int(qps)}) ready (pid {process.pid})")
    return process


class Ours:
    """Our webhook and controller, started and stopped between kube-scheduler's runs. Stopped, their
    webhook configurations go too (their failurePolicy is Fail: nothing could be created)."""

    def __init__(self, layout: Any, api_client: Any, api: Api, source: Path | None = None) -> None:
        self.layout, self.api_client, self.api = layout, api_client, api
        #: Another checkout whose webhook and controller run instead of this one's (--ours-before).
        self.source = source
        self.processes: list[Any] = []
        #: More ``hami-dra controller`` flags (--controller-args).
        self.controller_args: list[str] = []

    def start(self) -> None:
        from dra_driver.cluster.driver import DriverOptions, start_driver
        from dra_driver.cluster.pki import ClusterPki

        log(f"starting our webhook and controller{f' from {self.source}' if self.source else ''}")
        saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
        if self.source is not None:  # the children import dra_driver from there ("-c" puts cwd first)
            os.environ["PYTHONPATH"] = str(self.source)
            os.chdir(self.source)
        try:
            options = DriverOptions(plugin=False, controller_args=tuple(self.controller_args))
            self.processes = start_driver(self.layout, ClusterPki(self.layout.pki), self.api_client, options)
            if self.source is not None:
                where = {p.name: os.readlink(f"/proc/{p.pid}/cwd") for p in self.processes}
                log(f"running from: {where}")
        finally:
            os.chdir(cwd)
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved

    @property
    def running(self) -> bool:
        return bool(self.processes)

    def pids(self) -> dict[str, int]:
        return {f"ours {p.name}": p.pid for p in self.processes}

    def stop(self) -> None:
        if not self.processes:
            return
        log("stopping our webhook and controller")
        for process in reversed(self.processes):
            process.stop()
        self.processes = []
        kinds = ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
        # The claim finalizer's MutatingAdmissionPolicy (1.36+): kube-scheduler's claims of
        # first-fit.bench (a class of our driver) must not get a finalizer nobody removes.
        kinds += ["mutatingadmissionpolicybindings", "mutatingadmissionpolicies"]
        for kind in kinds:
            try:
                self.api.call("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/hami-dra")
            except Exception as err:  # already gone (or no such API: before 1.36)
                log(f"deleting {kind}/hami-dra: {err}")


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated figures."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}  # fmt: skip


def unthrottled_summary(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node count: pods/s of each path over the rounds (median, min, max) and ours /
    kube-scheduler, as the ratio of the medians and per round (each round's runs back to back)."""
    rows = []
    for nodes in sorted({e["nodes"] for e in entries}):
        at = [e for e in entries if e["nodes"] == nodes and e["path"] != "idle"]
        by_path: dict[str, dict[int, float]] = {}
        for e in at:
            by_path.setdefault(e["path"], {})[e["round"]] = e["result"]["pods_per_second"]
        first_fit = by_path.get("kube-scheduler", {})
        row: dict[str, Any] = {"nodes": nodes, "pods_per_second": {}, "ratio": {}}
        for path, per_round in by_path.items():
            row["pods_per_second"][path] = spread(list(per_round.values()))
            if path == "kube-scheduler" or not first_fit:
                continue
            rounds = [per_round[r] / first_fit[r] for r in per_round if r in first_fit]
            medians = statistics.median(per_round.values()) / statistics.median(first_fit.values())
            row["ratio"][path] = {"of_medians": round(medians, 2), "per_round": [round(r, 2) for r in rounds]}
        rows.append(row)
    return rows


def run(args: argparse.Namespace, api_client: Any, state_dir: Path, toolchain: Any) -> dict[str, Any]:
    from dra_driver.cluster.fakenodes import FakeNodes, FakeNodeSpec
    from dra_driver.cluster.layout import Layout
    from dra_driver.devices.simulated import profile_gpus

    sections = set(args.only)
    api = Api(api_client)
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    accounts = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
    wait_until(
        lambda: any(sa["metadata"]["name"] == "default" for sa in api.items(accounts)),
        60, "the namespace's default service account",
    )  # fmt: skip
    spec = FakeNodeSpec(args.nodes, args.gpus, args.profile)
    log(f"creating {args.nodes} simulated nodes x {args.gpus} {args.profile}")
    all_nodes = [FakeNodes(api_client, spec)]
    all_nodes[0].create()
    card_memory = {
        (name, gpu.name): (gpu.memory_bytes // 2**20) * 2**20
        for name in all_nodes[0].names
        for gpu in profile_gpus(args.profile, node_name=name, gpus=args.gpus)
    }
    stream = make_stream(args.stream, args.seed)
    report: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus, "profile": args.profile,
                              "pods": args.pods, "stream": args.stream, "seed": args.seed,
                              "sections": sorted(sections)}  # fmt: skip
    mutex_pods = min(args.pods, args.nodes * args.gpus)  # a mutex pod needs an idle card of its own
    layout = Layout(state_dir)
    pids = cluster_pids(layout)
    default_client = scheduler_client(layout, layout.ports.scheduler)
    runs: list[Throughput] = []
    qualities: list[Quality] = []
    prepare: dict[str, Any] = {}
    unthrottled: list[dict[str, Any]] = []
    ours_classes = [
        device_class("binpack.bench", "binpack", "binpack"),
        device_class("mutex-binpack.bench", "mutex,binpack", "binpack"),
        device_class("spread.bench", "spread", "spread"),
        device_class("mutex-spread.bench", "mutex,spread", "spread"),
    ]

    # (a) kube-scheduler alone: no webhook, no controller of ours.
    create_classes(api, [device_class("first-fit.bench", None, None)])
    if "throughput" in sections:
        runs.append(throughput(api, "kube-scheduler (first fit)", "first-fit.bench", args.pods, True,
                               args.memory_gib, pids=pids, scheduler_client=default_client))  # fmt: skip
    if "quality" in sections:
        qualities.append(quality(api, "kube-scheduler", {False: "first-fit.bench", True: "first-fit.bench"},
                                 stream, True, card_memory))  # fmt: skip

    ours = Ours(layout, api_client, api)
    ours.controller_args = args.controller_args
    before_runs: list[Throughput] = []
    scheduler = None
    try:
        # (b) our webhook and controller.
        if sections & {"throughput", "quality", "prepare"}:
            ours.start()
            create_classes(api, ours_classes)
        if "throughput" in sections:
            runs.append(throughput(api, "ours binpack", "binpack.bench", args.pods, False, args.memory_gib,
                                   pids={**pids, **ours.pids()},
                                   scheduler_client=default_client))  # fmt: skip
            runs.append(throughput(api, "ours mutex,binpack", "mutex-binpack.bench", mutex_pods, False,
                                   args.memory_gib, pids={**pids, **ours.pids()},
                                   scheduler_client=default_client))  # fmt: skip
            if args.ours_before is not None:
                before = Ours(layout, api_client, api, args.ours_before)
                before_runs = throughput_before(args, api, before, ours, pids, mutex_pods, default_client)
        if "quality" in sections:
            for label, _, _ in OUR_STREAM_POLICIES:
                classes = {False: f"{label}.bench", True: f"mutex-{label}.bench"}
                qualities.append(quality(api, f"ours {label}", classes, stream, False, card_memory))
        if "prepare" in sections:
            log("prepare latency: our kubelet plugin and dra-example-driver's")
            prepare = bench_prepare_peer.compare(api, layout.admin_kubeconfig, layout.root / "bench-prepare")

        # (c) both paths with kube-scheduler's client unthrottled, at --nodes and --large-nodes.
        if "unthrottled" in sections:
            scheduler = start_unthrottled_scheduler(toolchain, layout, args.unthrottled_qps)
            sizes = [args.nodes] + ([args.large_nodes] if args.large_nodes > args.nodes else [])
            for nodes in sizes:
                have = sum(len(n.names) for n in all_nodes)
                if nodes > have:
                    log(f"adding {nodes - have} simulated nodes ({nodes} in all)")
                    more = FakeNodes(
                        api_client, FakeNodeSpec(nodes - have, args.gpus, args.profile, prefix="simx")
                    )
                    all_nodes.append(more)
                    more.create()
                unthrottled += unthrottled_rounds(args, api, ours, scheduler, pids, ours_classes, nodes)
    finally:
        ours.stop()
        if scheduler is not None:
            scheduler.stop()
    for nodes_ in reversed(all_nodes):
        nodes_.delete()
    runs += before_runs
    report["throughput"] = [r.as_dict() for r in runs]
    report["quality"] = [q.__dict__ for q in qualities]
    report["prepare"] = prepare
    if unthrottled:
        report["unthrottled"] = {
            "scheduler_qps": args.unthrottled_qps,
            "scheduler_burst": int(args.unthrottled_qps),
            "runs": unthrottled,
            "summary": unthrottled_summary(unthrottled),
        }
    report["lines"] = print_summary(args, report, runs, qualities, prepare, mutex_pods)
    return report


def throughput_before(
    args: argparse.Namespace, api: Api, before: Ours, ours: Ours, pids: dict[str, int], mutex_pods: int,
    scheduler_client: Any,
) -> list[Throughput]:  # fmt: skip
    """Section 1's two runs of ours again with the webhook and controller of ``--ours-before`` (the
    same cluster, nodes and client, right after this checkout's runs), then this checkout's again."""
    ours.stop()
    before.start()
    try:
        return [
            throughput(api, "ours-before binpack", "binpack.bench", args.pods, False, args.memory_gib,
                       pids={**pids, **before.pids()}, scheduler_client=scheduler_client),
            throughput(api, "ours-before mutex,binpack", "mutex-binpack.bench", mutex_pods, False,
                       args.memory_gib, pids={**pids, **before.pids()}, scheduler_client=scheduler_client),
        ]  # fmt: skip
    finally:
        before.stop()
        ours.start()


def unthrottled_rounds(
    args: argparse.Namespace, api: Api, ours: Ours, scheduler: Any, pids: dict[str, int],
    ours_classes: list[dict[str, Any]], nodes: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """``args.rounds`` rounds of kube-scheduler alone, ours binpack and ours mutex,binpack, in
    alternating order (ABBA: kube-scheduler first in even rounds, last in odd ones), so that a
    drift of the machine over the rounds weighs on both paths alike. First the components' CPU
    per second while nothing is created (lease renewals, resyncs, watches): the part of each
    run's CPU that is the run's length, not its pods."""
    entries: list[dict[str, Any]] = []
    mutex_pods = min(args.pods, nodes * args.gpus)
    scheduler_pids = {**pids, "kube-scheduler (unthrottled)": scheduler.pid}
    client = scheduler_client(ours.layout, UNTHROTTLED_PORT)

    def first_fit(round_: int) -> None:
        ours.stop()
        result = throughput(api, f"kube-scheduler unthrottled, {nodes} nodes", "first-fit.bench", args.pods,
                            True, args.memory_gib, scheduler=UNTHROTTLED, pids=scheduler_pids,
                            scheduler_client=client)  # fmt: skip
        entries.append(
            {"nodes": nodes, "round": round_, "path": "kube-scheduler", "result": result.as_dict()}
        )

    def ours_runs(round_: int) -> None:
        if not ours.running:
            ours.start()
            create_classes_once(api, ours_classes)
        ours_paths = (
            ("ours binpack", "binpack.bench", args.pods),
            ("ours mutex,binpack", "mutex-binpack.bench", mutex_pods),
        )
        for path, class_name, pods in ours_paths:
            profile = None
            if args.profile_controller is not None:
                name = f"{path.replace(' ', '-').replace(',', '+')}-{nodes}nodes-round{round_}.txt"
                profile = (ours.processes[1].pid, args.profile_controller / name)
            result = throughput(
                api, f"{path} unthrottled, {nodes} nodes", class_name, pods, False, args.memory_gib,
                scheduler=UNTHROTTLED, pids={**scheduler_pids, **ours.pids()}, profile=profile,
                scheduler_client=client,
            )  # fmt: skip
            entries.append({"nodes": nodes, "round": round_, "path": path, "result": result.as_dict()})

    ours.stop()
    log(f"idle CPU at {nodes} nodes ({IDLE_SECONDS:g} s, nothing created)")
    meter = CpuMeter({**scheduler_pids, "benchmark": os.getpid()})
    time.sleep(IDLE_SECONDS)
    idle = {name: round(sec / IDLE_SECONDS, 3) for name, sec in meter.stop().items()}
    entries.append({"nodes": nodes, "path": "idle", "cpu_per_s": idle})
    for round_ in range(args.rounds):
        if round_ % 2 == 0:
            first_fit(round_)
            ours_runs(round_)
        else:
            ours_runs(round_)
            first_fit(round_)
    return entries


def create_classes_once(api: Api, classes: list[dict[str, Any]]) -> None:
    """Create the classes that do not exist yet."""
    have = {c["metadata"]["name"] for c in api.items("/apis/resource.k8s.io/v1/deviceclasses")}
    create_classes(api, [body for body in classes if body["metadata"]["name"] not in have])


def print_summary(
    args: argparse.Namespace, report: dict[str, Any], runs: list[Throughput], qualities: list[Quality],
    prepare: dict[str, Any], mutex_pods: int,
) -> list[str]:  # fmt: skip
    """Print the human summary; return the machine-readable lines."""
    lines: list[str] = []
    print()
    sizes = f"{args.nodes} nodes x {args.gpus} GPUs"
    if runs:
        print(f"Throughput: {args.pods} pods, one claim each (1 GPU, {args.memory_gib} GiB), {sizes} "
              f"(mutex,binpack: {mutex_pods} pods, one idle card each); kube-scheduler's client at its "
              f"default {DEFAULT_SCHEDULER_QPS} requests/s, burst {DEFAULT_SCHEDULER_BURST}")  # fmt: skip
        for r in runs:
            print(f"  {r.row()}")
        print("API writes per pod (without the benchmark's pod creates and node heartbeats):")
        for r in runs:
            print(f"  {r.label:<40} " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.writes.items())))
        print("Steps per pod (as the benchmark's watches see them):")
        for r in runs:
            print(f"  {r.phase_row()}")
        print("CPU seconds per component over each run:")
        for r in runs:
            print(f"  {r.cpu_row()}")
        print("kube-scheduler's client (its /metrics rest_client_*): requests per pod, rate-limiter wait:")
        for r in runs:
            print(f"  {r.scheduler_row()}")
        print("The API server's own mean latency per write (ms):")
        for r in runs:
            print(f"  {r.label:<40} " + ", ".join(f"{k} {v:g}" for k, v in sorted(r.server_ms.items())))
    if len(runs) in (3, 5):
        first_fit, binpack, mutex = (r.pods_per_second for r in runs[:3])
        lines.append(
            f"throughput ratio ours/kube-scheduler: {binpack / first_fit:.2f} (binpack), "
            f"{mutex / first_fit:.2f} (mutex,binpack)"
        )
    if len(runs) == 5:
        old_binpack, old_mutex = (r.pods_per_second for r in runs[3:])
        lines.append(
            f"throughput ours/ours-before: {binpack / old_binpack:.2f} (binpack), "
            f"{mutex / old_mutex:.2f} (mutex,binpack); before/kube-scheduler {old_binpack / first_fit:.2f}, "
            f"{old_mutex / first_fit:.2f}"
        )
    if len(qualities) == 3:
        print(f"Placement quality: {args.stream} claims arriving and leaving (seed {args.seed})")
        for q in qualities:
            print(f"  {q.row()}")
        ff, bp, sp = qualities
        lines.append(f"idle GPUs after the stream: kube-scheduler {ff.idle_gpus}, "
                     f"binpack {bp.idle_gpus}, spread {sp.idle_gpus}")  # fmt: skip
        lines.append(f"pending by fragmentation: kube-scheduler {ff.pending_fragmentation}, "
                     f"binpack {bp.pending_fragmentation}, spread {sp.pending_fragmentation}")  # fmt: skip
    if prepare:
        print("NodePrepareResources (one client playing kubelet, the same claims, 8 per round):")
        if "skipped" in prepare:
            print(f"  skipped: {prepare['skipped']}")
        else:
            for callers in (1, 8):
                ours, peer = (
                    prepare[f"ours callers={callers}"],
                    prepare[f"dra-example-driver callers={callers}"],
                )
                print(f"  {callers} caller(s): ours p50 {ours['p50_ms']:.1f} ms p99 {ours['p99_ms']:.1f} ms, "
                      f"dra-example-driver p50 {peer['p50_ms']:.1f} ms p99 {peer['p99_ms']:.1f} ms, "
                      f"ratio ours/peer p50 {ours['p50_ms'] / peer['p50_ms']:.2f}")  # fmt: skip
    if "unthrottled" in report:
        idle = [e for e in report["unthrottled"]["runs"] if e["path"] == "idle"]
        entries = [e for e in report["unthrottled"]["runs"] if e["path"] != "idle"]
        print(f"Unthrottled (kube-scheduler's client at {args.unthrottled_qps:g} requests/s, burst "
              f"{int(args.unthrottled_qps)}, as scheduler_perf; ours has no client-side limit), "
              f"{args.rounds} round(s), kube-scheduler and ours alternating:")  # fmt: skip
        for e in entries:
            result = e["result"]
            print(f"  round {e['round']} {result['label']:<44} {result['pods_per_second']:8.1f} pods/s   "
                  f"p50 {result['p50_s'] * 1000:7.0f} ms   p99 {result['p99_s'] * 1000:7.0f} ms   "
                  f"{sum(result['writes_per_pod'].values()):4.1f} writes/pod")  # fmt: skip
        print("  steps per pod:")
        for e in entries:
            result = e["result"]
            steps = ", ".join(f"{k} p50 {v['p50_s']:.2f} s" for k, v in result["phases"].items())
            print(f"    round {e['round']} {result['label']:<44} {steps}; last allocation at "
                  f"{result['allocated_by_s']:.1f} s, last bound at {result['seconds']:.1f} s")  # fmt: skip
        print("  CPU seconds per component (idle: per second with nothing created):")
        for e in idle:
            print(f"    idle at {e['nodes']} nodes{'':<31} "
                  + ", ".join(f"{name} {sec:.2f}" for name, sec in e["cpu_per_s"].items()))  # fmt: skip
        for e in entries:
            result = e["result"]
            print(f"    round {e['round']} {result['label']:<44} "
                  + ", ".join(f"{name} {sec:.1f}" for name, sec in result["cpu_s"].items()))  # fmt: skip
        print("  the API server's own mean latency per write (ms):")
        for e in entries:
            result = e["result"]
            latency = sorted(result.get("server_ms", {}).items())
            print(
                f"    round {e['round']} {result['label']:<44} " + ", ".join(f"{k} {v:g}" for k, v in latency)
            )
        print("  kube-scheduler's client: requests per pod, rate-limiter wait:")
        for e in entries:
            result = e["result"]
            print(f"    round {e['round']} {result['label']:<44} "
                  + ", ".join(f"{k} {v:g}" for k, v in result["scheduler_client"].items()))  # fmt: skip
        for row in report["unthrottled"]["summary"]:
            figures = ", ".join(
                f"{path} {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})"
                for path, v in row["pods_per_second"].items()
            )
            print(f"  {row['nodes']} nodes, pods/s median (min-max): {figures}")
            ratios = ", ".join(
                f"{v['of_medians']:.2f} ({path.removeprefix('ours ')}; per round "
                f"{', '.join(f'{r:.2f}' for r in v['per_round'])})"
                for path, v in row["ratio"].items()
            )
            lines.append(f"unthrottled ratio ours/kube-scheduler at {row['nodes']} nodes: {ratios}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--profile", default="h100-80gb")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--memory-gib", type=int, default=10, help="memory slice of the throughput pods")
    parser.add_argument("--stream", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only", type=lambda text: [s.strip() for s in text.split(",") if s.strip()],
        default=list(SECTIONS), help=f"comma-separated sections of {','.join(SECTIONS)} (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--unthrottled-qps", type=float, default=5000.0,
        help="kube-scheduler's client QPS and burst in section 4 (scheduler_perf's 5000)",
    )  # fmt: skip
    parser.add_argument("--large-nodes", type=int, default=500,
                        help="section 4 again at this many simulated nodes (0: only at --nodes)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="rounds of section 4 at each node count")
    parser.add_argument(
        "--profile-controller", type=Path, default=None,
        help="record our controller with py-spy during section 4's runs, into this directory",
    )  # fmt: skip
    parser.add_argument(
        "--ours-before", type=Path, default=None,
        help="a checkout of an earlier commit (git worktree add DIR COMMIT): section 1 runs ours again "
             "with its webhook and controller, back to back in the same cluster",
    )  # fmt: skip
    parser.add_argument(
        "--controller-args", type=lambda text: text.split(), default=[],
        help="more flags for our controller, e.g. '--write-workers 16 --normal-event-rate -1'",
    )  # fmt: skip
    parser.add_argument("--kubernetes-version", default=None)
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "bench-cluster.json")
    args = parser.parse_args(argv)
    if args.profile_controller is not None and py_spy() is None:
        parser.error("--profile-controller needs py-spy (pip install py-spy, e.g. into .venv)")
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")

    from kubernetes import config

    from dra_driver.cluster.binaries import MissingBinaries, require_toolchain
    from dra_driver.cluster.child import ClusterChild
    from dra_driver.cluster.layout import default_state_dir
    from dra_driver.pidfile import running_pid

    try:
        toolchain = require_toolchain(args.kubernetes_version)
    except MissingBinaries as err:
        print(f"bench_cluster: {err} (make cluster-build builds them)", file=sys.stderr)
        return 2
    state_dir = default_state_dir()
    if running_pid(state_dir / "cluster.pid") is not None:
        print(f"bench_cluster: a cluster already runs from {state_dir}; stop it with `hami-dra cluster down`",
              file=sys.stderr)  # fmt: skip
        return 2
    log(f"starting the cluster (Kubernetes {toolchain.kubernetes_version})")
    started = time.monotonic()
    cluster = ClusterChild(state_dir, args.kubernetes_version)
    kubeconfig = cluster.start()
    try:
        from kubernetes import client

        configuration: Any = client.Configuration()
        load: Any = config.load_kube_config
        load(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32  # the benchmark's parallel creates and its watches
        api_client = client.ApiClient(configuration)
        report = run(args, api_client, state_dir, toolchain)
    finally:
        cluster.stop()
    report["kubernetes"] = toolchain.kubernetes_version
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"(report: {args.report}; {report['wall_s'] / 60:.1f} minutes)")
    for line in report["lines"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
