"""Prometheus metrics of the kubelet plugin (own registry, so tests can run several plugins).

Everything here is about one node, as its plugin sees it: what kubelet asked it to prepare, what
prepared claims hold on each GPU (``hami_dra_kubelet_plugin_prepared_*``: the node's view, which
lags the controller's ``hami_dra_gpu_allocated_*`` until kubelet prepares or unprepares; a distinct
name, so ``sum()`` over both components never counts a share twice), GPU health, withheld and
unenforced GPUs, the MIG instances it created for claims on cards in MIG on demand (the controller
knows their placements, only the plugin their UUIDs), and whether the plugin is ready. Series
about the node's GPUs or state carry
``node``, so they say where they come from under any scrape configuration (annotations, a static
config, a PodMonitor) without relabelling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from dra_driver.metrics import MetricsServer, ReadyCheck, serve

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OPERATIONS = ("prepare", "unprepare")


#: ``(device, uuid, profile, parent, memory bytes)`` of each MIG instance created on demand.
MigInstanceRow = tuple[str, str, str, str, int]
MIG_INSTANCE_MEMORY = "hami_dra_kubelet_plugin_mig_instance_memory_bytes"
MIG_INSTANCE_LABELS = ("node", "device", "uuid", "profile", "parent")


class MigInstanceSeries:
    """One series per MIG instance the plugin created on demand, read from its journal at each
    scrape (instances come and go with claims; nothing to keep in step). ``families`` declares
    the family's labels for the metrics catalog before any instance exists."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.source: Callable[[], Iterable[MigInstanceRow]] = lambda: ()
        self.families = {
            MIG_INSTANCE_MEMORY: (
                "Memory of each MIG instance the plugin created for a claim (MIG on demand)",
                MIG_INSTANCE_LABELS,
            )
        }

    def collect(self) -> Iterator[Any]:
        documentation, labels = self.families[MIG_INSTANCE_MEMORY]
        family = GaugeMetricFamily(MIG_INSTANCE_MEMORY, documentation, labels=labels)
        for device, uuid, profile, parent, memory in self.source():
            family.add_metric([self.node, device, uuid, profile, parent], float(memory))
        yield family


class PluginMetrics:
    """Counters and histograms for prepare/unprepare plus per-GPU gauges of one node."""

    def __init__(self, registry: CollectorRegistry | None = None, node: str = "") -> None:
        self.registry = registry or CollectorRegistry()
        self.node = node
        #: ``/readyz`` and ``hami_dra_kubelet_plugin_ready``: the plugin installs its check.
        self.ready: ReadyCheck = lambda: "the plugin has not started"
        self.requests = Counter(
            "hami_dra_kubelet_plugin_requests_total",
            "Claims handled by NodePrepareResources/NodeUnprepareResources",
            ["operation"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hami_dra_kubelet_plugin_errors_total",
            "Claims whose prepare/unprepare failed",
            ["operation"],
            registry=self.registry,
        )
        for operation in OPERATIONS:  # every series from the start: rate() and increase() see 0 first
            self.requests.labels(operation)
            self.errors.labels(operation)
        self.latency = Histogram(
            "hami_dra_kubelet_plugin_request_duration_seconds",
            "Latency of one gRPC call (a batch of claims)",
            ["operation"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        for operation in OPERATIONS:  # a series that appears at its first call would not count it
            self.latency.labels(operation)
        self.prepared_devices = Gauge(
            "hami_dra_kubelet_plugin_prepared_devices",
            "Device allocations currently prepared on this node",
            registry=self.registry,
        )
        self.deleted_claims = Gauge(
            "hami_dra_kubelet_plugin_deleted_claims_prepared",
            "Prepared claims no longer in the API; their share counts until kubelet unprepares them",
            registry=self.registry,
        )
        self.prepared_memory = Gauge(
            "hami_dra_kubelet_plugin_prepared_memory_bytes",
            "Memory of each GPU held by the claims prepared on this node",
            ["node", "device"],
            registry=self.registry,
        )
        self.prepared_cores = Gauge(
            "hami_dra_kubelet_plugin_prepared_cores",
            "Cores of each GPU held by the claims prepared on this node",
            ["node", "device"],
            registry=self.registry,
        )
        self.unenforced = Gauge(
            "hami_dra_kubelet_plugin_unenforced_gpus",
            "GPUs of this node whose shares nothing enforces (isolation=none: no usable HAMi-core)",
            ["node"],
            registry=self.registry,
        ).labels(node)
        self.withheld = Gauge(
            "hami_dra_kubelet_plugin_withheld_gpus",
            "GPUs of this node not published, by reason (no CDI spec defines them, a device plugin)",
            ["node", "reason"],
            registry=self.registry,
        )
        self.healthy = Gauge(
            "hami_dra_gpu_healthy", "1 when the GPU is healthy", ["node", "device"], registry=self.registry
        )
        self.health_monitored = Gauge(
            "hami_dra_gpu_health_monitored",
            "1 when something watches the GPU's health (NVML XID events, or the simulated health file)",
            ["node", "device"],
            registry=self.registry,
        )
        self.ready_gauge = Gauge(
            "hami_dra_kubelet_plugin_ready",
            "1 when the plugin is registered with kubelet and has published its ResourceSlices (/readyz)",
            ["node"],
            registry=self.registry,
        ).labels(node)
        self.ready_gauge.set_function(lambda: 1.0 if self.ready() is None else 0.0)
        #: MIG on demand: the plugin points ``source`` at its instances (``mig_on_demand.py``).
        self.mig_instances = MigInstanceSeries(node)
        self.registry.register(self.mig_instances)

    def withheld_gpus(self, reason: str) -> Gauge:
        return self.withheld.labels(self.node, reason)

    def gpu(self, gauge: Gauge, device: str) -> Gauge:
        """The series of ``gauge`` for one GPU of this node."""
        return gauge.labels(self.node, device)

    def serve(self, port: int, address: str = "0.0.0.0") -> MetricsServer:
        """Expose /metrics, /healthz and /readyz (``self.ready``) on ``address:port`` (background thread)."""
        return serve(self.registry, port, address, ready=lambda: self.ready())
