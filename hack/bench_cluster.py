#!/usr/bin/env python3
"""Benchmarks on the real control plane, side by side with kube-scheduler's own DRA allocator.

    .venv/bin/python hack/bench_cluster.py [--nodes 100] [--pods 1000] [--rounds 5] [--warmup 1]
        [--paths kube-scheduler,binpack,mutex-binpack] [--steady-pods 600] [--steady-rate 10]
        [--scheduler-qps 5000] [--large-nodes 500] [--foreign-pods N] [--stream 2000]
        [--only rounds,quality,prepare]
        [--profile-controller DIR] [--profile-apiserver DIR] [--ours-before DIR]
        [--ours-pod-gate webhook|policy] [--report PATH]

One run, one cluster (``hami-dra cluster up --no-driver``, the upstream binaries of
hack/cluster/versions.env), ``--nodes`` simulated nodes (dev/hami_dra_dev/cluster/fakenodes.py) with
``--gpus`` simulated H100 80GB each, published as our kubelet plugin publishes them.

**rounds** (issue 35 item 5: figures that can be trusted). Every pod asks for one GPU with a
``--memory-gib`` slice through a ResourceClaimTemplate, so kube-controller-manager's resourceclaim
controller makes each claim on both paths, as in most real workloads. The paths: kube-scheduler
alone (a DeviceClass of our driver whose claims tolerate the policy taint; our webhook and
controller stopped, their webhook configurations removed) and ours (``binpack``, optionally
``mutex,binpack`` and an earlier checkout's, ``--ours-before``). Our pods get the scheduling gate
from our webhook's ``/mutate`` (a TLS round trip per pod create), or with ``--ours-pod-gate policy``
from a MutatingAdmissionPolicy in kube-apiserver (1.36+; the chart's ``webhook.podGate``).
``--warmup`` rounds first (reported, marked, left out of every figure), then ``--rounds``
measured rounds; in each, every path runs back to back, in order in even rounds and reversed in
odd ones, so a drift of the machine weighs on all alike and ours / kube-scheduler is taken per
round (then its median and spread). Each run:

- a burst: ``--pods`` pods created at once by 16 threads, until every one is bound (a watch sees
  ``spec.nodeName``; no kubelet runs them). Pods/s, p50/p99 create -> bound and its steps (create ->
  claim made -> allocated -> gate lifted -> bound); the CPU seconds of every component
  (/proc/<pid>/stat: kube-apiserver, etcd, kube-controller-manager, kube-scheduler(s), our
  controller and webhook, the benchmark) per pod; the requests per pod by client and verb, reads
  included, from kube-apiserver's audit log (see below); the API server's own latency per write.
- a steady state, as scheduler_perf's SteadyState workloads: ``--steady-pods`` pods arriving at
  ``--steady-rate`` per second, each deleted ``--steady-lifetime`` seconds after it is bound (so
  claims are made and released while others arrive): p50/p99 create -> bound.

kube-controller-manager's client may send ``--controller-manager-qps`` requests/s (default 5000;
0: its own default, 20/s, burst 30, at which its resourceclaim controller, 2 requests per pod,
caps both paths at 10 pods/s: measured). kube-scheduler runs as scheduler_perf runs it: a second
kube-scheduler whose client may send ``--scheduler-qps`` requests/s with that burst (default 5000,
scheduler_perf's; the pods name its profile); ``--scheduler-qps 0``: the cluster's
default-scheduler at its default 50/100. Our
controller's client has no client-side limit. Before the rounds at each size, what each component
burns idle per second. ``--foreign-pods`` pods without claims are bound to the simulated nodes
first, so that every pod informer (kube-scheduler's, kube-controller-manager's, ours) holds a
cluster's worth of pods: the real control plane at scale, as far as this machine holds it.

*Requests per client.* ``apiserver_request_total`` counts by verb and resource, not by client, and
every client is active during a run. So the API server runs with an audit policy (level
Metadata, one event per request, Lease renewals left out: ``AUDIT_POLICY``) and each run counts the
events it added by user and user agent (hack/bench_report.py ``client_of``): kube-controller-manager
runs each controller under its own service account, our controller and webhook get identities of
their own here, the benchmark's client its own user agent. Writing the audit log costs the API
server some CPU on both paths alike (``--no-audit`` turns it off and the counts with it).

**quality**: the same seeded stream of ``--stream`` claims (1-4 GPUs, 4-40 GiB per GPU, one in ten
whole-card) arriving and leaving, through kube-scheduler's first fit, ours with ``binpack`` and
ours with ``spread``: GPUs left idle, pods pending by fragmentation, free memory on partly used cards.
**prepare**: NodePrepareResources against dra-example-driver (hack/bench_prepare_peer.py).

Figures, not assertions. The report (JSON) records the commit measured, whether tracked files
differed from it, the machine and its load, the exact command; the full-size run writes
docs/bench/cluster.json (docs/performance.md's tables are generated from it by
hack/perf_tables.py), a smaller one docs/bench/cluster-validation.json, marked as a validation of
the harness. The last lines are machine-readable (the per-round ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "hack"))

import bench_prepare_peer  # noqa: E402
import bench_report  # noqa: E402
from speed_probe import SpeedProbe  # noqa: E402

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402
from dra_driver.contract import policy_taint_key  # noqa: E402
from dra_driver.webhook.pod_gate import POD_GATE_MODES  # noqa: E402
from hami_dra_dev.cluster.driver import POD_GATE_NAME  # noqa: E402

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


percentile = bench_report.percentile


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


def template_body(name: str, class_name: str, shape: Shape, tolerate_policy_taint: bool) -> dict[str, Any]:
    """A ResourceClaimTemplate of the claim ``claim_body`` makes: kube-controller-manager's
    resourceclaim controller creates each pod's claim from it, as in most real workloads."""
    claim = claim_body(name, class_name, shape, tolerate_policy_taint)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": claim["spec"]},
    }


