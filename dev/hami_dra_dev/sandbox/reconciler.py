"""A tiny level-triggered control loop for the sandbox's simulated control-plane parts.

Each simulated component (resourceclaim controller, scheduler) reconciles the *whole* sandbox
state whenever a watched resource changes, and at least every ``resync`` seconds. At sandbox
scale (tens of objects) this is cheap, and it is simpler and more robust than per-object queues:
a failed write (conflict, injected fault) is simply retried on the next pass.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from hami_dra_dev.sandbox.api import Api
from hami_dra_dev.sandbox.store import Watcher

log = logging.getLogger(__name__)


class Reconciler:
    """Subclasses set ``name`` and ``watches`` (store keys) and implement :meth:`reconcile`."""

    name = "reconciler"
    watches: tuple[str, ...] = ()

    def __init__(self, api: Api, resync: float = 1.0) -> None:
        self.api = api
        self.resync = resync
        self._wake: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._watchers: list[Watcher] = []
        self._thread: threading.Thread | None = None
        self.passes = 0

    def start(self) -> None:
        for key in self.watches:
            watcher, _ = self.api.store.watch(key, None, None)
            self._watchers.append(watcher)
            threading.Thread(
                target=self._forward, args=(watcher,), name=f"{self.name}-{key}", daemon=True
            ).start()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _forward(self, watcher: Watcher) -> None:
        while not self._stop.is_set():
            if watcher.queue.get() is None:
                return
            self._wake.put(True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:  # a simulated component must keep running, like a real controller
                log.exception("sandbox %s pass failed", self.name)
            self.passes += 1
            try:
                self._wake.get(timeout=self.resync)
                while not self._wake.empty():  # coalesce bursts of events into one pass
                    self._wake.get_nowait()
            except queue.Empty:
                pass

    def kick(self) -> None:
        """Run a pass soon (tests call this instead of waiting for the resync period)."""
        self._wake.put(True)

    def stop(self) -> None:
        self._stop.set()
        for watcher in self._watchers:
            watcher.close()  # wakes the forwarding thread (unwatch alone would leave it blocked)
            self.api.store.unwatch(watcher)
        self._wake.put(True)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def reconcile(self) -> None:
        raise NotImplementedError
