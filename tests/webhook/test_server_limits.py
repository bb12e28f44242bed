"""The webhook cannot be exhausted: a connection cap, a deadline per request, bounded bodies.

With failurePolicy Fail an exhausted webhook refuses every pod with claims, cluster-wide. These
tests hold connections open, trickle bytes and send oversized bodies against a real HTTPS server
with small limits, and check that reviews are still answered and threads stay bounded.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dra_driver.cli import main as cli_main
from dra_driver.webhook.limits import ServerLimits
from dra_driver.webhook.server import WebhookServer, tls_context
from tests.waiting import wait_for
from tests.webhook.test_webhook import FakeLookup, claim_spec, pod, req, review

DRIVER = "gpu.hami.io"
CAP = 8
TIMEOUT = 1.0
IDLE = 3.0
LIMITS = ServerLimits(
    max_connections=CAP,
    connection_timeout=TIMEOUT,
    idle_timeout=IDLE,
    max_request_bytes=64 * 1024,
    max_inflight_bytes=64 * 1024,
)


class BlockingLookup(FakeLookup):
    """Decisions wait in ``is_our_class`` until ``release`` is set: connections stay busy."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        self.claims[("ns", "shared")] = claim_spec(req("gpu"))

    def is_our_class(self, name: str) -> bool | None:
        with self._lock:
            self.waiting += 1
        assert self.release.wait(30), "test never released the lookup"
        return super().is_our_class(name)


@pytest.fixture
def lookup() -> Iterator[BlockingLookup]:
    fake = BlockingLookup()
    fake.release.set()
    yield fake
    fake.release.set()


@pytest.fixture
def server(certs: tuple[Path, Path], lookup: BlockingLookup) -> Iterator[WebhookServer]:
    context = tls_context(str(certs[0]), str(certs[1]))
    instance = WebhookServer(lookup, DRIVER, host="127.0.0.1", port=0, ssl_context=context, limits=LIMITS)
    instance.start()
    yield instance
    instance.stop()


def client_context(certs: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs[0]))


def review_body(padding: int = 0) -> bytes:
    body = {"request": review(pod([{"name": "g", "resourceClaimName": "shared"}]))}
    return json.dumps(body).encode() + b" " * padding