def pod_body(
    name: str, claim: str | None = None, scheduler: str | None = None, *, template: str | None = None
) -> dict[str, Any]:
    """A pod with one claim: ``claim`` by name, or one made for it from ``template``."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", **source}],
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
    """When each claim of the namespace was first seen, with a finalizer and with its allocation;
    keyed by the pod that owns it (a claim made from a template: kube-controller-manager names it
    ``<pod>-<claim>-<suffix>`` and makes the pod its owner) or by its own name (a claim made by the
    benchmark)."""

    resource_name = "RESOURCE_CLAIMS"
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"

    def __init__(self, api: Api) -> None:
        self.created: dict[str, float] = {}
        self.finalized: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        super().__init__(api)

    @staticmethod
    def key(claim: dict[str, Any]) -> str:
        for owner in claim["metadata"].get("ownerReferences") or ():
            if owner.get("kind") == "Pod":
                return str(owner["name"])
        return str(claim["metadata"]["name"])

    def seen(self, name: str, claim: dict[str, Any], now: float) -> None:
        key = self.key(claim)
        self.created.setdefault(key, now)
        if claim["metadata"].get("finalizers"):
            self.finalized.setdefault(key, now)
        if (claim.get("status") or {}).get("allocation"):
            self.allocated.setdefault(key, now)


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


class ApiserverProfile:
    """kube-apiserver's own CPU profile (Go pprof, ``/debug/pprof/profile``) over the first
    ``seconds`` of a burst, fetched in a thread and written to ``out`` (``go tool pprof -top``)."""

    def __init__(self, api: Api, out: Path, seconds: int) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out

        def fetch() -> None:
            try:
                data = api.kube._call(
                    "GET", "/debug/pprof/profile", query={"seconds": str(seconds)}, stream=True
                ).data
                out.write_bytes(data)
            except Exception as err:  # a profile is a by-product: the run goes on without it
                log(f"kube-apiserver profile {out.name}: {err}")

        self.thread = threading.Thread(target=fetch, name="apiserver-profile", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.thread.join(120)
        if self.out.exists():
            log(f"kube-apiserver profile: {self.out}")


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(percentile(values, 0.5), 3), "p99_s": round(percentile(values, 0.99), 3)}


#: kube-apiserver's audit policy while the benchmark runs: one event per request (level Metadata:
#: who, which verb, which object; no bodies), the simulated nodes' Lease renewals left out.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "nonResourceURLs": ["*"]},
        {"level": "Metadata"},
    ],
}


class AuditLog:
    """kube-apiserver's audit log (``HAMI_DRA_AUDIT_POLICY``, dev/hami_dra_dev/cluster/configs.py), read
    between two offsets: the requests of one run by client, verb and resource."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def offset(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def requests(self, start: int, end: int) -> Counter[tuple[str, str, str]]:
        with self.path.open("rb") as log_file:
            log_file.seek(start)
            return bench_report.audit_requests(log_file.read(end - start).splitlines())


def pod_steps(
    created: dict[str, float], watch: PodWatch, claim_watch: ClaimWatch
) -> dict[str, dict[str, float]]:
    """Each pod's steps as the watches saw them (create -> claim made -> allocated -> gate lifted
    -> bound; a watch event's arrival: each step includes its delivery, the same for every step
    and both paths), p50 and p99 over ``created``'s pods."""
    bound, made = watch.bound, claim_watch.created
    allocated_at = {p: claim_watch.allocated.get(p, bound[p]) for p in created}
    phases = {
        "create->claim": summary([made.get(p, allocated_at[p]) - created[p] for p in created]),
        "claim->allocated": summary([allocated_at[p] - made.get(p, allocated_at[p]) for p in created]),
    }
    if watch.ungated:
        phases["allocated->ungated"] = summary(
            [watch.ungated.get(p, bound[p]) - allocated_at[p] for p in created]
        )
        phases["ungated->bound"] = summary([bound[p] - watch.ungated.get(p, bound[p]) for p in created])
    else:
        phases["allocated->bound"] = summary([bound[p] - allocated_at[p] for p in created])
    return phases


