"""The gang series (dra_driver/controller/gangs.py), on the controller's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GangMetrics:
    """The gang series, on the controller's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.waiting = Gauge(
            "hami_dra_gangs_waiting",
            "Gangs (pod groups) whose gated members cannot all be placed yet",
            registry=registry,
        )
        self.timed_out = Gauge(
            "hami_dra_gangs_waiting_past_timeout",
            "Gangs waiting longer than their timeout (their members report why)",
            registry=registry,
        )
        self.wait = Histogram(
            "hami_dra_gang_wait_seconds",
            "How long a gang waited, from its first plan to its members' allocations being written",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
            registry=registry,
        )
        self.admitted = Counter("hami_dra_gangs_admitted_total", "Gangs placed together", registry=registry)
        self.released = Counter(
            "hami_dra_gang_claims_released_total",
            "Claims of gated members of an incomplete gang deallocated (after a crash or a failed write)",
            registry=registry,
        )
