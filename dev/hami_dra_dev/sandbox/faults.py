"""Fault injection for tests: make the API server fail, throttle, stall or drop watches on demand.

    server.faults.inject(r"/resourceclaims/", status=500, count=2)      # next 2 matching requests
    server.faults.inject(r"/resourceslices", status=429, methods={"POST"})
    server.faults.inject(r"/pods", delay=0.5, count=1)                 # slow, then served normally
    server.faults.close_watches("resourceclaims.resource.k8s.io")       # streams end; clients re-watch

Rules match the request path (regular expression, ``re.search``) and optionally the method.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from hami_dra_dev.sandbox.errors import ApiError

#: Status reasons Kubernetes uses with these codes (clients branch on them, e.g. IsConflict).
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    pattern: re.Pattern[str]
    status: int | None
    delay: float
    remaining: int | None  # None = until cleared
    methods: frozenset[str] | None
    hits: int = 0
    #: Deterministic hold: matching requests wait (before they are applied) until it is set.
    hold: threading.Event | None = None
    #: Set once a held request has been applied (or refused) and answered.
    released: threading.Event = field(default_factory=threading.Event)


class Faults:
    """The set of active faults; thread-safe; consulted once per request."""

    def __init__(self, close_watches: Callable[[str | None], int]) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._close_watches = close_watches

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
        """Fail (``status``), delay, or hold (until ``hold`` is set) the next ``count`` matching requests.

        A held request is applied when released, with what it carried when it arrived (its
        resourceVersion included): a write that hung in flight and lands late.
        """
        if status is None and delay <= 0 and hold is None:
            raise ValueError("a fault needs a status, a delay, a hold, or a combination")
        fault = Fault(
            re.compile(path),
            status,
            delay,
            count,
            frozenset(m.upper() for m in methods) if methods else None,
            hold=hold,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def close_watches(self, resource: str | None = None) -> int:
        """End open watch streams (for ``resource``, a store key such as ``pods``; all if None)."""
        return self._close_watches(resource)

    def match(self, method: str, path: str) -> tuple[float, ApiError | None, Fault | None]:
        """The delay to apply, the error to return (if any) and the matching fault, for this request."""
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
                error = None
                if fault.status == 429:
                    error = ApiError(
                        429,
                        "TooManyRequests",
                        "the server has received too many requests and has asked us to try again later",
                        {"retryAfterSeconds": 1},
                        {"Retry-After": "1"},
                    )
                elif fault.status is not None:
                    reason = REASONS.get(fault.status, "InternalError")
                    error = ApiError(fault.status, reason, f"injected fault ({reason})")
                return fault.delay, error, fault
        return 0.0, None, None