def throughput(
    api: Api,
    label: str,
    template: str,
    pods: int,
    *,
    scheduler: str | None = None,
    pids: dict[str, int] | None = None,
    profile: tuple[int, Path] | None = None,
    scheduler_client: SchedulerClient | None = None,
    audit: AuditLog | None = None,
    apiserver_profile: tuple[Path, int] | None = None,
) -> dict[str, Any]:
    """A burst: ``pods`` pods, each with one claim made from ``template`` by kube-controller-manager,
    created at once by 16 threads; until every one is bound. ``scheduler``: the pods'
    ``spec.schedulerName``; ``pids``: processes whose CPU is measured over the run; ``profile``:
    (pid, output) to record with py-spy; ``scheduler_client``: the kube-scheduler whose client
    figures are read before and after; ``audit``: where the requests per client are counted;
    ``apiserver_profile``: (output, seconds) of kube-apiserver's CPU profile from the burst's start."""
    log(f"burst {label}: {pods} pods")
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    watch, claim_watch = PodWatch(api), ClaimWatch(api)
    before, seconds_before = api.request_metrics()
    audit_from = audit.offset() if audit is not None else 0
    created: dict[str, float] = {}

    def create(i: int) -> None:
        created[f"p-{i}"] = time.perf_counter()
        api.create(pods_path, pod_body(f"p-{i}", scheduler=scheduler, template=template))

    meter = CpuMeter({**(pids or {}), "benchmark": os.getpid()})
    probe = SpeedProbe()
    client_before = scheduler_client.read() if scheduler_client is not None else Counter()
    spy = PySpy(*profile) if profile is not None else None
    pprof = ApiserverProfile(api, *apiserver_profile) if apiserver_profile is not None else None
    try:
        parallel(create, list(range(pods)))
        wait_until(lambda: len(watch.bound) >= pods, 900, f"{pods} pods bound ({label})", poll=0.2)
    finally:
        if spy is not None:
            spy.stop()
        if pprof is not None:
            pprof.stop()
    cpu = meter.stop()
    speed = probe.stop()
    client_after = scheduler_client.read() if scheduler_client is not None else Counter()
    client = {
        (k if k.endswith(" s") else f"{k} per pod"): round(
            (v - client_before[k]) / (1 if k.endswith(" s") else pods), 2
        )
        for k, v in sorted(client_after.items())
        if v - client_before[k] > 0
    }
    wait_until(lambda: len(claim_watch.allocated) >= pods, 60, f"{pods} claims seen allocated ({label})")
    watch.stop()
    claim_watch.stop()
    after, seconds_after = api.request_metrics()
    claims = api.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    if len(allocated) != pods:
        raise RuntimeError(
            f"{label}: {len(allocated)} of {pods} claims allocated although every pod is bound"
        )
    requests = audit.requests(audit_from, audit.offset()) if audit is not None else Counter()
    start, end = min(created.values()), max(watch.bound.values())
    latencies = [watch.bound[name] - created[name] for name in created]
    bound = watch.bound
    allocated_at = {p: claim_watch.allocated.get(p, bound[p]) for p in created}
    phases = pod_steps(created, watch, claim_watch)
    # The API server's own mean latency per write kind over the run (ms).
    server_ms = {
        f"{verb} {resource}{'/' + sub if sub else ''}": round(
            1000 * (seconds_after[key] - seconds_before[key]) / (after[key] - before[key]), 1
        )
        for key in after
        for verb, resource, sub in [key]
        if resource not in NOT_ALLOCATION and after[key] - before[key] >= pods / 2
    }
    writes = after - before
    own = {("POST", "pods", ""): pods}  # the benchmark's creates
    metric_writes: dict[str, float] = {}
    for (verb, resource, sub), count in writes.items():
        count -= own.get((verb, resource, sub), 0)
        if resource not in NOT_ALLOCATION and count > 0:
            metric_writes[f"{verb} {resource}{'/' + sub if sub else ''}"] = round(count / pods, 2)
    seconds = end - start
    result: dict[str, Any] = {
        "label": label, "scheduler": scheduler or "default-scheduler", "pods": pods,
        "seconds": round(seconds, 2), "pods_per_second": round(pods / seconds, 2),
        "p50_s": round(percentile(latencies, 0.5), 3), "p99_s": round(percentile(latencies, 0.99), 3),
        "phases": phases, "allocated_by_s": round(max(allocated_at.values()) - start, 2),
        "ungated_by_s": round(max(watch.ungated.values()) - start, 2) if watch.ungated else 0.0,
        "cpu_s": cpu, "cpu_ms_per_pod": {name: round(1000 * sec / pods, 2) for name, sec in cpu.items()},
        "requests_per_pod": bench_report.requests_per_pod(requests, pods) if audit is not None else None,
        "writes_per_pod_metrics": dict(sorted(metric_writes.items())),
        "scheduler_client": client, "server_ms": server_ms, "speed_probe": speed,
    }  # fmt: skip
    per_pod = result["requests_per_pod"]
    traffic = f"{per_pod['reads']:.1f} reads + {per_pod['writes']:.1f} writes/pod" if per_pod else ""
    log(f"{label:<44} {result['pods_per_second']:7.1f} pods/s  p50 {result['p50_s']:6.2f} s  "
        f"p99 {result['p99_s']:6.2f} s  {traffic}")  # fmt: skip
    log(f"{label:<44} CPU ms/pod: " + ", ".join(f"{k} {v:g}" for k, v in result["cpu_ms_per_pod"].items()))
    log(f"{label:<44} speed probe: {speed.get('ms_per_unit', float('nan')):.3f} ms of CPU per unit "
        f"({speed.get('units', 0)} units)")  # fmt: skip
    reset_namespace(api)
    return result


