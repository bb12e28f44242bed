"""Polling for asynchronous outcomes in integration tests (controllers, watches, kubelet simulators)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    check: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.02
) -> Any:
    """Call ``check`` until it returns something truthy and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(interval)
