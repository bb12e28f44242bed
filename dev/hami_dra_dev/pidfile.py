"""The pid file of a foreground development command (``sandbox up``, ``cluster up``) and its stop.

``up`` writes its pid; ``down`` and ``status`` find it there, check it still runs, and stop it
with SIGTERM (the command then stops what it started), waiting a bounded time.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process still runs."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, then wait up to ``timeout`` seconds for the process to exit; True if it did."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False
