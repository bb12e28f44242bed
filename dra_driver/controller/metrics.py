"""Prometheus metrics of the controller (one registry per controller, so tests can run several).

What the controller knows and no other component does: every card's capacity and what allocated
claims take from it (the ledger, whoever allocated), who those claims are, and which pods it holds
pending and why. The per-card, per-claim and pending series are set as a whole from the worker
thread (``update_gpus``, ``update_pending``) and read by scrapes as one snapshot, so a card, claim
or reason that is gone disappears from the next scrape instead of staying at its last value.

Label names never collide with the target labels Prometheus adds (kube-prometheus' PodMonitor adds
``namespace``, ``pod``, ``container``; a colliding label would be renamed ``exported_namespace``):
a claim's namespace and pods are ``claim_namespace`` and ``claim_pod``, a quota's namespace is
``quota_namespace``.

Only the replica that leads sets the GPU, claim and pending series (a standby's ledger is warm but
it decides nothing); a replica that stops leading clears them (``clear_leader_series``), so
``sum()`` over the replicas counts each card once.
"""

from __future__ import annotations

import datetime
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dra_driver.controller.inventory import Device
from dra_driver.controller.ledger import Ledger
from dra_driver.metrics import MetricsServer, ReadyCheck, serve

#: Labels of every per-card series: node and published device name, and the card's UUID and
#: product name (dcgm-exporter's ``UUID`` and ``modelName`` carry the same values, for joins).
GPU_LABELS = ("node", "device", "uuid", "model")
#: Labels of the per-claim series: who holds the share, then the card.
CLAIM_LABELS = ("claim_namespace", "claim", "claim_pod", *GPU_LABELS)

