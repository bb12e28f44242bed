"""The crash-consistency test hook: ``HAMI_DRA_FAILPOINT=<name>`` kills the plugin at ``<name>``.

The kill must be real wherever the plugin runs. A host process dies of its own SIGKILL; the
chart's plugin container runs ``hami-dra`` as PID 1 of its PID namespace, and the kernel drops
any signal a namespace's init sends itself without a handler, SIGKILL included, so there the
process would carry on past the failpoint and the test would exercise nothing. ``os._exit``
ends it the same abrupt way (no ``finally``, no atexit, no flush): what a crash leaves on disk
is what was fsynced before it.
"""

from __future__ import annotations

import logging
import os
import signal

LOG = logging.getLogger(__name__)

FAILPOINT_ENV = "HAMI_DRA_FAILPOINT"
#: The exit status of a process killed by SIGKILL, as the container runtime reports it.
KILLED_STATUS = 128 + signal.SIGKILL


def hit(name: str) -> None:
    """Die here, at once, if the hook names ``name``; otherwise nothing."""
    if os.environ.get(FAILPOINT_ENV) != name:
        return
    LOG.error("failpoint %s: killing the process", name)
    kill_self()


def kill_self() -> None:
    """SIGKILL this process; exit as abruptly if that signal was dropped (PID 1, see above).
    Unit tests replace this function to see where a call would have died."""
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(KILLED_STATUS)
