"""Faults injected on API requests on demand, once for the sandbox API server (which answers them)
and the tests' client-side faults (``tests/client_faults.py``: a real kube-apiserver makes none).

A fault matches the request's path (a regular expression, ``re.search``) and, optionally, its
method; the next ``count`` matching requests (all while it stays, with ``count=None``) fail with
``status``, wait ``delay`` seconds, or are held until ``hold`` is set and then go on as they came
(a request that hung on its way and lands late). ``hits`` counts the matches, so a test can also
check how often a path was asked for.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

#: The ``reason`` kube-apiserver puts in a ``Status`` of each code (clients branch on some, e.g.
#: client-go's ``IsConflict``).
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    """One injected fault: what it matches and does, and what became of it."""

    pattern: re.Pattern[str]
    methods: frozenset[str] | None
    status: int | None
    delay: float
    hold: threading.Event | None
    remaining: int | None  # None: until cleared
    #: Requests it matched so far.
    hits: int = 0
    #: Set once a held request has been sent on and answered (or refused).
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def reason(self) -> str:
        """The ``Status`` reason of its ``status`` (a code not listed reads as a server error)."""
        return REASONS.get(self.status or 500, "InternalError")


class FaultRules:
    """The active faults (thread-safe; consulted once per request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def inject(
        self,
        path: str,
        *,
        status: int | None = None,
        count: int | None = 1,
        delay: float = 0.0,
        methods: set[str] | None = None,
        hold: threading.Event | None = None,
    ) -> Fault:
        """Fail (``status``), delay, or hold (until ``hold`` is set) the next ``count`` matching
        requests."""
        if status is None and delay <= 0 and hold is None:
            raise ValueError("a fault needs a status, a delay, a hold, or a combination")
        chosen = frozenset(m.upper() for m in methods) if methods else None
        fault = Fault(re.compile(path), chosen, status, delay, hold, count)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str) -> Fault | None:
        """The first fault matching this request, its match counted (and used up after its
        ``count``); None for a request that goes through untouched."""
        with self._lock:
            for fault in self._faults:
                if fault.methods is not None and method not in fault.methods:
                    continue
                if not fault.pattern.search(path):
                    continue
                fault.hits += 1
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None