def steady(
    api: Api,
    label: str,
    template: str,
    pods: int,
    rate: float,
    lifetime: float,
    *,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """A steady state, as scheduler_perf's SteadyState workloads run one: ``pods`` pods arriving at
    ``rate`` per second (each with a claim from ``template``), each deleted ``lifetime`` seconds
    after it is bound (its claim goes with it: pods end while others arrive). Per pod the time from
    its create call to a watch seeing it bound: with simulated nodes there is no kubelet, so bound
    is where a pod's placement ends (create -> running would add the kubelet's prepare and start)."""
    log(f"steady {label}: {pods} pods at {rate:g}/s, each deleted {lifetime:g} s after it is bound")
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    watch, claim_watch = PodWatch(api), ClaimWatch(api)
    created: dict[str, float] = {}
    deleted: set[str] = set()
    done = threading.Event()

    def create(i: int) -> None:
        created[f"p-{i}"] = time.perf_counter()
        api.create(pods_path, pod_body(f"p-{i}", scheduler=scheduler, template=template))

    def delete(name: str) -> None:
        api.call("DELETE", f"{pods_path}/{name}", query=[("gracePeriodSeconds", "0")])

    with ThreadPoolExecutor(16) as pool:

        def reap() -> None:
            while not done.wait(0.2):
                now = time.perf_counter()
                for name, at in list(watch.bound.items()):
                    if name not in deleted and now - at >= lifetime:
                        deleted.add(name)
                        pool.submit(delete, name)

        reaper = threading.Thread(target=reap, daemon=True)
        reaper.start()
        start = time.perf_counter()
        for i in range(pods):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(create, i)
        try:
            wait_until(lambda: len(watch.bound) >= pods, 900, f"{pods} steady pods bound ({label})", poll=0.2)
        finally:
            done.set()
            reaper.join()
    watch.stop()
    claim_watch.stop()
    latencies = [watch.bound[name] - created[name] for name in created]
    steps = pod_steps(created, watch, claim_watch)
    arrivals = max(created.values()) - min(created.values())
    result = {
        "label": label, "pods": pods, "rate_per_second": rate, "lifetime_s": lifetime,
        "p50_s": round(percentile(latencies, 0.5), 3), "p99_s": round(percentile(latencies, 0.99), 3),
        "max_s": round(max(latencies), 3),
        # Pods bound per second from the first create to the last bind (the rate, if it kept up).
        "achieved_per_second": round(pods / (max(watch.bound.values()) - min(created.values())), 2),
        "arrival_seconds": round(arrivals, 2),
        "phases": steps,
    }  # fmt: skip
    log(f"{label:<44} steady {rate:g}/s: p50 {result['p50_s']:.3f} s  p99 {result['p99_s']:.3f} s  "
        f"({result['achieved_per_second']:.1f} bound/s)")  # fmt: skip
    log(f"{label:<44} steady steps p50/p99 s: "
        + ", ".join(f"{step} {f['p50_s']:.3f}/{f['p99_s']:.3f}" for step, f in steps.items()))  # fmt: skip
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
SECTIONS = ("rounds", "quality", "prepare")
#: Sections of earlier versions, whose runs the rounds now make (with template claims, repeated).
RENAMED = {"throughput", "unthrottled"}
#: Where the report goes: the full run's (docs/performance.md's tables are made from it) and a
#: smaller run's, which only shows that the harness works.
REPORT = ROOT / "docs" / "bench" / "cluster.json"
VALIDATION_REPORT = ROOT / "docs" / "bench" / "cluster-validation.json"
#: The unthrottled kube-scheduler's profile (the rounds' pods name it).
UNTHROTTLED = "hami-bench-unthrottled"
UNTHROTTLED_PORT = 10269
#: kube-scheduler's own default client rate (KubeSchedulerConfiguration clientConnection).
DEFAULT_SCHEDULER_QPS, DEFAULT_SCHEDULER_BURST = 50, 100
#: How long the idle CPU of the components is measured before the rounds at each size.
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
    from hami_dra_dev.cluster.configs import FEATURE_GATES
    from hami_dra_dev.cluster.processes import HostProcess, Probe

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


def identity(layout: Any, user: str) -> str:
    """A kubeconfig for ``user`` (a client certificate of the cluster's CA, group system:masters as
    the admin's), so that the audit log tells our controller's and webhook's requests apart."""
    from hami_dra_dev.cluster.configs import kubeconfig
    from hami_dra_dev.cluster.pki import ClusterPki

    pki = ClusterPki(layout.pki)
    pair = pki.issue(user, user, organization="system:masters")
    return str(kubeconfig(layout.root / f"{user}.kubeconfig", layout, pki, pair, user))


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
        #: What gates our pods (--ours-pod-gate): the webhook's /mutate or the API server's policy.
        self.pod_gate = "webhook"

    def start(self) -> None:
        from hami_dra_dev.cluster.driver import DriverOptions, start_driver
        from hami_dra_dev.cluster.pki import ClusterPki

        log(f"starting our webhook and controller{f' from {self.source}' if self.source else ''}")
        options = DriverOptions(
            plugin=False,
            controller_kubeconfig=identity(self.layout, bench_report.CONTROLLER_USER),
            webhook_kubeconfig=identity(self.layout, bench_report.WEBHOOK_USER),
            controller_args=tuple(self.controller_args),
            pod_gate=self.pod_gate,
        )
        saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
        if self.source is not None:  # the children import dra_driver from there ("-c" puts cwd first)
            os.environ["PYTHONPATH"] = str(self.source)
            os.chdir(self.source)
        try:
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
        # kube-apiserver may still hold a kept-alive connection to the webhook stopped before this
        # start (same port): its first call on it fails ("broken pipe") and a pod create gets a
        # 500, which the burst would not retry. Dry runs until admission answers and applies.
        wait_until(lambda: self.admission_applies(quiet=True) is True, 60, "our admission applied", poll=0.5)

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
        # The pod gate's (--ours-pod-gate policy): kube-scheduler's pods must not wait on our gate.
        names = [(kind, "hami-dra") for kind in kinds]
        if self.pod_gate == "policy":
            names += [(kind, POD_GATE_NAME) for kind in kinds[2:]]
        for kind, name in names:
            try:
                self.api.call("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            except Exception as err:  # already gone (or no such API: before 1.36)
                log(f"deleting {kind}/{name}: {err}")
        # The API server applies admission configuration from informers: for a moment after the
        # deletions it may still gate a pod or finalize a claim, which nobody would then ungate or
        # release (a run of kube-scheduler's right after ours hung on such claims at deletion).
        wait_until(lambda: self.admission_applies() is False, 60, "our admission no longer applied", poll=0.5)

    def admission_applies(self, *, quiet: bool = False) -> bool | None:
        """Whether a pod of kube-scheduler's path and its claim would get our gate or our
        finalizer (both created as dry runs: nothing is stored); None where admission failed
        (``quiet``: without logging it), which a stop counts as still applied."""
        dry = [("dryRun", "All")]
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "admission-probe", "namespace": NAMESPACE},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "first-fit.bench"}}]}
            },
        }
        try:
            made = self.api.call(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", claim, dry
            )
            pod = self.api.call(
                "POST",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                pod_body("admission-probe", "admission-probe"),
                dry,
            )
        except Exception as err:  # our webhook still configured but stopped: Fail refuses the pod
            if not quiet:
                log(f"admission probe: {err}".splitlines()[0][:200])
            return None
        return bool(made["metadata"].get("finalizers") or pod["spec"].get("schedulingGates"))


