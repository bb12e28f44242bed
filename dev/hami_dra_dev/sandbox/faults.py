"""Fault injection for tests: make the API server fail, throttle, stall or drop watches on demand.

    server.faults.inject(r"/resourceclaims/", status=500, count=2)      # next 2 matching requests
    server.faults.inject(r"/resourceslices", status=429, methods={"POST"})
    server.faults.inject(r"/pods", delay=0.5, count=1)                 # slow, then served normally
    server.faults.close_watches("resourceclaims.resource.k8s.io")       # streams end; clients re-watch

The rules are ``hami_dra_dev/faults.py``'s (the tests' client-side faults share them); this is the
server's side: the error it answers a failed request with, and the watches it can end.
"""

from __future__ import annotations

from collections.abc import Callable

from hami_dra_dev.faults import Fault, FaultRules
from hami_dra_dev.sandbox.errors import ApiError

__all__ = ["Fault", "Faults"]


class Faults(FaultRules):
    """The set of active faults, and the server's open watches to end."""

    def __init__(self, close_watches: Callable[[str | None], int]) -> None:
        super().__init__()
        self._close_watches = close_watches

    def close_watches(self, resource: str | None = None) -> int:
        """End open watch streams (for ``resource``, a store key such as ``pods``; all if None)."""
        return self._close_watches(resource)

    def match(self, method: str, path: str) -> tuple[float, ApiError | None, Fault | None]:
        """The delay to apply, the error to return (if any) and the matching fault, for this
        request. A held request is applied when released, with what it carried when it arrived
        (its resourceVersion included): a write that hung in flight and lands late."""
        fault = self.take(method, path)
        if fault is None:
            return 0.0, None, None
        return fault.delay, _answer(fault), fault


def _answer(fault: Fault) -> ApiError | None:
    """The error a failing fault is answered with, as kube-apiserver words it."""
    if fault.status == 429:
        return ApiError(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
            {"retryAfterSeconds": 1},
            {"Retry-After": "1"},
        )
    if fault.status is not None:
        return ApiError(fault.status, fault.reason, f"injected fault ({fault.reason})")
    return None