#: Reasons the overcommit repair reports; series exist from the start so ``increase()`` sees 0 -> 1.
OVERCOMMIT_ACTIONS = ("reported", "deallocated")


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who holds an allocated claim: its namespace and name, and the pods it is reserved for
    (comma-separated; usually one)."""

    namespace: str
    claim: str
    pod: str


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """Pods held pending for one reason: how many, and the creation time of the oldest (epoch s)."""

    count: int
    oldest_created: float | None


Samples = Mapping[str, Sequence[tuple[tuple[str, ...], float]]]


class _Snapshot(Collector):
    """Gauge families replaced as a whole by one thread and read by scrapes (no per-series state)."""

    def __init__(self, families: Mapping[str, tuple[str, Sequence[str]]]) -> None:
        self.families = families
        self._samples: Samples = {}

    def set(self, samples: Samples) -> None:
        self._samples = dict(samples)  # one reference swap: a scrape sees the old or the new whole

    def value(self, name: str, labels: Sequence[str]) -> float | None:
        return dict(self._samples.get(name, ())).get(tuple(labels))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = self._samples
        for name, (documentation, labels) in self.families.items():
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for values, value in samples.get(name, ()):
                family.add_metric(list(values), value)
            yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(n, doc, labels=list(labels)) for n, (doc, labels) in self.families.items()]


_GPU_FAMILIES: dict[str, tuple[str, Sequence[str]]] = {
    "hami_dra_gpu_memory_capacity_bytes": ("Memory of each published GPU", GPU_LABELS),
    "hami_dra_gpu_cores_capacity": ("Cores of each published GPU (100: all of its SMs)", GPU_LABELS),
    "hami_dra_gpu_slots_capacity": ("Shares each published GPU may hold at once", GPU_LABELS),
    "hami_dra_gpu_allocated_memory_bytes": (
        "Memory of each GPU that allocated claims take (a whole-card claim takes all of it)",
        GPU_LABELS,
    ),
    "hami_dra_gpu_allocated_cores": ("Cores of each GPU that allocated claims take", GPU_LABELS),
    "hami_dra_gpu_allocated_slots": ("Slots of each GPU that allocated claims take", GPU_LABELS),
    "hami_dra_gpu_tenants": ("Allocated claim results on each GPU", GPU_LABELS),
    "hami_dra_claim_allocated_memory_bytes": (
        "Memory each allocated claim takes from each GPU (its namespace, name and pods)",
        CLAIM_LABELS,
    ),
    "hami_dra_claim_allocated_cores": ("Cores each allocated claim takes from each GPU", CLAIM_LABELS),
}
_PENDING_FAMILIES: dict[str, tuple[str, Sequence[str]]] = {
    "hami_dra_pending_pods": ("Pods the controller holds pending, by their condition's reason", ("reason",)),
    "hami_dra_pending_pod_max_age_seconds": (
        "Age (since creation) of the oldest pod held pending for each reason",
        ("reason",),
    ),
}


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        #: The controller's readiness (``/readyz``); the Controller installs its own check.
        self.ready: ReadyCheck = lambda: "the controller has not started"
        self.allocations = Counter(
            "hami_dra_allocations_total", "Claims allocated by the controller", registry=self.registry
        )
        self.failures = Counter(
            "hami_dra_allocation_failures_total",
            "Pods that could not be placed, by the first failure reason (counted when it changes)",
            ["reason"],
            registry=self.registry,
        )
        self.deallocations = Counter(
            "hami_dra_deallocations_total", "Claims deallocated by the controller", registry=self.registry
        )
        self.overcommits = Counter(
            "hami_dra_overcommitted_devices_total",
            "Allocations observed that overcommit a GPU, by what was done",
            ["action"],
            registry=self.registry,
        )
        for action in OVERCOMMIT_ACTIONS:
            self.overcommits.labels(action)
        self.conflicts = Counter(
            "hami_dra_write_conflicts_total", "409 conflicts retried", registry=self.registry
        )
        self.pending_skipped = Counter(
            "hami_dra_pending_retries_skipped_total",
            "Pending pods not planned again after a release because an older pod of the same shape "
            "stayed pending in the same pass",
            registry=self.registry,
        )
        self.unexpected_errors = Counter(
            "hami_dra_unexpected_errors_total",
            "Pods and claims whose reconciliation raised an unexpected error (the pod is reported "
            "pending with reason InvalidRequest; every other queued object is reconciled as usual)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("Pod", "ResourceClaim"):
            self.unexpected_errors.labels(kind)
        self.latency = Histogram(
            "hami_dra_decision_seconds",
            "Time to plan one pod's claims with the engine",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.gpus = _Snapshot(_GPU_FAMILIES)
        self.pending = _Snapshot(_PENDING_FAMILIES)
        self.registry.register(self.gpus)
        self.registry.register(self.pending)
        self.quota_used = Gauge(
            "hami_dra_quota_used",
            "What a namespace's allocated claims count against a GPU quota (memory in bytes)",
            ["quota_namespace", "quota", "resource"],
            registry=self.registry,
        )
        self.quota_hard = Gauge(
            "hami_dra_quota_hard",
            "A GPU quota's limit (memory in bytes)",
            ["quota_namespace", "quota", "resource"],
            registry=self.registry,
        )
        self.leader = Gauge("hami_dra_leader", "1 while this replica leads", registry=self.registry)

    def update_gpus(self, ledger: Ledger, tenants: Mapping[str, Tenant] | None = None) -> None:
        """Capacity and allocation of every card, and each claim's share of it (claims by uid in
        ``tenants``; one the controller has not seen yet is labelled with its namespace only)."""
        tenants = tenants or {}
        samples: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in _GPU_FAMILIES}
        results: Tally[tuple[str, int]] = Tally()
        for uid, uses in ledger.claims().items():
            tenant = tenants.get(uid)
            for use in uses:
                device = ledger.device(use.device)
                if device is None:
                    continue  # its slice is not published (yet): no card to count it on
                results[(device.node, device.card.index)] += 1
                charge = ledger.charge(use)
                who = (tenant.namespace, tenant.claim, tenant.pod) if tenant else (use.namespace, "", "")
                claim_labels = (*who, *_gpu_labels(device))
                for metric, amount in (("hami_dra_claim_allocated_memory_bytes", charge.memory),
                                       ("hami_dra_claim_allocated_cores", charge.cores)):  # fmt: skip
                    samples[metric][claim_labels] = samples[metric].get(claim_labels, 0.0) + amount
        for name, node in ledger.state.nodes.items():
            for card in node.cards:
                labels = (name, ledger.device_name(name, card.index), card.uuid, card.product_name)
                usage = node.usage[card.index]
                for metric, value in (
                    ("hami_dra_gpu_memory_capacity_bytes", card.memory),
                    ("hami_dra_gpu_cores_capacity", card.cores),
                    ("hami_dra_gpu_slots_capacity", card.slots),
                    ("hami_dra_gpu_allocated_memory_bytes", usage.used_memory),
                    ("hami_dra_gpu_allocated_cores", usage.used_cores),
                    ("hami_dra_gpu_allocated_slots", usage.tenants),
                    ("hami_dra_gpu_tenants", results[(name, card.index)]),
                ):
                    samples[metric][labels] = float(value)
        self.gpus.set({name: tuple(values.items()) for name, values in samples.items()})

    def update_pending(self, groups: Mapping[str, PendingGroup], now: float | None = None) -> None:
        """Pending pods by reason, and how long the oldest of each has existed."""
        now = datetime.datetime.now(datetime.UTC).timestamp() if now is None else now
        self.pending.set(
            {
                "hami_dra_pending_pods": tuple(((reason,), float(g.count)) for reason, g in groups.items()),
                "hami_dra_pending_pod_max_age_seconds": tuple(
                    ((reason,), max(0.0, now - g.oldest_created))
                    for reason, g in groups.items()
                    if g.oldest_created is not None
                ),
            }
        )

    def clear_leader_series(self) -> None:
        """This replica stopped leading: what it would report is the new leader's to say."""
        self.gpus.set({})
        self.pending.set({})

    def serve(self, port: int, address: str = "0.0.0.0") -> MetricsServer:
        """``/metrics``, ``/healthz`` and ``/readyz`` (``self.ready``) on ``address:port``."""
        return serve(self.registry, port, address, ready=lambda: self.ready())


def _gpu_labels(device: Device) -> tuple[str, str, str, str]:
    return (device.node, device.name, device.card.uuid, device.card.product_name)


def created_epoch(timestamp: str) -> float | None:
    """An object's RFC 3339 ``creationTimestamp`` as seconds since the epoch (None if unparsable)."""
    try:
        return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
