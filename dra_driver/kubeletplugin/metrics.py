"""Prometheus metrics of the kubelet plugin (own registry, so tests can run several plugins)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PluginMetrics:
    """Counters and histograms for prepare/unprepare plus per-GPU allocation gauges."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "hami_dra_kubelet_plugin_requests",
            "Claims handled by NodePrepareResources/NodeUnprepareResources",
            ["operation"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hami_dra_kubelet_plugin_errors",
            "Claims whose prepare/unprepare failed",
            ["operation"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hami_dra_kubelet_plugin_request_duration_seconds",
            "Latency of one gRPC call (a batch of claims)",
            ["operation"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
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
        self.allocated_memory = Gauge(
            "hami_dra_gpu_allocated_memory_bytes",
            "Memory of the GPU held by prepared claims",
            ["device"],
            registry=self.registry,
        )
        self.allocated_cores = Gauge(
            "hami_dra_gpu_allocated_cores",
            "Core percentage of the GPU held by prepared claims",
            ["device"],
            registry=self.registry,
        )
        self.unenforced = Gauge(
            "hami_dra_kubelet_plugin_unenforced_gpus",
            "GPUs of this node whose shares nothing enforces (isolation=none: no usable HAMi-core)",
            registry=self.registry,
        )
        self.withheld = Gauge(
            "hami_dra_kubelet_plugin_withheld_gpus",
            "GPUs of this node not published, by reason (no CDI spec defines them, a device plugin)",
            ["reason"],
            registry=self.registry,
        )
        self.healthy = Gauge(
            "hami_dra_gpu_healthy", "1 when the GPU is healthy", ["device"], registry=self.registry
        )

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose /metrics on ``port`` (background thread)."""
        start_http_server(port, addr=address, registry=self.registry)
