"""Prometheus metrics of the controller (one registry per controller, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dra_driver.controller.ledger import Ledger


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.allocations = Counter(
            "hami_dra_allocations", "Claims allocated by the controller", registry=self.registry
        )
        self.failures = Counter(
            "hami_dra_allocation_failures",
            "Pods that could not be placed, by the first failure reason",
            ["reason"],
            registry=self.registry,
        )
        self.deallocations = Counter(
            "hami_dra_deallocations", "Claims deallocated by the controller", registry=self.registry
        )
        self.overcommits = Counter(
            "hami_dra_overcommitted_devices",
            "Allocations observed that overcommit a GPU, by what was done",
            ["action"],
            registry=self.registry,
        )
        self.conflicts = Counter("hami_dra_write_conflicts", "409 conflicts retried", registry=self.registry)
        self.pending_skipped = Counter(
            "hami_dra_pending_retries_skipped",
            "Pending pods not planned again after a release because an older pod of the same shape "
            "stayed pending in the same pass",
            registry=self.registry,
        )
        self.unexpected_errors = Counter(
            "hami_dra_unexpected_errors",
            "Pods and claims whose reconciliation raised an unexpected error (the pod is reported "
            "pending with reason InvalidRequest; every other queued object is reconciled as usual)",
            ["kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hami_dra_decision_seconds",
            "Time to plan one pod's claims with the engine",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.memory = Gauge(
            "hami_dra_gpu_allocated_memory_bytes",
            "Memory allocated on each GPU",
            ["node", "device"],
            registry=self.registry,
        )
        self.cores = Gauge(
            "hami_dra_gpu_allocated_cores",
            "Cores (percent) allocated on each GPU",
            ["node", "device"],
            registry=self.registry,
        )
        self.tenants = Gauge(
            "hami_dra_gpu_tenants", "Allocations sharing each GPU", ["node", "device"], registry=self.registry
        )
        self.quota_used = Gauge(
            "hami_dra_quota_used",
            "What a namespace's allocated claims count against a GPU quota (memory in bytes)",
            ["namespace", "quota", "resource"],
            registry=self.registry,
        )
        self.quota_hard = Gauge(
            "hami_dra_quota_hard",
            "A GPU quota's limit (memory in bytes)",
            ["namespace", "quota", "resource"],
            registry=self.registry,
        )
        self.leader = Gauge("hami_dra_leader", "1 while this replica leads", registry=self.registry)

    def update_gpus(self, ledger: Ledger) -> None:
        for name, node in ledger.state.nodes.items():
            for card in node.cards:
                usage = node.usage[card.index]
                labels = (name, ledger.device_name(name, card.index))  # the slice's name
                self.memory.labels(*labels).set(usage.used_memory)
                self.cores.labels(*labels).set(usage.used_cores)
                self.tenants.labels(*labels).set(usage.tenants)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
