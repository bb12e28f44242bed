"""The webhook's open connections: a fixed number of them, each with a deadline, and the body
bytes they may hold at once.

A connection is *waiting* from the moment it is accepted, and again after each answer, until its
request has been read whole (TLS handshake, request line, headers, body); then it is *busy* while
the review is decided and answered. A waiting connection has ``timeout`` seconds to become busy,
however it trickles its bytes: a reaper thread closes it at its deadline (per-``recv`` socket
timeouts alone would let a client sending a byte every few seconds hold it forever).

Two things are scarce, and for both the same rule makes room: the connection that has waited
longest without completing its request gives way. At the connection cap a new connection closes
the longest-waiting one; when body bytes run short (``max_inflight_bytes``), a request closes the
connections that have held a reservation longest while still sending their body. The API server
sends its request, body included, right after the handshake, so its connections are the youngest
waiters, never the oldest. Only when every connection is busy is a new one refused (closed at
once). Connections are closed with ``shutdown``, which wakes the thread blocked reading them; a
slot is free when that thread has finished, so there are never more than ``limit`` of them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: Seconds the accept loop waits for a closed connection's thread to hand back its slot.
EVICTION_GRACE = 1.0
#: Seconds between two warnings that connections were refused or evicted.
WARN_EVERY = 60.0


@dataclass(eq=False)
class Connection:
    """One accepted connection; ``sock`` becomes the TLS socket once the handler has wrapped it."""

    sock: socket.socket
    address: Any
    since: float  # when the current wait began: the deadline is since + timeout (idle_timeout)
    busy: bool = False  # its request is read: no deadline, never evicted
    idle: bool = False  # kept alive after an answer, no byte of its next request received yet
    queued: bool = False  # waiting for body bytes (a wait bounded by its own deadline)
    reserved: int = 0  # body bytes it holds
    reserved_at: float = 0.0
    closed_because: str | None = None


def shut(sock: socket.socket) -> None:
    """Wake whoever is blocked on ``sock``: both directions are shut, the descriptor stays open.

    ``socket.socket.shutdown`` is called directly: ``SSLSocket.shutdown`` would also drop the TLS
    object under the thread that is reading it.
    """
    with contextlib.suppress(OSError):  # already closed or detached: nothing is blocked on it
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class ConnectionTable:
    """At most ``limit`` connections and ``max_inflight_bytes`` body bytes; waiting connections
    are closed ``timeout`` seconds after they began to wait, idle ones (kept alive after an
    answer, silent since) ``idle_timeout`` seconds after it (``timeout`` when None)."""

    def __init__(
        self,
        limit: int,
        timeout: float,
        max_inflight_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        idle_timeout: float | None = None,
    ) -> None:
        self.limit = limit
        self.timeout = timeout
        self.idle_timeout = timeout if idle_timeout is None else idle_timeout
        self.max_inflight_bytes = max_inflight_bytes
        self._free_bytes = max_inflight_bytes
        self._clock = clock
        self._open: set[Connection] = set()
        self._changed = threading.Condition()
        self._counts: Counter[str] = Counter()  # refused, evicted, timed_out
        self._unreported: Counter[str] = Counter()
        self._last_warning = float("-inf")
        self._stopped = threading.Event()
        self._reaper: threading.Thread | None = None

    # --- counts, for logs and tests -----------------------------------------------------------

    @property
    def open(self) -> int:
        with self._changed:
            return len(self._open)

    @property
    def free_bytes(self) -> int:
        with self._changed:
            return self._free_bytes

    def count(self, what: str) -> int:
        """How many connections were ``refused``, ``evicted`` or ``timed_out`` so far."""
        with self._changed:
            return self._counts[what]

    # --- the accept loop ----------------------------------------------------------------------

    def admit(self, sock: socket.socket, address: Any) -> Connection | None:
        """A slot for a new connection, or None (refused: no connection could make room)."""
        with self._changed:
            if len(self._open) >= self.limit:
                oldest = self._longest_waiting()
                if oldest is None:
                    self._counted("refused")
                    return None
                self._close(oldest, "evicted")
                if not self._changed.wait_for(lambda: len(self._open) < self.limit, EVICTION_GRACE):
                    self._counted("refused")
                    return None
            connection = Connection(sock, address, self._clock())
            self._open.add(connection)
            return connection

    # --- connection threads -------------------------------------------------------------------

    def rebind(self, connection: Connection, sock: socket.socket) -> None:
        """``sock`` (the TLS socket) replaces the accepted one; shut at once if closed meanwhile."""
        with self._changed:
            connection.sock = sock
            if connection.closed_because is not None:
                shut(sock)

    def waiting(self, connection: Connection) -> None:
        """The connection waits for its next request (after an answer): idle, with its deadline."""
        with self._changed:
            connection.busy = False
            connection.idle = True
            connection.since = self._clock()

    def receiving(self, connection: Connection) -> None:
        """The first byte of the next request came: it has ``timeout`` seconds to arrive whole."""
        with self._changed:
            connection.idle = False
            connection.since = self._clock()

    def working(self, connection: Connection) -> None:
        """The request has been read whole: no deadline while it is decided and answered."""
        with self._changed:
            connection.busy = True

    def reserve_body(self, connection: Connection, size: int) -> bool:
        """Reserve ``size`` body bytes; False when none came free before the connection's deadline.

        When bytes are short, the connections that have held theirs longest while still sending
        their body are closed to make room.
        """
        if size > self.max_inflight_bytes:
            return False
        with self._changed:
            connection.queued = True
            try:
                if self._free_bytes < size:
                    self._make_room(size - self._free_bytes, connection)
                deadline = self._deadline(connection)
                if not self._changed.wait_for(lambda: self._free_bytes >= size, deadline - self._clock()):
                    return False
                self._free_bytes -= size
                connection.reserved, connection.reserved_at = size, self._clock()
                return True
            finally:
                connection.queued = False

    def release_body(self, connection: Connection) -> None:
        with self._changed:
            self._free_bytes += connection.reserved
            connection.reserved = 0
            self._changed.notify_all()

    def release(self, connection: Connection) -> None:
        """The connection's thread is done: its slot (and any bytes it still held) are free."""
        with self._changed:
            self._free_bytes += connection.reserved
            connection.reserved = 0
            self._open.discard(connection)
            self._changed.notify_all()

    # --- the reaper ---------------------------------------------------------------------------

    def close_overdue(self) -> float:
        """Close waiting connections past their deadline; seconds until the next deadline."""
        now = self._clock()
        pause = min(self.timeout, self.idle_timeout)
        with self._changed:
            for connection in list(self._open):
                if not self._waiting(connection):
                    continue
                left = self._deadline(connection) - now
                if left <= 0:
                    self._close(connection, "timed_out")
                else:
                    pause = min(pause, left)
        self._report()
        return pause

    def start(self) -> None:
        self._reaper = threading.Thread(target=self._reap, name="webhook-reaper", daemon=True)
        self._reaper.start()

    def stop(self) -> None:
        """Stop the reaper and close every connection."""
        self._stopped.set()
        with self._changed:
            for connection in self._open:
                self._close(connection, "stopped")
        if self._reaper is not None:
            self._reaper.join()

    def _reap(self) -> None:
        # Every deadline is set as now + timeout or now + idle_timeout, and the pause is never
        # longer than either, so none falls before the pause computed here ends.
        while not self._stopped.wait(self.close_overdue()):
            pass

    # --- internals (called with the lock held, except _report) -------------------------------

    @staticmethod
    def _waiting(connection: Connection) -> bool:
        """Whether the connection may be closed for its client's slowness (deadline, eviction).

        A queued connection is not: its thread sleeps on the byte budget, which a closed socket
        does not wake; that wait ends at the deadline by itself.
        """
        return not (connection.busy or connection.queued or connection.closed_because)

    def _deadline(self, connection: Connection) -> float:
        return connection.since + (self.idle_timeout if connection.idle else self.timeout)

    def _longest_waiting(self) -> Connection | None:
        return min(filter(self._waiting, self._open), key=lambda c: c.since, default=None)

    def _make_room(self, needed: int, requester: Connection) -> None:
        holders = sorted(
            (c for c in self._open if c.reserved and c is not requester and self._waiting(c)),
            key=lambda c: c.reserved_at,
        )
        for holder in holders:
            if needed <= 0:
                break
            needed -= holder.reserved
            self._close(holder, "evicted")

    def _close(self, connection: Connection, why: str) -> None:
        connection.closed_because = why
        if why != "stopped":
            self._counted(why)
        shut(connection.sock)

    def _counted(self, what: str) -> None:
        self._counts[what] += 1
        if what != "timed_out":
            self._unreported[what] += 1

    def _report(self) -> None:
        """At most one warning a minute about refused or evicted connections."""
        with self._changed:
            now = self._clock()
            if not self._unreported or now - self._last_warning < WARN_EVERY:
                return
            seen, self._unreported = self._unreported, Counter()
            self._last_warning = now
        log.warning(
            "webhook under pressure: %d new connection(s) refused, %d connection(s) closed to make room "
            "for others since the last report (limits: %d connections, %d body bytes in flight); some "
            "client opens connections or announces bodies without sending them: restrict who reaches "
            "the webhook (webhook.networkPolicy) or raise --max-connections / --max-inflight-bytes",
            seen["refused"],
            seen["evicted"],
            self.limit,
            self.max_inflight_bytes,
        )
