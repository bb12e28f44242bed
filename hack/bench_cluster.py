#!/usr/bin/env python3
"""Benchmarks on the real control plane, side by side with kube-scheduler's own DRA allocator.

    .venv/bin/python hack/bench_cluster.py [--nodes 100] [--pods 1000] [--stream 2000] [--seed 1]

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

Figures, not assertions. The last three lines are machine-readable (issue 15's form); the whole
report is also written to build/bench-cluster.json.
"""

from __future__ import annotations

import argparse
import json
import random
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


def pod_body(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


# --- the API ---------------------------------------------------------------------------------------
class Api:
    """The few calls the benchmark makes, without deserialising responses into client models (the
    benchmark's own CPU would otherwise compete with the components it measures)."""

    def __init__(self, api_client: Any) -> None:
        from dra_driver.kube.api import Kube

        self.client = api_client
        self.kube = Kube(api_client, request_timeout=120)

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
        text = self.kube._call("GET", "/metrics", stream=True).data.decode()
        counts: Counter[tuple[str, str, str]] = Counter()
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line.rpartition(" ")
            labels = dict(
                part.split("=", 1) for part in labels_text[len("apiserver_request_total{") : -1].split(",")
            )
            labels = {key: raw.strip('"') for key, raw in labels.items()}
            if labels.get("verb") in WRITE_VERBS:
                counts[(labels["verb"], labels.get("resource", ""), labels.get("subresource", ""))] += int(
                    float(value)
                )
        return counts


class PodWatch:
    """The namespace's pods as a watch sees them, and when each was first seen bound.

    A pod is *settled* once it is bound or its allocator says it does not fit now: kube-scheduler's
    ``PodScheduled=False`` with reason ``Unschedulable``, or our controller's
    ``gpu.hami.io/Allocated=False``. A gated pod (``SchedulingGated``) is not settled: our
    controller has not decided yet. A watch that ends or fails is resumed, after a relist when
    its resourceVersion is too old.
    """

    def __init__(self, api: Api) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._version = self._relist()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _relist(self) -> str:
        listing = self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        self.pods = {pod["metadata"]["name"]: pod for pod in listing["items"]}
        for name, pod in self.pods.items():
            if pod["spec"].get("nodeName"):
                self.bound.setdefault(name, time.perf_counter())
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        from dra_driver.kube.api import PODS

        while not self._stop.is_set():
            try:
                for event in self.api.kube.watch(PODS, self._version, timeout_seconds=60):
                    self._event(event)
                    if self._stop.is_set():
                        return
            except Exception as err:  # a 410 (too old) or a dropped connection: list again
                log(f"pod watch: {err}; relisting")
                self._version = self._relist()

    def _event(self, event: dict[str, Any]) -> None:
        pod = event["object"]
        self._version = pod["metadata"].get("resourceVersion", self._version)
        if event["type"] == "BOOKMARK" or pod["metadata"].get("namespace") != NAMESPACE:
            return
        name = pod["metadata"]["name"]
        if event["type"] == "DELETED":
            self.pods.pop(name, None)
            return
        self.pods[name] = pod
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, time.perf_counter())

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

    def stop(self) -> None:
        self._stop.set()


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
@dataclass
class Throughput:
    label: str
    pods: int
    seconds: float
    p50: float
    p99: float
    writes: dict[str, float] = field(default_factory=dict)

    @property
    def pods_per_second(self) -> float:
        return self.pods / self.seconds

    def row(self) -> str:
        per_pod = sum(self.writes.values())
        return (
            f"{self.label:<28} {self.pods_per_second:8.1f} pods/s   p50 {self.p50 * 1000:7.0f} ms   "
            f"p99 {self.p99 * 1000:7.0f} ms   {per_pod:4.1f} writes/pod"
        )


