"""AdmissionReview v1 over HTTPS: ``POST /mutate``, ``/mutate-hami``, ``/validate``, ``GET /healthz``.

A small threaded ``http.server``: admission requests are tiny and the API server retries, so a
framework would add weight without adding safety. A malformed review gets a 400 with a one-line
reason, never a traceback; an internal error while deciding is logged and answered as a denied
review whose message says so (the chart's failurePolicy decides what the API server does).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dra_driver.webhook.admission import (
    Verdict,
    mutate_pod,
    review_response,
    translate_hami_pod,
    validate_object,
)
from dra_driver.webhook.lookup import Lookup, TemplateWriter

log = logging.getLogger(__name__)
MAX_BODY = 3 * 1024 * 1024
#: Seconds a new connection may take to complete its TLS handshake.
HANDSHAKE_TIMEOUT = 10.0


class WebhookServer:
    """Owns the HTTP(S) server and the decision functions; ``start()`` serves in a thread."""

    def __init__(
        self,
        lookup: Lookup,
        driver: str,
        *,
        host: str = "0.0.0.0",
        port: int = 8443,
        ssl_context: ssl.SSLContext | None = None,
        hami_device_class: str | None = None,
    ) -> None:
        self.lookup = lookup
        self.driver = driver
        self.reviews = 0
        handlers: dict[str, Callable[[Mapping[str, Any]], Verdict]] = {
            "/mutate": lambda request: mutate_pod(request, lookup),
            "/validate": lambda request: validate_object(request, driver),
        }
        writer = lookup if isinstance(lookup, TemplateWriter) else None
        if writer is not None:
            device_class = hami_device_class or driver
            handlers["/mutate-hami"] = lambda request: translate_hami_pod(
                request, lookup, writer, device_class, driver
            )
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            tls_failed = False

            def setup(self) -> None:
                # TLS is negotiated here, on this connection's own thread, not in the accept loop:
                # a client that connects and stays silent must not stall every other review.
                super().setup()
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.settimeout(HANDSHAKE_TIMEOUT)
                    try:
                        self.connection.do_handshake()
                    except OSError as err:  # ssl.SSLError and timeouts included
                        log.debug("TLS handshake with %s failed: %s", self.client_address, err)
                        self.tls_failed = True
                    self.connection.settimeout(None)

            def handle(self) -> None:
                if not self.tls_failed:
                    super().handle()

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.split("?")[0] in ("/healthz", "/readyz"):
                    self._reply(200, b"ok", "text/plain")
                else:
                    self._reply(404, b"not found", "text/plain")

            def do_POST(self) -> None:
                handler = handlers.get(self.path.split("?")[0])
                if handler is None:
                    self._reply(404, b"not found", "text/plain")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > MAX_BODY:
                    self._reply(400, b"request body missing or too large", "text/plain")
                    return
                try:
                    review = json.loads(self.rfile.read(length))
                    request = review["request"]
                    if not isinstance(request, dict):
                        raise TypeError("request is not an object")
                except (ValueError, KeyError, TypeError) as err:
                    self._reply(400, f"not an AdmissionReview: {err}".encode(), "text/plain")
                    return
                try:
                    verdict = handler(request)
                except Exception as err:  # a lookup failure must not kill the server
                    log.exception("admission of %s failed", request.get("uid"))
                    verdict = Verdict(allowed=False, message=f"hami-dra webhook could not decide: {err}")
                server.reviews += 1
                self._reply(200, json.dumps(review_response(request, verdict)).encode())

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
