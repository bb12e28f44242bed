"""The HTTP endpoint of the controller and the kubelet plugin: ``/metrics``, ``/healthz``, ``/readyz``.

``prometheus_client.start_http_server`` answers every path with the metrics, so a probe of
``/healthz`` would pass on a process whose work has stopped and a readiness probe could not say
"not yet". Here ``/healthz`` says the process serves HTTP (liveness: a restart helps only a
process that cannot answer at all), ``/readyz`` asks the component whether it does its job
(controller: informers synced; plugin: registered with kubelet and slices published) and answers
503 with the reason while it does not, and ``/metrics`` is the registry in the format the scraper
asks for. Each component keeps its own registry, so tests can run several in one process.

Counters' ``_created`` series are switched off: the text format would export each as a separate
gauge family (``hami_dra_allocations_created``), names nobody documents or queries.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics

from dra_driver.metrics_page import page

log = logging.getLogger(__name__)

disable_created_metrics()  # type: ignore[no-untyped-call]

#: A readiness check: None when ready, else why not (the /readyz body).
ReadyCheck = Callable[[], "str | None"]


def always_ready() -> str | None:
    return None


class MetricsServer:
    """Serves one registry and the component's health in a daemon thread; ``stop`` ends it.

    ``address`` is an IPv4 or IPv6 address or a host name to listen on; "" (and ``0.0.0.0``) is
    every IPv4 interface, ``::`` every IPv6 one. An address the process cannot listen on raises
    ``OSError`` naming it.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        address: str = "0.0.0.0",
        ready: ReadyCheck = always_ready,
    ) -> None:
        self.registry = registry
        self.ready = ready
        host = address or "0.0.0.0"
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            self.httpd = _Server(family, sockaddr, self)
        except OSError as err:  # socket.gaierror included: a name that does not resolve
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise OSError(err.errno, f"cannot listen on {shown}: {err.strerror or err}") from err
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def host(self) -> str:
        """The address the server listens on (``127.0.0.1``, ``::1``, ``0.0.0.0``)."""
        return str(self.httpd.server_address[0])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(
    registry: CollectorRegistry, port: int, address: str = "0.0.0.0", ready: ReadyCheck = always_ready
) -> MetricsServer:
    """Start serving ``registry`` on ``address:port`` (port 0: any free port; address "": every
    IPv4 interface); returns the server."""
    return MetricsServer(registry, port, address, ready).start()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, family: socket.AddressFamily, address: tuple[Any, ...], owner: MetricsServer) -> None:
        self.owner = owner
        self.address_family = family  # read by TCPServer.__init__ to make the socket
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        owner: MetricsServer = self.server.owner  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        if path == "/metrics":
            body, content_type = page(owner.registry, self.headers.get("Accept") or "")
            self._reply(200, body, content_type)
        elif path in ("/healthz", "/livez"):
            self._reply(200, b"ok")
        elif path == "/readyz":
            try:
                why = owner.ready()
            except Exception as err:  # a failing check means not ready, never a dead endpoint
                why = f"readiness check failed: {err}"
            self._reply(200, b"ok") if why is None else self._reply(503, why.encode())
        else:
            self._reply(404, b"not found: /metrics, /healthz, /readyz")

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
