"""AdmissionReview v1 over HTTPS: ``POST /mutate``, ``/mutate-hami``, ``/mutate-claims``, ``/validate``;
``GET /healthz``, ``/readyz`` (serving) and ``/metrics`` (``metrics.py``).

A small ``http.server``: admission requests are tiny and the API server retries, so a framework
would add weight without adding safety. A malformed review gets a 4xx with a one-line reason,
never a traceback; an internal error while deciding is logged and answered as a denied review
whose message says so (the chart's failurePolicy decides what the API server does).

With ``failurePolicy: Fail`` a webhook that stops answering refuses every pod with claims, so no
client may exhaust it (``ServerLimits``): at most ``max_connections`` connections, one thread each;
a deadline for every request, TLS handshake, headers and body included, and a longer one (above
kube-apiserver's own idle timeout) for the keep-alive wait after it; bounded body bytes in flight
(``connections.py``: when short, the client that has waited longest without completing its
request gives way); bounded headers and bodies. TLS is negotiated on the connection's own thread
with the certificate current at that moment (``tls.py`` reloads renewed files).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

from prometheus_client.exposition import choose_encoder

from dra_driver.webhook.admission import (
    Verdict,
    mutate_pod,
    review_response,
    translate_hami_pod,
    validate_object,
)
from dra_driver.webhook.claims import finalize_claim
from dra_driver.webhook.clientauth import ClientAuth
from dra_driver.webhook.connections import Connection, ConnectionTable
from dra_driver.webhook.limits import HeaderReader, ServerLimits
from dra_driver.webhook.lookup import Lookup
from dra_driver.webhook.metrics import WebhookMetrics
from dra_driver.webhook.optin import TRANSLATE_MODES
from dra_driver.webhook.tls import ReloadingCertificate, tls_context

__all__ = ["ReloadingCertificate", "ServerLimits", "WebhookServer", "tls_context"]

log = logging.getLogger(__name__)

Decide = Callable[[Mapping[str, Any]], Verdict]


class WebhookServer:
    """Owns the HTTP(S) server and the decision functions; ``start()`` serves in a thread.

    ``ssl_context`` serves one fixed certificate; ``certificate`` one reloaded when its files change.
    """

    def __init__(
        self,
        lookup: Lookup,
        driver: str,
        *,
        host: str = "0.0.0.0",
        port: int = 8443,
        ssl_context: ssl.SSLContext | None = None,
        certificate: ReloadingCertificate | None = None,
        hami_device_class: str | None = None,
        hami_translate: str = "namespaces",
        limits: ServerLimits | None = None,
        client_auth: ClientAuth | None = None,
    ) -> None:
        """``client_auth``: answer reviews only over connections with the API server's certificate
        (``clientauth.py``); it must be the one ``certificate`` was built with, and is applied to
        ``ssl_context`` here."""
        if hami_translate not in TRANSLATE_MODES:
            raise ValueError(
                f"hami_translate must be one of {', '.join(TRANSLATE_MODES)}, not {hami_translate!r}"
            )
        self.lookup = lookup
        self.driver = driver
        self.client_auth = client_auth
        if client_auth is not None and ssl_context is not None:
            client_auth.configure(ssl_context)
        self.reviews = 0
        self.limits = limits or ServerLimits()
        problems = self.limits.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.tls: Callable[[], ssl.SSLContext] | None = (
            certificate.context if certificate is not None
            else (lambda: ssl_context) if ssl_context is not None
            else None
        )  # fmt: skip
        translate = hami_translate != "off"
        self.handlers = _handlers(lookup, driver, hami_device_class or driver, translate)
        self.connections = ConnectionTable(
            self.limits.max_connections,
            self.limits.connection_timeout,
            self.limits.max_inflight_bytes,
            idle_timeout=self.limits.idle_timeout,
        )
        self.metrics = WebhookMetrics(sorted(self.handlers))
        self.metrics.watch_connections(self.connections.count, lambda: self.connections.open)
        self.httpd = _BoundedHTTPServer((host, port), self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.connections.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.connections.stop()
        self.httpd.server_close()

    def review(self, decide: Decide, body: bytes, path: str = "") -> tuple[int, bytes, str]:
        """Status, body and content type of the answer to one AdmissionReview ``body`` (counted
        under ``path`` in the metrics)."""
        started = time.perf_counter()
        try:
            review = json.loads(body)
            request = review["request"]
            if not isinstance(request, dict):
                raise TypeError("request is not an object")
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            self.metrics.reviews.labels(path, "malformed").inc()
            return 400, f"not an AdmissionReview: {err}".encode(), "text/plain"
        try:
            verdict = decide(request)
            outcome = "allowed" if verdict.allowed else "denied"
        except Exception as err:  # a lookup failure must not kill the server
            log.exception("admission of %s failed", request.get("uid"))
            verdict = Verdict(allowed=False, message=f"hami-dra webhook could not decide: {err}")
            outcome = "error"
        self.reviews += 1
        self.metrics.reviews.labels(path, outcome).inc()
        self.metrics.latency.labels(path).observe(time.perf_counter() - started)
        return 200, json.dumps(review_response(request, verdict)).encode(), "application/json"


def _handlers(lookup: Lookup, driver: str, device_class: str, translate: bool) -> dict[str, Decide]:
    """Path -> decision. ``/mutate-hami`` (with ``translate``) answers from the review alone;
    ``/mutate-claims`` puts our finalizer on new claims of our classes (claims.py)."""
    handlers: dict[str, Decide] = {
        "/mutate": lambda request: mutate_pod(request, lookup),
        "/mutate-claims": lambda request: finalize_claim(request, lookup),
        "/validate": lambda request: validate_object(request, driver),
    }
    if translate:
        handlers["/mutate-hami"] = lambda request: translate_hami_pod(request, device_class, driver)
    return handlers


class _BoundedHTTPServer(HTTPServer):
    """One thread per admitted connection, never more than the connection table allows."""

    # The kernel's queue of connections not accepted yet; accepting is quick, but a burst of
    # connections from several API servers should not be dropped before it is looked at.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], webhook: WebhookServer) -> None:
        self.webhook = webhook
        super().__init__(address, _ReviewHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        connection = self.webhook.connections.admit(request, client_address)
        if connection is None:
            log.debug("refused a connection from %s: every connection is busy", client_address)
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(connection, client_address), name="webhook-connection", daemon=True
        )
        try:
            thread.start()
        except RuntimeError as err:  # no thread to be had: refuse, do not die
            log.warning("cannot start a thread for a webhook connection: %s", err)
            self._done(connection)

    def _serve(self, connection: Connection, client_address: Any) -> None:
        try:
            self.finish_request(connection, client_address)  # type: ignore[arg-type]
        except Exception as err:  # a client that misbehaves or goes away: its connection ends
            log.debug("connection from %s ended: %s", client_address, err)
        finally:
            self._done(connection)

    def _done(self, connection: Connection) -> None:
        self.shutdown_request(connection.sock)
        self.webhook.connections.release(connection)


class _ReviewHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    tls_failed = False
    # Set in setup(); ``request`` arrives as the connection's table entry.
    record: Connection
    rfile: Any

    @property
    def webhook(self) -> WebhookServer:
        return cast(_BoundedHTTPServer, self.server).webhook

    def setup(self) -> None:
        # TLS is negotiated here, on this connection's own thread, not in the accept loop: a client
        # that connects and stays silent must not stall every other review.
        self.record = cast(Connection, self.request)
        sock = self.record.sock
        sock.settimeout(self.webhook.limits.connection_timeout)  # each recv; the table: the total
        tls = self.webhook.tls
        if tls is not None:
            try:
                sock = tls().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                self.webhook.connections.rebind(self.record, sock)
                sock.do_handshake()
            except OSError as err:  # ssl.SSLError, timeouts and closed connections included
                log.debug("TLS handshake with %s failed: %s", self.client_address, err)
                self.tls_failed = True
        self.request = sock
        super().setup()
        self.rfile = HeaderReader(self.rfile)

    def handle(self) -> None:
        if not self.tls_failed:
            super().handle()

    def handle_one_request(self) -> None:
        if self.record.idle and not self._next_request_began():
            self.close_connection = True
            return
        self.rfile.new_request()
        super().handle_one_request()
        if not self.close_connection:
            self.webhook.connections.waiting(self.record)

    def _next_request_began(self) -> bool:
        """Wait, kept alive, up to the idle timeout for the next request's first byte; False when
        the client closed the connection, the wait timed out, or the table closed it.

        Only then does the request's own deadline start (``connection_timeout``): a connection
        kept idle longer than kube-apiserver keeps its own must never be closed by us first.
        """
        limits = self.webhook.limits
        try:
            self.request.settimeout(limits.idle_timeout)
            began = bool(self.rfile.peek(1))
            self.request.settimeout(limits.connection_timeout)
        except OSError:
            return False
        if began:
            self.webhook.connections.receiving(self.record)
        return began

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, code: int, reason: str) -> None:
        """Answer ``code`` and close: the body, if any, was not read, so the stream is unusable."""
        self.close_connection = True
        self._reply(code, reason.encode(), "text/plain")

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path in ("/healthz", "/readyz"):
            self._reply(200, b"ok", "text/plain")
        elif path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._reply(200, encoder(self.webhook.metrics.registry), content_type)
        else:
            self._reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        decide = self.webhook.handlers.get(self.path.split("?")[0])
        if decide is None:
            self._refuse(404, "not found")
            return
        client_auth = self.webhook.client_auth
        if client_auth is not None:
            getpeercert = getattr(self.request, "getpeercert", None)
            refusal = client_auth.refusal(getpeercert() if getpeercert is not None else None)
            if refusal is not None:
                self.webhook.metrics.reviews.labels(self.path.split("?")[0], "unauthenticated").inc()
                self._refuse(403, refusal)
                return
        length = self._content_length()
        if length is None:
            return
        connections = self.webhook.connections
        if not connections.reserve_body(self.record, length):
            self._refuse(503, "webhook busy: too many review bytes in flight, retry")
            return
        try:
            body = self.rfile.read(length)
            if len(body) != length:  # the client went away, or the connection was closed for it
                self.close_connection = True
                return
            connections.working(self.record)
            answer = self.webhook.review(decide, body, self.path.split("?")[0])
        finally:
            connections.release_body(self.record)
        self._reply(*answer)

    def _content_length(self) -> int | None:
        """The body's announced length, or None after refusing the request (and closing)."""
        limit = self.webhook.limits.max_request_bytes
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send the review with a Content-Length, not chunked")
            return None
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._refuse(411, "Content-Length required")
            return None
        if length <= 0:
            self._refuse(400, "request body missing")
            return None
        if length > limit:
            self._refuse(
                413, f"request body of {length} bytes is above the limit of {limit} (--max-request-bytes)"
            )
            return None
        return length
