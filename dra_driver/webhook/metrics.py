"""Prometheus metrics of the webhook, served on its HTTPS port at ``GET /metrics``.

The webhook has no plain-HTTP listener, and adding one would mean another port for the
NetworkPolicy and the chart to open; its own TLS port already answers the kubelet's probes, so
Prometheus scrapes it there (``scheme: https``; the serving certificate is for the Service name,
so the scrape skips verification or names it).

What an admin needs from it: how many reviews each path answered and how (``allowed``,
``denied``, ``error``: the webhook could not decide and refused, ``malformed``: not an
AdmissionReview), how long deciding took, and connections closed because it was full or a client
was too slow (``connections.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import dra_driver.metrics  # noqa: F401  (switches off the _created series)

OUTCOMES = ("allowed", "denied", "error", "malformed", "unauthenticated")
CLOSE_REASONS = ("refused", "evicted", "timed_out")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Connections(Collector):
    """Connection counts read from the connection table at scrape time (it keeps the tallies)."""

    def __init__(self, count: Callable[[str], int], open_now: Callable[[], int]) -> None:
        self.count = count
        self.open_now = open_now

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        closed = CounterMetricFamily(
            "hami_dra_webhook_connections_closed",
            "Connections refused (every connection busy), evicted (to make room) or timed out "
            "(request not complete in time)",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], float(self.count(reason)))
        yield closed
        yield GaugeMetricFamily(
            "hami_dra_webhook_open_connections", "Connections open now", value=float(self.open_now())
        )

    def describe(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        return [
            CounterMetricFamily("hami_dra_webhook_connections_closed", "", labels=["reason"]),
            GaugeMetricFamily("hami_dra_webhook_open_connections", ""),
        ]


class WebhookMetrics:
    def __init__(self, paths: Sequence[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "hami_dra_webhook_reviews_total",
            "AdmissionReviews answered, by path and outcome (allowed, denied, error: could not "
            "decide and refused, malformed: not an AdmissionReview, unauthenticated: not from the API "
            "server's client certificate, with --client-ca-file)",
            ["path", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hami_dra_webhook_review_duration_seconds",
            "Time to decide one AdmissionReview (lookups in the API included)",
            ["path"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        for path in paths:  # every series from the start: increase() and rate() see the first review
            self.latency.labels(path)
            for outcome in OUTCOMES:
                self.reviews.labels(path, outcome)

    def watch_connections(self, count: Callable[[str], int], open_now: Callable[[], int]) -> None:
        self.registry.register(_Connections(count, open_now))
