"""The bounds that keep the webhook answering whatever its clients do.

With ``failurePolicy: Fail`` a webhook that stops answering refuses every pod with claims in the
cluster, so no client may exhaust it: a connection costs a thread and TLS state, a request body
costs its bytes and, once decoded, up to about 25 times that in Python objects. ``ServerLimits``
holds the numbers (``hami-dra webhook`` flags; ``connections.py`` enforces the connection, time
and body-byte limits), and ``HeaderReader`` bounds the request line and headers of one request
(the standard library would accept 100 header lines of 64 KiB each).
"""

from __future__ import annotations

import http.client
import io
from dataclasses import dataclass

#: Request line plus headers of one request. The API server sends a few hundred bytes.
MAX_HEADER_BYTES = 32 * 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one webhook process accepts at once (defaults: see ``hami-dra webhook --help``)."""

    #: Open connections (each is one thread). At the cap the longest-waiting connection that has
    #: not delivered its request yet is closed to make room; with none, the new one is closed.
    max_connections: int = 64
    #: Seconds a connection has, from connecting or from the first byte of a request, to deliver
    #: the complete request (TLS handshake, request line, headers, body); then it is closed.
    connection_timeout: float = 10.0
    #: Seconds a kept-alive connection may stay silent after our answer before its next request
    #: begins. Longer than kube-apiserver's own idle timeout for webhook connections (90 s), so
    #: the API server closes an idle connection first: a webhook that closed it first could do so
    #: just as the API server sends a review on it, which then fails ("broken pipe") and refuses
    #: the pod being created. An idle connection is still closed to make room at the cap.
    idle_timeout: float = 120.0
    #: Largest AdmissionReview body: the API server's own request limit, so no review it sends is
    #: refused for its size.
    max_request_bytes: int = 3 * 1024 * 1024
    #: Body bytes being read, decoded and decided at once, across all connections; when short, the
    #: connections that hold bytes longest while still sending their body are closed.
    max_inflight_bytes: int = 4 * 1024 * 1024

    def problems(self) -> list[str]:
        """What is wrong with these limits, phrased with the command's flag names."""
        found = []
        if self.max_connections < 1:
            found.append(f"--max-connections must be at least 1, got {self.max_connections}")
        if not self.connection_timeout > 0:
            found.append(f"--connection-timeout must be above 0 seconds, got {self.connection_timeout}")
        if not self.idle_timeout > 0:
            found.append(f"--idle-timeout must be above 0 seconds, got {self.idle_timeout}")
        if self.max_request_bytes < 1024:
            found.append(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes}")
        if self.max_inflight_bytes < self.max_request_bytes:
            found.append(
                f"--max-inflight-bytes ({self.max_inflight_bytes}) must be at least --max-request-bytes "
                f"({self.max_request_bytes}), or a review of the largest size could never be read"
            )
        return found


class HeaderReader:
    """``rfile`` of a request handler whose ``readline`` (request line and headers) is budgeted.

    ``BaseHTTPRequestHandler`` reads the request line and the headers with ``readline`` and the body
    with ``read``, so only ``readline`` counts. Beyond the budget ``http.client.LineTooLong`` is
    raised, which the handler answers with 431 before closing the connection.
    """

    def __init__(self, raw: io.BufferedReader, budget: int = MAX_HEADER_BYTES) -> None:
        self._raw = raw
        self._budget = budget
        self._left = budget

    def new_request(self) -> None:
        self._left = self._budget

    def peek(self, size: int = 1) -> bytes:
        """The bytes buffered or, when none are, the next ones received (blocks until some come);
        nothing is consumed or counted."""
        return self._raw.peek(size)

    def readline(self, size: int = -1) -> bytes:
        if self._left <= 0:
            raise http.client.LineTooLong(f"request line and headers beyond {self._budget} bytes")
        limit = self._left + 1 if size < 0 else min(size, self._left + 1)
        line = self._raw.readline(limit)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong(f"request line and headers beyond {self._budget} bytes")
        return line

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size)

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._raw.closed