def throughput(
    api: Api, label: str, class_name: str, pods: int, tolerate: bool, memory_gib: int
) -> Throughput:
    log(f"throughput {label}: {pods} claims")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    shape = Shape(1, memory_gib)
    parallel(
        lambda i: api.create(claims, claim_body(f"c-{i}", class_name, shape, tolerate)), list(range(pods))
    )
    watch = PodWatch(api)
    before = api.metrics()
    created: dict[str, float] = {}

    def create(i: int) -> None:
        created[f"p-{i}"] = time.perf_counter()
        api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(f"p-{i}", f"c-{i}"))

    log(f"throughput {label}: {pods} pods")
    parallel(create, list(range(pods)))
    wait_until(lambda: len(watch.bound) >= pods, 900, f"{pods} pods bound ({label})", poll=0.2)
    watch.stop()
    after = api.metrics()
    allocated = [c for c in api.items(claims) if (c.get("status") or {}).get("allocation")]
    if len(allocated) != pods:
        raise RuntimeError(
            f"{label}: {len(allocated)} of {pods} claims allocated although every pod is bound"
        )
    start, end = min(created.values()), max(watch.bound.values())
    latencies = [watch.bound[name] - created[name] for name in created]
    writes = after - before
    own = {("POST", "pods", ""): pods}  # the benchmark's creates (claims were created before `before`)
    per_pod: dict[str, float] = {}
    for (verb, resource, sub), count in writes.items():
        if resource in NOT_ALLOCATION:
            continue
        count -= own.get((verb, resource, sub), 0)
        if count > 0:
            per_pod[f"{verb} {resource}{'/' + sub if sub else ''}"] = count / pods
    result = Throughput(
        label, pods, end - start, percentile(latencies, 0.5), percentile(latencies, 0.99), per_pod
    )
    log(result.row())
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