@dataclass(frozen=True)
class Path_:
    """One allocation path of the rounds: its name, the DeviceClass its template asks for, and
    whose components run (``None``: kube-scheduler alone; else the ``Ours`` to run)."""

    name: str
    class_name: str
    whole_cards: bool = False  # mutex: one idle card per pod


#: The paths ``--paths`` picks from.
PATHS = {
    "kube-scheduler": Path_("kube-scheduler", "first-fit.bench"),
    "binpack": Path_("ours binpack", "binpack.bench"),
    "mutex-binpack": Path_("ours mutex,binpack", "mutex-binpack.bench", whole_cards=True),
}
#: ``--ours-before``: our binpack path once more, with an earlier checkout's webhook and controller.
BEFORE = Path_("ours-before binpack", "binpack.bench")


def template_name(class_name: str) -> str:
    return f"t-{class_name.removesuffix('.bench')}"


def create_templates(api: Api, memory_gib: int) -> None:
    """One ResourceClaimTemplate per class the rounds use (kube-scheduler's tolerates the taint)."""
    templates = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates"
    shape = Shape(1, memory_gib)
    for path in (*PATHS.values(), BEFORE):
        name = template_name(path.class_name)
        if any(t["metadata"]["name"] == name for t in api.items(templates)):
            continue
        tolerate = path.name == "kube-scheduler"
        api.create(templates, template_body(name, path.class_name, shape, tolerate))


