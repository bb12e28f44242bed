"""Prometheus metrics of the controller (one registry per controller, so tests can run several).

What the controller knows and no other component does: every card's capacity and what allocated
claims take from it (the ledger, whoever allocated), who those claims are, and which pods it holds
pending and why. The per-card, per-claim and pending series are set from the worker thread
(``update_gpus``/``refresh_gpus`` in full, ``update_gpus_changed`` where the ledger, a claim or a
pod changed: ``gpu_series.py``; ``update_pending``) and read by scrapes as one snapshot, so a card,
claim or reason that is gone disappears from the next scrape instead of staying at its last value.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dra_driver.controller.gang_metrics import GangMetrics
from dra_driver.controller.gpu_series import GpuSeries, PodsOf, TenantOf
from dra_driver.controller.ledger import Ledger, LedgerChanges
from dra_driver.metrics import MetricsServer, ReadyCheck, serve
from dra_driver.metrics_page import Encoder, PageRegistry, Piece, PieceText, Sample

#: Labels of every per-card series: node and published device name, and the card's UUID and
#: product name (dcgm-exporter's ``UUID`` and ``modelName`` carry the same values, for joins).
GPU_LABELS = ("node", "device", "uuid", "model")
#: Labels of the per-claim series: who holds the share, then the card.
CLAIM_LABELS = ("claim_namespace", "claim", "claim_pod", *GPU_LABELS)
#: A MIG instance (issue 37): its device, UUID and model, its CUDA profile and its card's device name.
MIG_LABELS = (*GPU_LABELS, "profile", "parent")

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
    """Gauge families replaced as a whole by one thread and read by scrapes (no per-series state).

    The samples come in pieces (maps of family -> samples, e.g. one per node), so a change
    replaces its pieces only; the maps handed to ``set_pieces`` are never changed afterwards. The
    metrics server takes their text from ``render`` (``metrics_page.py``: each piece rendered once,
    not every sample on every scrape); ``collect`` serves everyone else.
    """

    def __init__(self, families: Mapping[str, tuple[str, Sequence[str]]]) -> None:
        self.families = families
        self._pieces: tuple[Mapping[Any, Piece], ...] = ()
        self._text = PieceText(families)

    def set(self, samples: Samples) -> None:
        self._pieces = ({None: dict(samples)},)  # one reference swap: a scrape sees old or new whole

    def set_pieces(self, *pieces: Mapping[Any, Piece]) -> None:
        self._pieces = pieces

    @staticmethod
    def _samples(pieces: tuple[Mapping[Any, Piece], ...], name: str) -> Iterator[Sample]:
        for group in pieces:
            for piece in group.values():
                yield from piece.get(name, ())

    def value(self, name: str, labels: Sequence[str]) -> float | None:
        wanted = tuple(labels)
        return next((value for values, value in self._samples(self._pieces, name) if values == wanted), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pieces = self._pieces
        for name, (documentation, labels) in self.families.items():
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for values, value in self._samples(pieces, name):
                family.add_metric(list(values), value)
            yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(n, doc, labels=list(labels)) for n, (doc, labels) in self.families.items()]

    def render(self, encoder: Encoder, content_type: str) -> bytes:
        """The families' text for /metrics, each piece rendered once while it is published."""
        return self._text.render(
            [piece for group in self._pieces for piece in group.values()], encoder, content_type
        )


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
    "hami_dra_mig_instance_memory_bytes": ("Memory of each published MIG instance", MIG_LABELS),
    "hami_dra_mig_instance_allocated": (
        "1 while an allocated claim holds the MIG instance (given out whole), else 0",
        MIG_LABELS,
    ),
    "hami_dra_mig_on_demand_free_slices": (
        "Slices of each card in MIG on demand that no placement a claim holds takes, by kind (of 8, of 7)",
        (*GPU_LABELS, "kind"),
    ),
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
        self.registry = PageRegistry()
        #: Whether a metrics server serves the registry (``serve``): only then is the page worth
        #: rendering ahead of a scrape.
        self.serving = False
        self._warm_pending = True  # the next publish is a term's first: render the page ahead
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
        self.preemptions = Counter(
            "hami_dra_preemptions_total",
            "Preemptions tried for pods that fit nowhere, by result: evicting (victims asked to "
            "leave), waiting (pods already terminating free enough), no_candidate, refused (a "
            "PodDisruptionBudget protects every candidate's victims), error",
            ["result"],
            registry=self.registry,
        )
        self.preemption_victims = Counter(
            "hami_dra_preemption_victims_total",
            "Pods evicted (through the Eviction API) to make room for a pod of higher priority",
            registry=self.registry,
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
        #: Gangs waiting, admitted and released (dra_driver/controller/gangs.py).
        self.gangs = GangMetrics(self.registry)
        self.latency = Histogram(
            "hami_dra_decision_seconds",
            "Time to plan one pod's claims with the engine",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.gpus = _Snapshot(_GPU_FAMILIES)
        self.gpu_series = GpuSeries()
        self.pending = _Snapshot(_PENDING_FAMILIES)
        self.registry.register_prerendered(self.gpus)
        self.registry.register_prerendered(self.pending)
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
        self.refresh_gpus(ledger, (tenants or {}).get, lambda _uid: ())

    def refresh_gpus(
        self, ledger: Ledger, tenant_of: TenantOf, pods_of: PodsOf, *, publish: bool = True
    ) -> None:
        """``update_gpus`` with who holds each claim asked per claim (``ClusterCache.tenant``);
        ``publish``: scrapes see them now (else at the next ``publish_gpus``)."""
        self.gpu_series.full(ledger, tenant_of, pods_of)
        if publish:
            self.publish_gpus()

    def update_gpus_changed(
        self,
        ledger: Ledger,
        changes: LedgerChanges,
        claims: Iterable[str],
        pods: Iterable[str],
        tenant_of: TenantOf,
        pods_of: PodsOf,
        *,
        publish: bool = True,
    ) -> None:
        """The cards and claims ``changes`` (the ledger's since the last call), ``claims`` (claim
        uids changed) and ``pods`` (pod uids come or gone) may have changed; the rest is kept."""
        self.gpu_series.update(ledger, changes, claims, pods, tenant_of, pods_of)
        if publish:
            self.publish_gpus()

    def publish_gpus(self) -> None:
        """What scrapes read from now on: the series as they are (copies of the piece maps).

        A term's first publish hands every card's series over at once: where a server serves them,
        the page is rendered then in the background, so the first scrape does not (later publishes
        bring few new pieces, which a scrape renders cheaply)."""
        self.gpus.set_pieces(dict(self.gpu_series.nodes), dict(self.gpu_series.holders))
        if self._warm_pending and self.serving:
            self._warm_pending = False
            self.registry.warm()

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
        """This replica stopped leading: what it would report is the new leader's to say (its
        series are still kept up to date, unpublished, for its next term)."""
        self.gpus.set({})
        self.pending.set({})
        self._warm_pending = True

    def serve(self, port: int, address: str = "0.0.0.0") -> MetricsServer:
        """``/metrics``, ``/healthz`` and ``/readyz`` (``self.ready``) on ``address:port``."""
        self.serving = True
        return serve(self.registry, port, address, ready=lambda: self.ready())


def created_epoch(timestamp: str) -> float | None:
    """An object's RFC 3339 ``creationTimestamp`` as seconds since the epoch (None if unparsable)."""
    try:
        return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
