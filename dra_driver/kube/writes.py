"""``retry_on_conflict``: the controller's one way to write an object it may have read stale.

Every write carries the resourceVersion it was computed from, so a concurrent writer (another
replica, kube-scheduler, kubelet) makes it fail with 409 instead of being overwritten; the write
is then computed again from a fresh read. Other errors are the caller's: what a 404 or a 500 means
depends on the object (a claim gone, a gate to retry later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dra_driver.kube.api import Obj
from dra_driver.kube.errors import KubeError

MAX_WRITE_ATTEMPTS = 5
T = TypeVar("T")


def retry_on_conflict(
    write: Callable[[Obj], T],
    current: Obj,
    reread: Callable[[], Obj],
    *,
    on_conflict: Callable[[], None] | None = None,
    attempts: int = MAX_WRITE_ATTEMPTS,
) -> T:
    """``write(current)``; after a 409, ``reread()`` and ``write`` the fresh object, up to ``attempts``.

    Errors other than 409, and those of the re-read, propagate. When every attempt conflicts the
    last 409 propagates too (the caller retries on a later pass).
    """
    for attempt in range(attempts):
        try:
            return write(current)
        except KubeError as err:
            if not err.conflict or attempt == attempts - 1:
                raise
            if on_conflict is not None:
                on_conflict()
            current = reread()
    raise AssertionError("unreachable: attempts must be at least 1")
