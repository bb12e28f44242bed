"""Wait for the NVIDIA driver instead of exiting: the GPU Operator installs it after we start.

Under the GPU Operator the driver root (``/run/nvidia/driver``) is empty, or does not exist, until
the driver container has built the kernel module and mounted its root there, minutes after every
other pod of the node started. The chart mounts that directory ``DirectoryOrCreate`` with
``HostToContainer`` propagation, as NVIDIA's DRA driver does, so the plugin's pod starts and later
sees the driver appear. Until NVML loads the plugin retries, logging one line that says what it
waits for and which value to check, instead of exiting into a crash loop whose back-off delays
the node's GPUs for minutes after the driver is there. Meanwhile ``/healthz`` answers (kubelet
must not restart a process that only waits) and ``/readyz`` says why the node publishes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dra_driver.devices.model import Gpu
from dra_driver.devices.source import DriverNotReady
from dra_driver.metrics import MetricsServer

LOG = logging.getLogger(__name__)

#: How often a line is repeated while the reason stays the same (a new reason is logged at once).
REPEAT_SECONDS = 300.0


class DriverWait:
    """Runs discovery until the driver answers; :meth:`ready` is the ``/readyz`` check meanwhile."""

    def __init__(
        self,
        discover: Callable[[], list[Gpu]],
        stop: threading.Event,
        *,
        retry_seconds: float = 10.0,
        repeat_seconds: float = REPEAT_SECONDS,
    ) -> None:
        self.discover = discover
        self.stop = stop
        self.retry_seconds = retry_seconds
        self.repeat_seconds = repeat_seconds
        self.waiting_for: str | None = None

    def ready(self) -> str | None:
        if self.waiting_for is None:
            return "discovering the node's GPUs"
        return f"waiting for the NVIDIA driver: {self.waiting_for}"

    def run(self) -> list[Gpu] | None:
        """The node's GPUs once NVML answers; None when ``stop`` was set while waiting.

        Only :class:`DriverNotReady` is waited on: a wrong flag or a driver that answers but
        cannot describe its GPUs is not something time fixes, and still ends the process.
        """
        logged_at = 0.0
        logged: str | None = None
        start = time.monotonic()
        while True:
            try:
                gpus = self.discover()
            except DriverNotReady as err:
                self.waiting_for = str(err)
                now = time.monotonic()
                if self.waiting_for != logged or now - logged_at >= self.repeat_seconds:
                    LOG.warning(
                        "waiting for the NVIDIA driver (NVML not loaded, retrying every %gs): %s",
                        self.retry_seconds,
                        self.waiting_for,
                    )
                    logged, logged_at = self.waiting_for, now
                if self.stop.wait(self.retry_seconds):
                    return None
                continue
            if logged is not None:
                waited = time.monotonic() - start
                LOG.warning("NVIDIA driver ready after %.0fs: NVML loaded, %d GPU(s)", waited, len(gpus))
            return gpus


def serve_while_waiting(wait: DriverWait, port: int | None, host: str) -> MetricsServer | None:
    """``/healthz`` and ``/readyz`` (503 with the reason) on the plugin's metrics port while it
    waits; the caller stops it before the plugin binds the port for good. None without a port."""
    if not port:
        return None
    from prometheus_client import CollectorRegistry

    return MetricsServer(CollectorRegistry(auto_describe=True), port, host, ready=wait.ready).start()
