"""The HTTPS server must keep answering whatever one client does (the API server waits on it)."""

from __future__ import annotations

import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.webhook.server import WebhookServer, tls_context
from tests.webhook.test_webhook import FakeLookup

DRIVER = "gpu.hami.io"


@pytest.fixture
def https_server(certs: tuple[Path, Path]) -> Iterator[WebhookServer]:
    context = tls_context(str(certs[0]), str(certs[1]))
    instance = WebhookServer(FakeLookup(), DRIVER, host="127.0.0.1", port=0, ssl_context=context)
    instance.start()
    yield instance
    instance.stop()


def test_a_silent_connection_does_not_block_other_clients(
    https_server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """A TCP connection that never starts TLS (a port probe, a stuck client) must not stall the
    accept loop: every admission review would time out and, with failurePolicy Fail, be rejected."""
    silent = socket.create_connection(("127.0.0.1", https_server.port))
    try:
        context = ssl.create_default_context(cafile=str(certs[0]))
        url = f"https://127.0.0.1:{https_server.port}/healthz"
        with urllib.request.urlopen(url, context=context, timeout=3) as response:
            assert response.status == 200 and response.read() == b"ok"
    finally:
        silent.close()