def post(
    server: WebhookServer, certs: tuple[Path, Path], body: bytes, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(certs), timeout=5
    )
    try:
        connection.request(
            "POST", "/mutate", body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def idle_tls(server: WebhookServer, certs: tuple[Path, Path]) -> ssl.SSLSocket:
    """A connection that completes its handshake and then says nothing."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return client_context(certs).wrap_socket(raw, server_hostname="localhost")


def closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closed ``sock`` (None: still open after ``within`` seconds)."""
    started = time.monotonic()
    sock.settimeout(within)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return None
    except (ConnectionResetError, ssl.SSLError):
        data = b""
    assert data == b"", f"unexpected data from the server: {data!r}"
    return time.monotonic() - started


def connection_threads() -> int:
    return sum(thread.name == "webhook-connection" for thread in threading.enumerate())


def test_idle_connections_beyond_the_cap_do_not_lock_out_reviews(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """2 x cap silent TLS connections: each new one closes the longest-waiting one, so the API
    server's review is still answered, and there are never more than cap connection threads."""
    idle = []
    try:
        for _ in range(2 * CAP):
            idle.append(idle_tls(server, certs))
            assert connection_threads() <= CAP
        assert server.connections.open <= CAP
        started = time.monotonic()
        status, data = post(server, certs, review_body())
        assert status == 200 and json.loads(data)["response"]["allowed"] is True
        assert time.monotonic() - started < TIMEOUT, "answered at once, not after the idle ones timed out"
        assert server.connections.count("evicted") >= CAP + 1
        assert connection_threads() <= CAP
        assert closed_by_server(idle[0], within=0.5) is not None, "the oldest idle connection made room"
    finally:
        for sock in idle:
            sock.close()


def test_when_every_connection_is_busy_a_new_one_is_refused_at_once(
    server: WebhookServer, certs: tuple[Path, Path], lookup: BlockingLookup
) -> None:
    lookup.release.clear()
    answers: list[int] = []
    clients = [
        threading.Thread(target=lambda: answers.append(post(server, certs, review_body())[0]))
        for _ in range(CAP)
    ]
    for client in clients:
        client.start()
    try:
        wait_for(lambda: lookup.waiting == CAP, timeout=10, what="every connection deciding")
        started = time.monotonic()
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            idle_tls(server, certs)
        assert time.monotonic() - started < TIMEOUT / 2, "refused quickly, not queued"
        assert server.connections.count("refused") >= 1
        assert connection_threads() <= CAP
    finally:
        lookup.release.set()
        for client in clients:
            client.join(10)
    assert answers == [200] * CAP, "the busy reviews are all answered"


def test_a_silent_connection_is_closed_after_the_timeout(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    for sock in (socket.create_connection(("127.0.0.1", server.port)), idle_tls(server, certs)):
        with sock:
            elapsed = closed_by_server(sock, within=TIMEOUT + 3)
            assert elapsed is not None, "a silent connection must not be kept"
            assert elapsed < TIMEOUT + 1
    wait_for(lambda: server.connections.open == 0, timeout=3, what="slots released")
    assert server.connections.count("timed_out") == 2


def test_a_trickled_request_is_closed_at_its_deadline(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """One header byte every 0.2 s keeps every recv well within its own timeout; the deadline for
    the whole request still closes the connection."""
    request = b"POST /mutate HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 500
    with idle_tls(server, certs) as sock:
        started = time.monotonic()
        sock.settimeout(0.2)
        closed = False
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue  # still open: the next byte
            except (ConnectionError, ssl.SSLError):
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed, "a client that trickles its headers must not hold the connection"
    assert elapsed < TIMEOUT + 1


def kept_alive(server: WebhookServer, certs: tuple[Path, Path]) -> http.client.HTTPSConnection:
    """A connection that has had two answers (the deadline is renewed by each) and is now idle."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(certs), timeout=5
    )
    for _ in range(2):
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b"ok"
    assert connection.sock is not None
    return connection


def test_a_kept_alive_connection_is_kept_idle_longer_than_a_request_may_take(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """kube-apiserver closes its idle webhook connections after 90 s; the webhook keeps them
    longer (``idle_timeout``), so it never closes one as the API server sends a review on it.
    Past the request deadline the connection still answers; past the idle timeout it is closed."""
    connection = kept_alive(server, certs)
    try:
        time.sleep(TIMEOUT + 0.5)
        headers = {"Content-Type": "application/json"}
        connection.request("POST", "/mutate", body=review_body(), headers=headers)
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["response"]["allowed"] is True
        assert connection.sock is not None
        elapsed = closed_by_server(connection.sock, within=IDLE + 3)
        assert elapsed is not None, "an idle connection is closed at the idle timeout"
        assert IDLE - 0.5 < elapsed < IDLE + 1
        assert server.connections.count("timed_out") == 1
    finally:
        connection.close()


def test_a_kept_alive_connection_that_trickles_its_next_request_is_closed_at_the_request_deadline(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """The idle allowance ends with the next request's first byte: from there the request has the
    connection timeout, as a new connection's has."""
    connection = kept_alive(server, certs)
    sock = connection.sock
    assert sock is not None
    try:
        started = time.monotonic()
        sock.sendall(b"POST /mutate HTTP/1.1\r\n")  # then nothing more
        elapsed = closed_by_server(sock, within=TIMEOUT + 3)
        assert elapsed is not None, "a request begun and not finished must not hold the connection"
        assert time.monotonic() - started < TIMEOUT + 1
    finally:
        connection.close()


def raw_response(server: WebhookServer, certs: tuple[Path, Path], head: bytes) -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, no body) and read the answer until the server closes."""
    with idle_tls(server, certs) as sock:
        sock.sendall(head)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_request_bodies_are_bounded(server: WebhookServer, certs: tuple[Path, Path]) -> None:
    limit = LIMITS.max_request_bytes
    exact = review_body()
    exact += b" " * (limit - len(exact))
    status, data = post(server, certs, exact)
    assert status == 200, data
    # Refused from the headers alone, before any of the body is read (and the connection closed).
    status, data = raw_response(
        server, certs, f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {limit + 1}\r\n\r\n".encode()
    )
    assert status == 413
    assert (
        f"request body of {limit + 1} bytes is above the limit of {limit} (--max-request-bytes)"
        in data.decode()
    )
    status, data = raw_response(
        server, certs, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    )
    assert status == 400 and b"request body missing" in data
    status, data = raw_response(
        server, certs, b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert status == 411


def test_headers_are_bounded(server: WebhookServer, certs: tuple[Path, Path]) -> None:
    filler = "".join(f"X-Filler-{i}: {'a' * 1000}\r\n" for i in range(40))  # 40 KiB, above 32 KiB
    status, _ = raw_response(server, certs, f"POST /mutate HTTP/1.1\r\nHost: x\r\n{filler}\r\n".encode())
    assert status == 431


def test_deeply_nested_json_is_a_bad_request_not_a_dead_thread(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    status, data = post(server, certs, b"[" * 60_000)
    assert status == 400 and b"not an AdmissionReview" in data


def test_a_body_announced_but_not_sent_gives_way_to_the_next_review(
    server: WebhookServer, certs: tuple[Path, Path]
) -> None:
    """A client announces the largest body and sends none of it, holding every in-flight byte:
    the next review closes it to make room and is answered at once, not after its deadline."""
    with idle_tls(server, certs) as stalled:
        stalled.sendall(
            f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMITS.max_request_bytes}\r\n\r\n".encode()
        )
        wait_for(
            lambda: server.connections.free_bytes == 0, timeout=3, what="the stalled body's bytes reserved"
        )
        started = time.monotonic()
        status, _ = post(server, certs, review_body())
        assert status == 200
        assert time.monotonic() - started < TIMEOUT / 2, "room was made, not waited for"
        assert closed_by_server(stalled, within=0.5) is not None
    assert server.connections.count("evicted") == 1
    wait_for(
        lambda: server.connections.free_bytes == LIMITS.max_inflight_bytes, timeout=3, what="bytes released"
    )


def test_body_bytes_held_by_busy_reviews_are_waited_for_not_taken(
    certs: tuple[Path, Path], lookup: BlockingLookup
) -> None:
    """Reviews being decided keep their bytes; a review that does not fit waits for them, and gets
    503 at its deadline if they do not come back."""
    body = review_body()
    body += b" " * (1024 - len(body))  # room for exactly one review in flight
    limits = ServerLimits(
        max_connections=CAP, connection_timeout=TIMEOUT, max_request_bytes=1024, max_inflight_bytes=1024
    )
    context = tls_context(str(certs[0]), str(certs[1]))
    server = WebhookServer(lookup, DRIVER, host="127.0.0.1", port=0, ssl_context=context, limits=limits)
    server.start()
    lookup.release.clear()
    first = threading.Thread(target=post, args=(server, certs, body))
    first.start()
    try:
        wait_for(lambda: lookup.waiting == 1, timeout=5, what="the first review deciding")
        status, data = post(server, certs, body)
        assert status == 503 and b"too many review bytes in flight" in data
        lookup.release.set()
        first.join(5)
        status, _ = post(server, certs, body)
        assert status == 200, "the bytes came back with the first answer"
    finally:
        lookup.release.set()
        server.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-connections", "0"], "--max-connections must be at least 1, got 0"),
        (["--connection-timeout", "0"], "--connection-timeout must be above 0 seconds"),
        (["--idle-timeout", "-1"], "--idle-timeout must be above 0 seconds"),
        (
            ["--max-request-bytes", "4096", "--max-inflight-bytes", "1024"],
            "must be at least --max-request-bytes",
        ),
    ],
)
def test_command_rejects_bad_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    cert, key = str(tmp_path / "none.crt"), str(tmp_path / "none.key")
    code = cli_main(["webhook", "--tls-cert-file", cert, "--tls-key-file", key, *flags])
    assert code == 2
    assert message in capsys.readouterr().err


def test_defaults_fit_the_charts_memory_limit() -> None:
    """About 25 bytes of Python objects per JSON byte in the worst case, ~100 KiB per connection:
    the defaults stay well inside the chart's 256 MiB with the interpreter's ~70 MiB."""
    limits = ServerLimits()
    worst = limits.max_inflight_bytes * 25 + limits.max_connections * 100 * 1024
    assert worst < 128 * 1024 * 1024
    assert not limits.problems()
