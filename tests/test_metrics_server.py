"""``dra_driver/metrics.py``: /metrics, /healthz and /readyz of the controller and the plugin.

prometheus_client's own server answers every path with the metrics, so a readiness probe could
never say "not yet"; these endpoints must.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from dra_driver.metrics import MetricsServer, serve


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def state() -> dict[str, str | None]:
    return {"why": "informers listing"}


@pytest.fixture
def server(state: dict[str, str | None]) -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("hami_dra_things_total", "Things", registry=registry).inc()

    def ready() -> str | None:
        if state["why"] == "raise":
            raise RuntimeError("boom")
        return state["why"]

    running = serve(registry, 0, "127.0.0.1", ready=ready)
    try:
        yield running
    finally:
        running.stop()


def test_metrics_without_created_series(server: MetricsServer) -> None:
    status, body = get(server, "/metrics")
    assert status == 200 and "hami_dra_things_total 1.0" in body
    assert "_created" not in body


def test_healthz_answers_while_not_ready(server: MetricsServer) -> None:
    assert get(server, "/healthz") == (200, "ok")


def test_readyz_follows_the_check(server: MetricsServer, state: dict[str, str | None]) -> None:
    assert get(server, "/readyz") == (503, "informers listing")
    state["why"] = "raise"
    assert get(server, "/readyz") == (503, "readiness check failed: boom")
    state["why"] = None
    assert get(server, "/readyz") == (200, "ok")


def test_other_paths_are_not_found(server: MetricsServer) -> None:
    assert get(server, "/")[0] == 404