def rounds(
    args: argparse.Namespace, api: Api, runners: dict[str, Ours | None], nodes: int, *,
    scheduler: str | None, pids: dict[str, int], client: SchedulerClient, audit: AuditLog | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """``args.warmup`` + ``args.rounds`` rounds of every path, in alternating order (the paths in
    order in even rounds, reversed in odd ones, so that a drift of the machine weighs on every path
    alike and each switch between kube-scheduler and ours happens once per two rounds). Each run of
    a path: a burst, then (``args.steady_pods`` > 0) a steady state. The warm-up rounds are
    reported and marked, and left out of every summary. First the components' CPU per second while
    nothing is created (lease renewals, resyncs, watches)."""
    entries: list[dict[str, Any]] = []
    paths = [PATHS[name] for name in args.paths] + ([BEFORE] if runners.get(BEFORE.name) else [])
    for runner in runners.values():
        if runner is not None:
            runner.stop()
    log(f"idle CPU at {nodes} nodes ({IDLE_SECONDS:g} s, nothing created)")
    meter = CpuMeter({**pids, "benchmark": os.getpid()})
    time.sleep(IDLE_SECONDS)
    idle = {name: round(sec / IDLE_SECONDS, 3) for name, sec in meter.stop().items()}
    entries.append({"nodes": nodes, "path": "idle", "cpu_per_s": idle})
    running: Ours | None = None
    for round_ in range(args.warmup + args.rounds):
        warmup = round_ < args.warmup
        for path in paths if round_ % 2 == 0 else reversed(paths):
            runner = runners.get(path.name)
            if running is not runner:
                if running is not None:
                    running.stop()
                if runner is not None:
                    runner.start()
                running = runner
            pods = min(args.pods, nodes * args.gpus) if path.whole_cards else args.pods
            label = f"{path.name}, {nodes} nodes, round {round_}{' (warm-up)' if warmup else ''}"
            profile = None
            if args.profile_controller is not None and runner is not None and not warmup:
                name = f"{path.name.replace(' ', '-').replace(',', '+')}-{nodes}nodes-round{round_}.txt"
                profile = (runner.processes[1].pid, args.profile_controller / name)
            apiserver_profile = None
            if args.profile_apiserver is not None and not warmup:
                name = f"{path.name.replace(' ', '-').replace(',', '+')}-{nodes}nodes-round{round_}.pprof"
                apiserver_profile = (args.profile_apiserver / name, args.profile_apiserver_seconds)
            template = template_name(path.class_name)
            entry: dict[str, Any] = {"nodes": nodes, "round": round_, "warmup": warmup, "path": path.name}
            entry["burst"] = throughput(
                api, label, template, pods, scheduler=scheduler,
                pids={**pids, **(runner.pids() if runner else {})}, profile=profile,
                scheduler_client=client, audit=audit, apiserver_profile=apiserver_profile,
            )  # fmt: skip
            if args.steady_pods > 0:
                steady_pods = (
                    min(args.steady_pods, nodes * args.gpus) if path.whole_cards else args.steady_pods
                )
                entry["steady"] = steady(api, label, template, steady_pods, args.steady_rate,
                                         args.steady_lifetime, scheduler=scheduler)  # fmt: skip
            entries.append(entry)
    if running is not None:
        running.stop()
    return entries


def run(args: argparse.Namespace, api_client: Any, state_dir: Path, toolchain: Any) -> dict[str, Any]:
    from dra_driver.devices.simulated import profile_gpus
    from hami_dra_dev.cluster.configs import audit_log_path
    from hami_dra_dev.cluster.fakenodes import FakeNodes, FakeNodeSpec
    from hami_dra_dev.cluster.layout import Layout

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
    if args.foreign_pods:
        create_foreign_pods(api, args.foreign_pods, all_nodes[0].names)
    report: dict[str, Any] = {"sections": sorted(sections)}
    layout = Layout(state_dir)
    pids = cluster_pids(layout)
    audit = AuditLog(audit_log_path(layout)) if args.audit else None
    qualities: list[Quality] = []
    prepare: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    ours_classes = [
        device_class("binpack.bench", "binpack", "binpack"),
        device_class("mutex-binpack.bench", "mutex,binpack", "binpack"),
        device_class("spread.bench", "spread", "spread"),
        device_class("mutex-spread.bench", "mutex,spread", "spread"),
    ]
    create_classes(api, [device_class("first-fit.bench", None, None), *ours_classes])
    create_templates(api, args.memory_gib)
    ours = Ours(layout, api_client, api)
    runners: dict[str, Ours | None] = {
        p.name: (None if p.name == "kube-scheduler" else ours) for p in PATHS.values()
    }
    if args.ours_before is not None:
        runners[BEFORE.name] = Ours(layout, api_client, api, args.ours_before)
    ours.controller_args = args.controller_args
    for runner in runners.values():
        if runner is not None:
            runner.controller_args = args.controller_args
            runner.pod_gate = args.ours_pod_gate
    scheduler = None
    try:
        if "quality" in sections:
            first_fit = {False: "first-fit.bench", True: "first-fit.bench"}
            qualities.append(quality(api, "kube-scheduler", first_fit, stream, True, card_memory))
            ours.start()
            for label, _, _ in OUR_STREAM_POLICIES:
                classes = {False: f"{label}.bench", True: f"mutex-{label}.bench"}
                qualities.append(quality(api, f"ours {label}", classes, stream, False, card_memory))
        if "prepare" in sections:
            if not ours.running:
                ours.start()
            log("prepare latency: our kubelet plugin and dra-example-driver's")
            prepare = bench_prepare_peer.compare(
                api, layout.admin_kubeconfig, layout.root / "bench-prepare", baseline=args.ours_before
            )
        ours.stop()
        if "rounds" in sections:
            if args.scheduler_qps > 0:
                scheduler = start_unthrottled_scheduler(toolchain, layout, args.scheduler_qps)
                name, client = UNTHROTTLED, scheduler_client(layout, UNTHROTTLED_PORT)
                round_pids = {**pids, "kube-scheduler (unthrottled)": scheduler.pid}
            else:
                name, client, round_pids = None, scheduler_client(layout, layout.ports.scheduler), pids
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
                entries += rounds(args, api, runners, nodes, scheduler=name, pids=round_pids, client=client,
                                  audit=audit)  # fmt: skip
    finally:
        for runner in runners.values():
            if runner is not None:
                runner.stop()
        if scheduler is not None:
            scheduler.stop()
    for nodes_ in reversed(all_nodes):
        nodes_.delete()
    report["quality"] = [q.__dict__ for q in qualities]
    report["prepare"] = prepare
    if entries:
        report["rounds"] = {
            "scheduler": UNTHROTTLED if args.scheduler_qps > 0 else "default-scheduler",
            "scheduler_qps": args.scheduler_qps or DEFAULT_SCHEDULER_QPS,
            "scheduler_burst": int(args.scheduler_qps) or DEFAULT_SCHEDULER_BURST,
            "claims": "from a ResourceClaimTemplate (kube-controller-manager's resourceclaim controller)",
            "requests_counted_from": "kube-apiserver audit log (user, userAgent)" if audit else "not counted",
            "idle": [e for e in entries if e["path"] == "idle"],
            "runs": [e for e in entries if e["path"] != "idle"],
        }
        report["rounds"]["summary"] = bench_report.summarise_rounds(report["rounds"]["runs"])
    return report


#: The namespace of ``--foreign-pods``: pods that are not ours nor DRA's.
FOREIGN_NAMESPACE = "bench-foreign"


def create_foreign_pods(api: Api, count: int, nodes: list[str]) -> None:
    """``count`` pods without claims, bound to the simulated nodes at creation (``spec.nodeName``:
    no scheduler involved; no kubelet runs them): objects every informer of pods lists and watches,
    so the rounds run at a cluster's size of pods, not an empty one's."""
    log(f"creating {count} foreign pods (no claims) bound to the simulated nodes")
    api.create("/api/v1/namespaces", {"metadata": {"name": FOREIGN_NAMESPACE}})
    path = f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/pods"

    def create(i: int) -> None:
        body = pod_body(f"f-{i}")
        body["metadata"]["namespace"] = FOREIGN_NAMESPACE
        body["metadata"]["labels"] = {"app": f"app-{i % 100}"}
        body["spec"].pop("resourceClaims")
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}}
        body["spec"]["nodeName"] = nodes[i % len(nodes)]
        api.create(path, body)

    parallel(create, list(range(count)))


