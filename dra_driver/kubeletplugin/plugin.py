"""Assembles the kubelet plugin: device inventory, preparer, gRPC servers, publisher, health.

``command.py`` builds a :class:`PluginOptions` from flags; tests build one directly and run the
plugin in-process (or as a subprocess through the CLI when they need to kill it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_driver.devices.model import Gpu
from dra_driver.kubeletplugin import cdi
from dra_driver.kubeletplugin.checkpoint import DEFAULT_BOOT_ID_FILE, Checkpoint, read_boot_id
from dra_driver.kubeletplugin.claims import ApiClaimSource, ClaimSource
from dra_driver.kubeletplugin.dra_service import dra_handlers
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.health import HealthFileWatcher, HealthService, HealthState, NvmlHealthWatcher
from dra_driver.kubeletplugin.inventory import Inventory, node_gpu
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.prepare import Preparer, PreparerConfig
from dra_driver.kubeletplugin.registration import RegistrationService
from dra_driver.kubeletplugin.server import PluginServers

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginOptions:
    node_name: str
    driver_name: str
    plugin_dir: Path
    registry_dir: Path
    cdi_dir: Path
    simulated: bool
    hami_core_lib: Path | None = None
    nvidia_cdi_kind: str | None = "nvidia.com/gpu"
    policy_taint: bool = True
    health_file: Path | None = None
    boot_id_file: Path = DEFAULT_BOOT_ID_FILE
    publish: bool = True
    cleanup_seconds: float = 60.0
    metrics_port: int | None = None


class KubeletPlugin:
    """The running plugin; :meth:`start` returns once kubelet can register it."""

    def __init__(
        self, options: PluginOptions, gpus: list[Gpu], api_client: Any, claims: ClaimSource | None = None
    ) -> None:
        self.options = options
        self.gpus = gpus
        self.api_client = api_client
        self.metrics = PluginMetrics()
        self.inventory = Inventory(node_gpu(g) for g in gpus)
        self.health = HealthState([g.name for g in gpus])
        self.health.add_listener(self._on_health)
        self.preparer = Preparer(
            PreparerConfig(
                driver=options.driver_name,
                pool=options.node_name,
                cdi_dir=options.cdi_dir,
                hami=HamiCoreConfig(options.plugin_dir / "hami-core", options.hami_core_lib),
                simulated=options.simulated,
                boot_id=read_boot_id(options.boot_id_file),
                nvidia_cdi_kind=options.nvidia_cdi_kind,
            ),
            self.inventory,
            claims if claims is not None else ApiClaimSource(api_client),
            Checkpoint(options.plugin_dir / "checkpoint.json"),
            self.metrics,
        )
        self.registration = RegistrationService(options.driver_name, str(options.plugin_dir / "dra.sock"))
        self.servers = PluginServers(
            options.plugin_dir,
            options.registry_dir,
            options.driver_name,
            [
                *dra_handlers(self.preparer, self.metrics),
                HealthService(self.health, options.node_name).handler(),
            ],
            self.registration.handler(),
        )
        self.publisher: Any = None
        self._watchers: list[Any] = []
        self._stop = threading.Event()

    def _current_gpus(self) -> list[Gpu]:
        unhealthy = self.health.unhealthy()
        return [replace(g, healthy=g.name not in unhealthy) for g in self.gpus]

    def _on_health(self, snapshot: dict[str, Any]) -> None:
        for name, value in snapshot.items():
            self.metrics.healthy.labels(name).set(1 if value.healthy else 0)
        if self.publisher is not None:
            self.publisher.trigger()

    def check_nvidia_cdi(self) -> None:
        """On real GPUs our CDI IDs rely on the NVIDIA Container Toolkit's spec for device nodes."""
        kind = self.options.nvidia_cdi_kind
        if self.options.simulated or not kind:
            return
        if cdi.find_nvidia_spec(kind, [Path("/etc/cdi"), Path("/var/run/cdi")]) is None:
            LOG.warning(
                "no CDI spec for %s in /etc/cdi or /var/run/cdi: containers will lack GPU device nodes and "
                "driver libraries; generate it on the node with "
                "'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml'",
                kind,
            )

    def start(self) -> None:
        if self.options.hami_core_lib is not None:
            HamiCoreConfig(
                self.options.plugin_dir / "hami-core", self.options.hami_core_lib
            ).ensure_preload_file()
        self.check_nvidia_cdi()
        for gpu in self.gpus:
            self.metrics.healthy.labels(gpu.name).set(1)
        self.preparer.start()
        if self.options.publish and self.api_client is not None:
            from dra_driver.kubeletplugin.publisher import SlicePublisher

            self.publisher = SlicePublisher(
                self.api_client,
                driver_name=self.options.driver_name,
                node_name=self.options.node_name,
                gpus=self._current_gpus,
                policy_taint=self.options.policy_taint,
            )
            self.publisher.start()
        if self.options.health_file is not None:
            watcher = HealthFileWatcher(self.options.health_file, self.health)
            watcher.poll()
            watcher.start()
            self._watchers.append(watcher)
        elif not self.options.simulated:
            nvml = NvmlHealthWatcher({g.name: g.uuid for g in self.gpus}, self.health)
            nvml.start()
            self._watchers.append(nvml)
        if self.options.metrics_port:
            self.metrics.serve(self.options.metrics_port)
        self.servers.start()
        threading.Thread(target=self._deleted_claims_loop, name="deleted-claims", daemon=True).start()

    def _deleted_claims_loop(self) -> None:
        """Report prepared claims deleted from the API: at start-up, then every ``cleanup_seconds``.

        Only a report (log and gauge): such a claim may still back a running container, and only
        kubelet, which unprepares it when the pod ends, knows when its share is free.
        """
        first = True
        while first or not self._stop.wait(self.options.cleanup_seconds):
            first = False
            try:
                self.preparer.report_deleted()
            except Exception:
                LOG.exception("checking prepared claims against the API failed")

    def stop(self) -> None:
        self._stop.set()
        for watcher in self._watchers:
            watcher.stop()
        if self.publisher is not None:
            self.publisher.stop()
        self.servers.stop()
