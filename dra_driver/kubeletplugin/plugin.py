"""Assembles the kubelet plugin: device inventory, preparer, gRPC servers, publisher, health.

``command.py`` builds a :class:`PluginOptions` from flags; tests build one directly and run the
plugin in-process (or as a subprocess through the CLI when they need to kill it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from dra_driver.contract import ISOLATION_NONE
from dra_driver.devices.mig import mig_device_name
from dra_driver.devices.model import Gpu
from dra_driver.devices.nvml_mig_create import MigDriver, NvmlMigDriver
from dra_driver.devices.nvml_session import NvmlSession
from dra_driver.devices.simulated_mig import SimulatedMigDriver
from dra_driver.kube.api import Kube
from dra_driver.kubeletplugin.checkpoint import DEFAULT_BOOT_ID_FILE, Checkpoint, read_boot_id
from dra_driver.kubeletplugin.claims import ApiClaimSource, ClaimSource
from dra_driver.kubeletplugin.control_nodes import HostView
from dra_driver.kubeletplugin.dra_service import dra_handlers
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.hamicore_library import HamiCoreStatus, inspect_library
from dra_driver.kubeletplugin.health import HealthFileWatcher, HealthService, HealthState, NvmlHealthWatcher
from dra_driver.kubeletplugin.inventory import Inventory, node_devices, read_mig_minors
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.mig_on_demand import JOURNAL_NAME, Journal, MigOnDemand
from dra_driver.kubeletplugin.node import NodeReader
from dra_driver.kubeletplugin.node_events import NodeEvents
from dra_driver.kubeletplugin.prepare import Preparer, PreparerConfig
from dra_driver.kubeletplugin.registration import RegistrationService
from dra_driver.kubeletplugin.server import PluginServers, SocketError
from dra_driver.kubeletplugin.toolkit import REGISTRY_DIRS, TOOLKIT_KINDS, ToolkitRegistry
from dra_driver.kubeletplugin.withheld import (
    Withheld,
    cdi_withheld,
    device_plugin_gpus,
    device_plugin_withheld,
)
from dra_driver.metrics import MetricsServer
from dra_driver.resource.nodes import NodeView

LOG = logging.getLogger(__name__)

#: Node event reason when shares are advertised on GPUs nothing enforces them on.
SHARES_NOT_ENFORCED = "SharesNotEnforced"


@dataclass(frozen=True)
class PluginOptions:
    node_name: str
    driver_name: str
    plugin_dir: Path
    registry_dir: Path
    cdi_dir: Path
    simulated: bool
    hami_core_lib: Path | None = None
    #: HAMi-core's GPU_CORE_UTILIZATION_POLICY for shares with a cores limit (``hamicore.py``).
    core_utilization_policy: str = "default"
    #: The toolkit's CDI kind to compose real GPUs' specs with (``toolkit.py``), tried before the GPU
    #: Operator's ``management.nvidia.com/gpu``; None: device nodes only, no driver libraries.
    nvidia_cdi_kind: str | None = "nvidia.com/gpu"
    #: The CDI registry the container runtime reads, where the toolkit's spec lives.
    cdi_registry_dirs: tuple[Path, ...] = REGISTRY_DIRS
    #: Where the host's ``/`` is seen, to find host paths a stale toolkit spec names; None: unchecked.
    host_root: Path | None = Path("/")
    #: The NVIDIA driver root's path on the host, seen here at ``nvidia_driver_root``: host paths below
    #: it (GPU Operator: ``/run/nvidia/driver``) are checked there when ``host_root`` is None.
    host_driver_root: PurePosixPath | None = None
    nvidia_driver_root: Path | None = None
    #: Publish GPUs although NVIDIA's device plugin advertises nvidia.com/gpu on the node.
    allow_device_plugin: bool = False
    #: How often the toolkit spec and the Node are checked again for withheld GPUs.
    recheck_seconds: float = 10.0
    policy_taint: bool = True
    health_file: Path | None = None
    #: ``--health-checks``: off, nothing watches the GPUs (each published as not monitored).
    health_checks: bool = True
    #: XIDs skipped on top of NVIDIA's application XIDs (``--additional-xids-to-ignore``).
    additional_xids_to_ignore: frozenset[int] = frozenset()
    #: ``--mig-on-demand``: the cards marked (``all``, indexes, UUIDs); applied at discovery.
    mig_on_demand: frozenset[str] = frozenset()
    #: A marked GPU is probed this long after its last XID and healthy again if it recovered; 0: never.
    health_recovery_seconds: float = 300.0
    boot_id_file: Path = DEFAULT_BOOT_ID_FILE
    publish: bool = True
    cleanup_seconds: float = 60.0
    #: ``--metrics-bind-address``: the port (None: no metrics server) and the host ("": every
    #: IPv4 interface; an IPv4/IPv6 address or a host name: only there).
    metrics_port: int | None = None
    metrics_host: str = ""


class KubeletPlugin:
    """The running plugin; :meth:`start` returns once kubelet can register it."""

    def __init__(
        self, options: PluginOptions, gpus: list[Gpu], api_client: Any, claims: ClaimSource | None = None
    ) -> None:
        self.options = options
        self.hami_core = inspect_library(options.hami_core_lib, simulated=options.simulated)
        #: A finding that differs from ``hami_core``, applied when the next check agrees.
        self._hami_core_pending: HamiCoreStatus | None = None
        #: The GPUs as the source found them; ``gpus`` adds what HAMi-core's state makes of them.
        self.discovered = list(gpus)
        self.gpus = [self._with_isolation(gpu) for gpu in gpus]
        self.api_client = api_client
        self.metrics = PluginMetrics(node=options.node_name)
        mig_minors = read_mig_minors() if any(g.mig_devices for g in gpus) else {}
        self.inventory = Inventory(node_devices(gpus, mig_minors))
        self.health = HealthState([g.name for g in gpus])
        self.health.add_listener(self._on_health)
        self.toolkit = self._toolkit_registry(options)
        self.withheld: dict[str, Withheld] = {}
        #: This node's Node, read by the withheld check and the publisher alike.
        self.node = NodeReader(Kube(api_client), options.node_name) if api_client else None
        self.events = (
            NodeEvents(Kube(api_client), options.node_name, options.driver_name) if api_client else None
        )
        #: Cards in MIG on demand: their instances, created at prepare (``mig_on_demand.py``).
        self._mig_session: NvmlSession | None = None
        self.mig = self._mig_on_demand(options, gpus)
        if self.mig is not None:
            mig = self.mig
            self.metrics.mig_instances.source = lambda: [
                (i.device, i.uuid, i.profile, i.parent, i.memory_bytes) for i in mig.created()
            ]
        self.preparer = Preparer(
            PreparerConfig(
                driver=options.driver_name,
                pool=options.node_name,
                cdi_dir=options.cdi_dir,
                hami=HamiCoreConfig(
                    options.plugin_dir / "hami-core",
                    self.hami_core.library,
                    utilization_policy=options.core_utilization_policy,
                ),
                simulated=options.simulated,
                boot_id=read_boot_id(options.boot_id_file),
            ),
            self.inventory,
            claims if claims is not None else ApiClaimSource(api_client),
            Checkpoint(options.plugin_dir / "checkpoint.json"),
            self.metrics,
            toolkit=self.toolkit,
            mig=self.mig,
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
        self._metrics_server: MetricsServer | None = None
        self.metrics.ready = self.ready

    def ready(self) -> str | None:
        """``/readyz``: None once kubelet has registered the plugin and its slices are published
        (until then no pod can be given this node's GPUs), else what is missing."""
        if not self.registration.registered.is_set():
            error = self.registration.last_error
            return f"kubelet has not registered the plugin{': ' + error if error else ''}"
        publishing = self.options.publish and self.api_client is not None
        if publishing and (self.publisher is None or not self.publisher.published.is_set()):
            return "the node's ResourceSlices are not published yet"
        return None

    def _with_isolation(self, gpu: Gpu) -> Gpu:
        """The GPU as published: enforced by HAMi-core when usable, else as the source says."""
        status = self.hami_core
        if status.library is not None:
            return replace(gpu, isolation=status.isolation, hami_core_version=status.version)
        if self.options.simulated:
            return gpu  # simulated (or what its devices file says)
        return replace(gpu, isolation=status.isolation)

    def check_hami_core(self) -> bool:
        """Inspect the library again; True when the published isolation changed.

        The library arrives after the plugin starts wherever something else installs it (the
        chart's HAMi-core DaemonSet, whose image may take long to pull or never arrive), and an
        upgrade replaces it. A new finding is applied only when the next check agrees, so the
        moment between the installer's rename of the library and its version file is never
        published. Prepared claims keep the specs they were given.
        """
        if self.options.hami_core_lib is None:
            return False
        found = inspect_library(self.options.hami_core_lib, simulated=self.options.simulated)
        if found == self.hami_core:
            self._hami_core_pending = None
            return False
        if found != self._hami_core_pending:
            self._hami_core_pending = found
            return False
        self._hami_core_pending = None
        before = self.hami_core
        self.hami_core = found
        self.gpus = [self._with_isolation(gpu) for gpu in self.discovered]
        self.preparer.use_hami_core_library(found.library)
        if found.library is not None:
            self.preparer.config.hami.ensure_preload_file()
        LOG.warning(
            "HAMi-core changed: isolation %s -> %s (%s)",
            before.isolation,
            found.isolation,
            f"{found.version or 'unknown version'} at {found.library}" if found.library else found.problem,
        )
        self.report_isolation()
        return True

    def report_isolation(self) -> None:
        """Say once, loudly, when shares of this node's GPUs would not be enforced."""
        # A card in MIG mode is never shared: its MIG devices are given out whole.
        unenforced = [g.name for g in self.gpus if g.isolation == ISOLATION_NONE and not g.mig_enabled]
        self.metrics.unenforced.set(len(unenforced))
        problem = self.hami_core.problem
        if not unenforced:
            if self.events is not None:
                self.events.clear(SHARES_NOT_ENFORCED)
            if problem:
                LOG.warning("%s", problem)
            elif self.hami_core.library is not None:
                LOG.info("HAMi-core %s at %s enforces shares", self.hami_core.version, self.hami_core.library)
            return
        message = (
            f"shares of {len(unenforced)} GPU(s) ({', '.join(unenforced)}) are not enforced: {problem}; "
            "they are published with isolation=none and our DeviceClasses give them out whole only, "
            "unless a class sets allowUnenforcedShares (install HAMi-core: kubeletPlugin.hamiCore)"
        )
        LOG.warning("SharesNotEnforced: %s", message)
        if self.events is not None:
            self.events.warn(SHARES_NOT_ENFORCED, message, None)

    @staticmethod
    def _toolkit_registry(options: PluginOptions) -> ToolkitRegistry | None:
        if options.simulated or not options.nvidia_cdi_kind:
            return None
        kinds = (options.nvidia_cdi_kind, *(k for k in TOOLKIT_KINDS if k != options.nvidia_cdi_kind))
        # Our own transient specs share the CDI dir; they are never the toolkit's.
        ours = f"k8s.{options.driver_name}-"
        host = HostView(options.host_root, options.host_driver_root, options.nvidia_driver_root)
        return ToolkitRegistry(options.cdi_registry_dirs, kinds, host, ignore_prefix=ours)

    def _mig_on_demand(self, options: PluginOptions, gpus: list[Gpu]) -> MigOnDemand | None:
        """The instances of the cards in MIG on demand (None when there is none): kept by NVML, or
        for simulated cards in a file in the plugin directory; the journal next to the checkpoint."""
        cards = [gpu for gpu in gpus if gpu.mig_on_demand]
        if not cards:
            return None
        driver: MigDriver
        if options.simulated:
            driver = SimulatedMigDriver(options.plugin_dir / "simulated-mig.json", cards)
        else:
            self._mig_session = NvmlSession()
            driver = NvmlMigDriver(self._mig_session.open())
        LOG.info("MIG on demand on %s", ", ".join(gpu.name for gpu in cards))
        return MigOnDemand(gpus, driver, Journal(options.plugin_dir / JOURNAL_NAME), read_mig_minors())

    def _current_gpus(self) -> list[Gpu]:
        unhealthy = self.health.unhealthy()
        unmonitored = set(self.health.unmonitored())
        withheld = self.withheld
        foreign = self.mig.foreign if self.mig is not None else {}
        return [
            replace(
                g,
                healthy=g.name not in unhealthy,
                health_monitored=g.name not in unmonitored,
                mig_devices=(
                    foreign.get(g.name, ())  # on demand: only what the driver did not create
                    if g.mig_on_demand
                    else tuple(m for m in g.mig_devices if mig_device_name(g.name, m) not in withheld)
                ),
            )
            for g in self.gpus
            if g.name not in withheld
        ]

    def _on_health(self, snapshot: dict[str, Any]) -> None:
        for name, value in snapshot.items():
            self.metrics.gpu(self.metrics.healthy, name).set(1 if value.healthy else 0)
            self.metrics.gpu(self.metrics.health_monitored, name).set(1 if value.monitored else 0)
        if self.publisher is not None:
            self.publisher.trigger()

    def check_withheld(self) -> bool:
        """Recompute which GPUs must not be published (``withheld.py``); True if that changed."""
        gpus = self.inventory.all()
        withheld: dict[str, Withheld] = {}
        if self.toolkit is not None:
            edits, errors = self.toolkit.current()
            withheld.update(cdi_withheld(gpus, edits, errors))
        node_uid = None
        options = self.options
        if not options.simulated and not options.allow_device_plugin and self.api_client is not None:
            node = self._read_node()
            node_uid = (node.get("metadata") or {}).get("uid")
            advertised = device_plugin_gpus(NodeView.parse(node).allocatable_quantities)
            withheld.update(device_plugin_withheld(gpus, advertised))
        if withheld == self.withheld:
            return False
        self._report_withheld(withheld, node_uid)
        self.withheld = withheld
        return True

    def _read_node(self) -> dict[str, Any]:
        try:
            return self.node.read() if self.node is not None else {}
        except Exception as err:  # an unreadable Node must not stop publishing
            LOG.warning("could not read node %s (device plugin check): %s", self.options.node_name, err)
            return {}

    def _report_withheld(self, withheld: dict[str, Withheld], node_uid: str | None) -> None:
        by_reason: dict[str, list[str]] = {}
        for name, item in sorted(withheld.items()):
            by_reason.setdefault(item.reason, []).append(name)
        for reason in {item.reason for item in self.withheld.values()} - set(by_reason):
            LOG.warning("%s cleared: publishing the GPUs it withheld", reason)
            self.metrics.withheld_gpus(reason).set(0)
            if self.events is not None:
                self.events.clear(reason)
        for reason, names in by_reason.items():
            message = f"{len(names)} GPU(s) not published ({', '.join(names)}): {withheld[names[0]].message}"
            LOG.error("%s: %s", reason, message)
            self.metrics.withheld_gpus(reason).set(len(names))
            if self.events is not None:
                self.events.warn(reason, message, node_uid)

    def _recheck_loop(self) -> None:
        while not self._stop.wait(self.options.recheck_seconds):
            changed = False
            try:
                changed = self.check_hami_core()
            except Exception:
                LOG.exception("checking the HAMi-core library failed")
            try:
                changed = self.check_withheld() or changed
            except Exception:
                LOG.exception("checking the node for withheld GPUs failed")
            if changed and self.publisher is not None:
                self.publisher.trigger()

    def start(self) -> None:
        if self.hami_core.library is not None:
            self.preparer.config.hami.ensure_preload_file()
        self.report_isolation()
        self.check_withheld()
        for gpu in self.gpus:
            self.metrics.gpu(self.metrics.healthy, gpu.name).set(1)
            self.metrics.gpu(self.metrics.health_monitored, gpu.name).set(0)
        if self.mig is not None:
            report = self.mig.reconcile()  # before any prepare: orphans gone, lost ones back
            LOG.info("MIG on demand reconciled with the driver: %s", report)
        self.preparer.start()
        # Health first: the first slice published then carries each GPU's health and whether
        # anything watches it, instead of a healthMonitored=false that the next publish corrects.
        self._start_health()
        if self.options.publish and self.api_client is not None:
            from dra_driver.kubeletplugin.publisher import SlicePublisher

            self.publisher = SlicePublisher(
                self.api_client,
                driver_name=self.options.driver_name,
                node_name=self.options.node_name,
                gpus=self._current_gpus,
                policy_taint=self.options.policy_taint,
                node_uid=self.node.uid if self.node is not None else None,
            )
            self.publisher.start()
        if self.options.metrics_port:
            try:
                self._metrics_server = self.metrics.serve(
                    self.options.metrics_port, self.options.metrics_host
                )
            except OSError as err:
                raise SocketError(f"--metrics-bind-address: {err.strerror or err}") from err
        self.servers.start()
        threading.Thread(target=self._deleted_claims_loop, name="deleted-claims", daemon=True).start()
        threading.Thread(target=self._recheck_loop, name="node-recheck", daemon=True).start()

    def _start_health(self) -> None:
        """Start what watches the GPUs' health, and say loudly which GPUs nothing watches."""
        options = self.options
        if not options.health_checks:
            LOG.warning(
                "GPU health checks are off (--health-checks=false): no GPU of this node is monitored; "
                "a failing GPU stays published as healthy"
            )
        elif options.health_file is not None:
            watcher = HealthFileWatcher(options.health_file, self.health)
            watcher.poll()
            watcher.start()
            self._watchers.append(watcher)
        elif not options.simulated:
            nvml = NvmlHealthWatcher(
                {g.name: g.uuid for g in self.gpus},
                self.health,
                ignored_xids=options.additional_xids_to_ignore,
                recovery_s=options.health_recovery_seconds,
            )
            nvml.start()
            self._watchers.append(nvml)
        unmonitored = self.health.unmonitored()
        if unmonitored and options.health_checks and not options.simulated:
            LOG.warning(
                "HealthNotMonitored: %s: nothing watches their health (see the errors above); they "
                "are published with healthMonitored=false",
                ", ".join(unmonitored),
            )

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
        if self._metrics_server is not None:
            self._metrics_server.stop()
        if self._mig_session is not None:
            self._mig_session.close()