def full_size(args: argparse.Namespace) -> bool:
    """Whether the run is at least the documented size (else its report is a harness validation)."""
    return bool(args.rounds >= 5 and args.warmup >= 1 and args.nodes >= 100 and args.pods >= 1000
            and args.steady_pods >= 500 and args.stream >= 2000)  # fmt: skip


#: What ``make bench-cluster`` runs for the figures of docs/performance.md.
FULL_COMMAND = "make bench-cluster"


def print_summary(report: dict[str, Any]) -> list[str]:
    """Print the human summary; return the machine-readable lines."""
    lines: list[str] = []
    print()
    if report.get("purpose") != "figures":
        print(f"VALIDATION RUN ({report.get('purpose')}): not the figures; the full run: {FULL_COMMAND}")
    rounds_ = report.get("rounds")
    if rounds_:
        config = report["config"]
        print(f"Rounds: {config['warmup']} warm-up + {config['rounds']} measured, paths alternating; "
              f"{config['pods']} pods per burst, steady {config['steady_pods']} pods at "
              f"{config['steady_rate']:g}/s; claims from templates; {rounds_['scheduler']} "
              f"(client {rounds_['scheduler_qps']:g}/s, burst {rounds_['scheduler_burst']})")  # fmt: skip
        for run in rounds_["runs"]:
            burst, steady_ = run["burst"], run.get("steady") or {}
            traffic = burst.get("requests_per_pod") or {}
            text = (
                f"  {burst['label']:<48} {burst['pods_per_second']:7.1f} pods/s  p99 {burst['p99_s']:6.2f} s"
            )
            if steady_:
                text += f"  steady p50 {steady_['p50_s']:.3f} p99 {steady_['p99_s']:.3f} s"
            if traffic:
                text += f"  {traffic['reads']:.1f} reads {traffic['writes']:.1f} writes/pod"
            print(text)
        for row in rounds_["summary"]:
            print(f"  {row['nodes']} nodes, median (min-max) over {row['rounds']} rounds:")
            for path, entry in row["paths"].items():
                figures = entry["figures"]
                rate = figures["burst_pods_per_second"]
                text = f"    {path:<22} {rate['median']:.1f} ({rate['min']:.1f}-{rate['max']:.1f}) pods/s"
                if "steady_p99_s" in figures:
                    p99 = figures["steady_p99_s"]
                    text += f", steady p99 {p99['median']:.3f} ({p99['min']:.3f}-{p99['max']:.3f}) s"
                cpu = entry["cpu_ms_per_pod"]
                text += ", CPU ms/pod " + ", ".join(f"{k} {v:g}" for k, v in cpu.items())
                print(text)
                ratio = entry["ratio"].get("burst_pods_per_second")
                if ratio:
                    lines.append(
                        f"ratio {path}/kube-scheduler at {row['nodes']} nodes, pods/s: "
                        f"median {ratio['median']:.2f} "
                        f"(min {ratio['min']:.2f}, max {ratio['max']:.2f}; per round "
                        f"{', '.join(f'{r:.2f}' for r in ratio['per_round'])})"
                    )
    qualities = report.get("quality") or []
    if len(qualities) == 3:
        print("Placement quality:")
        for q in qualities:
            print(f"  {Quality(**q).row()}")
        ff, bp, sp = qualities
        lines.append(
            f"pending by fragmentation: kube-scheduler {ff['pending_fragmentation']}, "
            f"binpack {bp['pending_fragmentation']}, spread {sp['pending_fragmentation']}"
        )
    prepare = report.get("prepare") or {}
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
                print(
                    f"  {callers} caller(s): ours p50 {ours['p50_ms']:.1f} ms p99 {ours['p99_ms']:.1f} ms, "
                    f"dra-example-driver p50 {peer['p50_ms']:.1f} ms p99 {peer['p99_ms']:.1f} ms"
                )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--profile", default="h100-80gb")
    parser.add_argument("--pods", type=int, default=1000, help="pods per burst")
    parser.add_argument("--memory-gib", type=int, default=10, help="memory slice of the rounds' pods")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds of every path at each size")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and left out of the figures")
    parser.add_argument(
        "--paths", type=lambda text: [s.strip() for s in text.split(",") if s.strip()],
        default=["kube-scheduler", "binpack"],
        help=f"comma-separated paths of the rounds, of: {','.join(PATHS)}",
    )  # fmt: skip
    parser.add_argument("--steady-pods", type=int, default=600, help="pods of each steady run (0: none)")
    parser.add_argument("--steady-rate", type=float, default=10.0, help="pods per second arriving")
    parser.add_argument("--steady-lifetime", type=float, default=10.0, help="seconds a pod lives once bound")
    parser.add_argument(
        "--scheduler-qps", type=float, default=5000.0,
        help="kube-scheduler's client QPS and burst (scheduler_perf's 5000: a second kube-scheduler "
             "so configured; 0: the cluster's default-scheduler at its default 50/100)",
    )  # fmt: skip
    parser.add_argument(
        "--controller-manager-qps", type=float, default=5000.0,
        help="kube-controller-manager's client QPS and burst (its resourceclaim controller makes 2 "
             "requests per pod: at the default 20/s it caps both paths at 10 pods/s; 0: the default)",
    )  # fmt: skip
    parser.add_argument(
        "--large-nodes", type=int, default=500,
        help="the rounds again at this many nodes, in the same run (issue 35: 100 and 500 from one "
             "run; 0 or at most --nodes: one size only)",
    )  # fmt: skip
    parser.add_argument(
        "--foreign-pods", type=int, default=0,
        help="pods without claims bound to the simulated nodes before the runs (a real cluster's pod count)",
    )  # fmt: skip
    parser.add_argument("--stream", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only", type=lambda text: [s.strip() for s in text.split(",") if s.strip()],
        default=list(SECTIONS), help=f"comma-separated sections of {','.join(SECTIONS)} (default: all)",
    )  # fmt: skip
    parser.add_argument("--no-audit", dest="audit", action="store_false",
                        help="no audit log (requests per pod by client are then not counted)")  # fmt: skip
    parser.add_argument(
        "--profile-controller", type=Path, default=None,
        help="record our controller with py-spy during the measured rounds, into this directory",
    )  # fmt: skip
    parser.add_argument(
        "--profile-apiserver", type=Path, default=None,
        help="record kube-apiserver's CPU profile (pprof) during each measured burst, into this directory",
    )  # fmt: skip
    parser.add_argument("--profile-apiserver-seconds", type=int, default=10,
                        help="length of each kube-apiserver profile, from the burst's start")  # fmt: skip
    parser.add_argument(
        "--ours-before", type=Path, default=None,
        help="a checkout of an earlier commit (git worktree add DIR COMMIT): its webhook and controller "
             "are one more path of the rounds ('ours-before binpack'); the prepare section measures its "
             "kubelet plugin in the same rounds",
    )  # fmt: skip
    parser.add_argument(
        "--controller-args", type=lambda text: text.split(), default=[],
        help="more flags for our controller, e.g. '--write-workers 16 --normal-event-rate -1'",
    )  # fmt: skip
    parser.add_argument(
        "--ours-pod-gate", choices=POD_GATE_MODES, default="webhook",
        help="what gates our pods: our webhook's /mutate (default) or a MutatingAdmissionPolicy in "
             "kube-apiserver (policy: needs 1.36+, the chart's webhook.podGate)",
    )  # fmt: skip
    parser.add_argument("--kubernetes-version", default=None)
    parser.add_argument(
        "--report", type=Path, default=None,
        help=f"default: {REPORT.relative_to(ROOT)} (full size), else {VALIDATION_REPORT.relative_to(ROOT)}",
    )  # fmt: skip
    args = parser.parse_args(argv)
    unknown_paths = [p for p in args.paths if p not in PATHS]
    if unknown_paths:
        parser.error(f"--paths: unknown {unknown_paths}; known: {list(PATHS)}")
    if args.profile_controller is not None and py_spy() is None:
        parser.error("--profile-controller needs py-spy (pip install py-spy, e.g. into .venv)")
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        renamed = " (throughput and unthrottled are now the rounds: issue 35)" if unknown & RENAMED else ""
        parser.error(
            f"--only: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}{renamed}"
        )
    if args.report is None:
        args.report = REPORT if full_size(args) else VALIDATION_REPORT

    from kubernetes import config

    from hami_dra_dev.cluster.binaries import MissingBinaries, require_toolchain
    from hami_dra_dev.cluster.child import ClusterChild
    from hami_dra_dev.cluster.configs import (
        APISERVER_PROFILING_ENV,
        AUDIT_POLICY_ENV,
        CONTROLLER_MANAGER_QPS_ENV,
    )
    from hami_dra_dev.cluster.layout import default_state_dir
    from hami_dra_dev.pidfile import running_pid

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
    provenance = bench_report.provenance()
    load_before = bench_report.load_average()
    if args.audit:
        policy = ROOT / "build" / "bench-audit-policy.json"  # JSON is YAML
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(json.dumps(AUDIT_POLICY, indent=2) + "\n")
        os.environ[AUDIT_POLICY_ENV] = str(policy)
    if args.profile_apiserver is not None:
        os.environ[APISERVER_PROFILING_ENV] = "1"
    if args.controller_manager_qps > 0:
        os.environ[CONTROLLER_MANAGER_QPS_ENV] = f"{args.controller_manager_qps:g}"
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
        api_client.user_agent = (
            f"{bench_report.BENCHMARK_AGENT}/1"  # its requests told apart in the audit log
        )
        report = run(args, api_client, state_dir, toolchain)
    finally:
        cluster.stop()
    report = {
        "purpose": "figures" if full_size(args) else "validation of the harness (smaller than the full run)",
        **provenance,
        "load_average": {"before": load_before, "after": bench_report.load_average()},
        "kubernetes": toolchain.kubernetes_version,
        "command": " ".join(["hack/bench_cluster.py", *argv]),
        "full_command": FULL_COMMAND,
        "config": {
            "nodes": args.nodes, "large_nodes": args.large_nodes, "gpus_per_node": args.gpus,
            "profile": args.profile, "pods": args.pods, "memory_gib": args.memory_gib,
            "rounds": args.rounds, "warmup": args.warmup, "paths": args.paths,
            "steady_pods": args.steady_pods, "steady_rate": args.steady_rate,
            "steady_lifetime_s": args.steady_lifetime, "stream": args.stream, "seed": args.seed,
            "controller_manager_qps": args.controller_manager_qps or "default (20, burst 30)",
            "foreign_pods": args.foreign_pods, "ours_pod_gate": args.ours_pod_gate,
        },
        **report,
        "wall_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    report["lines"] = print_summary(report)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    print(f"(report: {args.report}; {report['wall_s'] / 60:.1f} minutes; docs/performance.md's tables "
          "from it: hack/perf_tables.py)")  # fmt: skip
    for line in report["lines"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
