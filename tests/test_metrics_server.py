"""``dra_driver/metrics.py``: /metrics, /healthz and /readyz of the controller and the plugin.

prometheus_client's own server answers every path with the metrics, so a readiness probe could
never say "not yet"; these endpoints must.
"""

from __future__ import annotations

import socket
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


def _healthz(host: str, port: int) -> tuple[int, str]:
    url_host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{url_host}:{port}/healthz", timeout=5) as response:
        return response.status, response.read().decode()


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except OSError:
        return True


def test_a_specific_host_is_the_only_address_served() -> None:
    """``--metrics-bind-address=127.0.0.1:PORT``: loopback only, not every interface."""
    running = serve(CollectorRegistry(), 0, "127.0.0.1")
    try:
        assert running.host == "127.0.0.1"
        assert _healthz("127.0.0.1", running.port) == (200, "ok")
        # 127.0.0.2 is this machine too (127/8 is loopback): a server on every interface answers there.
        assert _refused("127.0.0.2", running.port)
    finally:
        running.stop()
    everywhere = serve(CollectorRegistry(), 0, "")
    try:
        assert everywhere.host == "0.0.0.0"
        assert _healthz("127.0.0.2", everywhere.port) == (200, "ok")
    finally:
        everywhere.stop()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this Python")
def test_an_ipv6_host_is_served_over_ipv6() -> None:
    try:
        running = serve(CollectorRegistry(), 0, "::1")
    except OSError as err:  # a kernel without IPv6 (ipv6.disable=1, some containers)
        pytest.skip(f"no IPv6 loopback here: {err}")
    try:
        assert running.host == "::1"
        assert _healthz("::1", running.port) == (200, "ok")
        assert _refused("127.0.0.1", running.port)
    finally:
        running.stop()


def test_an_address_it_cannot_listen_on_is_named_in_the_error() -> None:
    with pytest.raises(OSError, match=r"cannot listen on 192\.0\.2\.1:\d+"):
        serve(CollectorRegistry(), 0, "192.0.2.1")  # TEST-NET-1: never this machine's