def run(args: argparse.Namespace, api_client: Any, state_dir: Path) -> dict[str, Any]:
    from dra_driver.cluster.driver import DriverOptions, start_driver
    from dra_driver.cluster.fakenodes import FakeNodes, FakeNodeSpec
    from dra_driver.cluster.layout import Layout
    from dra_driver.cluster.pki import ClusterPki
    from dra_driver.devices.simulated import profile_gpus

    api = Api(api_client)
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    accounts = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
    wait_until(
        lambda: any(sa["metadata"]["name"] == "default" for sa in api.items(accounts)),
        60, "the namespace's default service account",
    )  # fmt: skip
    spec = FakeNodeSpec(args.nodes, args.gpus, args.profile)
    log(f"creating {args.nodes} simulated nodes x {args.gpus} {args.profile}")
    nodes = FakeNodes(api_client, spec)
    nodes.create()
    card_memory = {
        (name, gpu.name): (gpu.memory_bytes // 2**20) * 2**20
        for name in nodes.names
        for gpu in profile_gpus(args.profile, node_name=name, gpus=args.gpus)
    }
    stream = make_stream(args.stream, args.seed)
    report: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus, "profile": args.profile,
                              "pods": args.pods, "stream": args.stream, "seed": args.seed}  # fmt: skip
    mutex_pods = min(args.pods, args.nodes * args.gpus)  # a mutex pod needs an idle card of its own

    # (a) kube-scheduler alone: no webhook, no controller of ours.
    create_classes(api, [device_class("first-fit.bench", None, None)])
    first_fit = throughput(
        api, "kube-scheduler (first fit)", "first-fit.bench", args.pods, True, args.memory_gib
    )
    first_fit_quality = quality(api, "kube-scheduler", {False: "first-fit.bench", True: "first-fit.bench"},
                                stream, True, card_memory)  # fmt: skip
    delete_classes(api, ["first-fit.bench"])

    # (b) our webhook and controller.
    layout = Layout(state_dir)
    log("starting our webhook and controller")
    processes = start_driver(layout, ClusterPki(layout.pki), api_client, DriverOptions(plugin=False))
    try:
        ours_classes = [
            device_class("binpack.bench", "binpack", "binpack"),
            device_class("mutex-binpack.bench", "mutex,binpack", "binpack"),
            device_class("spread.bench", "spread", "spread"),
            device_class("mutex-spread.bench", "mutex,spread", "spread"),
        ]
        create_classes(api, ours_classes)
        binpack = throughput(api, "ours binpack", "binpack.bench", args.pods, False, args.memory_gib)
        mutex = throughput(
            api, "ours mutex,binpack", "mutex-binpack.bench", mutex_pods, False, args.memory_gib
        )
        ours_quality = [
            quality(
                api,
                f"ours {label}",
                {False: f"{label}.bench", True: f"mutex-{label}.bench"},
                stream,
                False,
                card_memory,
            )
            for label, _, _ in OUR_STREAM_POLICIES
        ]
        delete_classes(api, [body["metadata"]["name"] for body in ours_classes])
        log("prepare latency: our kubelet plugin and dra-example-driver's")
        prepare = bench_prepare_peer.compare(api, layout.admin_kubeconfig, layout.root / "bench-prepare")
    finally:
        for process in reversed(processes):
            process.stop()
    nodes.delete()
    runs = [first_fit, binpack, mutex]
    report["throughput"] = [
        {"label": r.label, "pods": r.pods, "pods_per_second": round(r.pods_per_second, 2),
         "p50_s": round(r.p50, 3), "p99_s": round(r.p99, 3),
         "writes_per_pod": {k: round(v, 2) for k, v in sorted(r.writes.items())}}
        for r in runs
    ]  # fmt: skip
    report["quality"] = [q.__dict__ for q in [first_fit_quality, *ours_quality]]
    report["prepare"] = prepare
    print()
    sizes = f"{args.nodes} nodes x {args.gpus} GPUs"
    print(f"Throughput: {args.pods} pods, one claim each (1 GPU, {args.memory_gib} GiB), {sizes} "
          f"(mutex,binpack: {mutex_pods} pods, one idle card each)")  # fmt: skip
    for r in runs:
        print(f"  {r.row()}")
    print("API writes per pod (without the benchmark's pod creates and node heartbeats):")
    for r in runs:
        print(f"  {r.label:<28} " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.writes.items())))
    print(f"Placement quality: {args.stream} claims arriving and leaving (seed {args.seed})")
    for q in [first_fit_quality, *ours_quality]:
        print(f"  {q.row()}")
    print("NodePrepareResources (one client playing kubelet, the same claims, 8 per round):")
    if "skipped" in prepare:
        print(f"  skipped: {prepare['skipped']}")
    else:
        for callers in (1, 8):
            ours, peer = prepare[f"ours callers={callers}"], prepare[f"dra-example-driver callers={callers}"]
            print(f"  {callers} caller(s): ours p50 {ours['p50_ms']:.1f} ms p99 {ours['p99_ms']:.1f} ms, "
                  f"dra-example-driver p50 {peer['p50_ms']:.1f} ms p99 {peer['p99_ms']:.1f} ms, "
                  f"ratio ours/peer p50 {ours['p50_ms'] / peer['p50_ms']:.2f}")  # fmt: skip
    ratio_binpack = binpack.pods_per_second / first_fit.pods_per_second
    ratio_mutex = mutex.pods_per_second / first_fit.pods_per_second
    spread = ours_quality[1]
    report["lines"] = [
        f"throughput ratio ours/kube-scheduler: {ratio_binpack:.2f} (binpack), "
        f"{ratio_mutex:.2f} (mutex,binpack)",
        f"idle GPUs after the stream: kube-scheduler {first_fit_quality.idle_gpus}, "
        f"binpack {ours_quality[0].idle_gpus}, spread {spread.idle_gpus}",
        f"pending by fragmentation: kube-scheduler {first_fit_quality.pending_fragmentation}, "
        f"binpack {ours_quality[0].pending_fragmentation}, spread {spread.pending_fragmentation}",
    ]
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--profile", default="h100-80gb")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--memory-gib", type=int, default=10, help="memory slice of the throughput pods")
    parser.add_argument("--stream", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kubernetes-version", default=None)
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "bench-cluster.json")
    args = parser.parse_args(argv)

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
    cluster = ClusterChild(state_dir, args.kubernetes_version)
    kubeconfig = cluster.start()
    try:
        from kubernetes import client

        configuration: Any = client.Configuration()
        load: Any = config.load_kube_config
        load(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32  # the benchmark's parallel creates and its watches
        api_client = client.ApiClient(configuration)
        report = run(args, api_client, state_dir)
    finally:
        cluster.stop()
    report["kubernetes"] = toolchain.kubernetes_version
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"(report: {args.report})")
    for line in report["lines"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
