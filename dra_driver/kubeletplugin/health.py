"""GPU health: sources (NVML events through ``dra_driver/devices/nvml_events.py``, or a health
file in simulated mode), state, and the DRAResourceHealth stream kubelet reads.

An unhealthy GPU is reported three ways: the ResourceSlice publisher taints it (so nothing new is
scheduled on it), kubelet gets it over the health stream (and shows it in pod status), and the
``hami_dra_gpu_healthy`` gauge drops to 0. All three clear when the GPU recovers.

A GPU nothing watches (health checks off, NVML offers no XID events for it, no NVML at all, a
simulated node without a health file) is *not monitored*, and says so the same three ways: the
slice attribute ``healthMonitored: false``, ``UNKNOWN`` (not ``HEALTHY``) on the health stream, and
the ``hami_dra_gpu_health_monitored`` gauge at 0; it stays schedulable (nothing says it is bad).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import yaml

from dra_driver.devices.nvml_events import NvmlEventWatcher
from dra_driver.kubeletplugin.protos import HEALTH_V1ALPHA1_SERVICE, health_v1alpha1

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceHealth:
    healthy: bool
    message: str = ""
    since: float = 0.0
    #: Whether anything watches this GPU; set only through :meth:`HealthState.set_monitored`.
    monitored: bool = False


class HealthState:
    """Current health per device name; notifies listeners and wakes streams on every change.

    Every device starts healthy and not monitored, until a watcher says which ones it watches.
    """

    def __init__(self, devices: list[str]) -> None:
        self._cond = threading.Condition()
        now = time.time()
        self._health = {name: DeviceHealth(True, "", now) for name in devices}
        self._version = 0
        self._listeners: list[Callable[[dict[str, DeviceHealth]], None]] = []

    def add_listener(self, listener: Callable[[dict[str, DeviceHealth]], None]) -> None:
        self._listeners.append(listener)

    def snapshot(self) -> tuple[int, dict[str, DeviceHealth]]:
        with self._cond:
            return self._version, dict(self._health)

    def set(self, updates: dict[str, DeviceHealth]) -> bool:
        """Apply ``updates`` (health and message; monitoring is kept); True (listeners called) if
        anything changed."""
        with self._cond:
            changed = {
                name: replace(value, monitored=self._health[name].monitored)
                for name, value in updates.items()
                if name in self._health and self._health[name].healthy != value.healthy
            }
            if not changed:
                return False
            self._health.update(changed)
            snapshot = self._bump()
        for name, value in changed.items():
            log = LOG.warning if not value.healthy else LOG.info
            log("GPU %s is now %s %s", name, "healthy" if value.healthy else "unhealthy", value.message)
        self._notify(snapshot)
        return True

    def set_monitored(self, monitored: Iterable[str]) -> bool:
        """The devices a watcher watches are ``monitored``, every other one is not; True if that changed."""
        watched = set(monitored)
        with self._cond:
            changed = {
                name: replace(value, monitored=name in watched)
                for name, value in self._health.items()
                if value.monitored != (name in watched)
            }
            if not changed:
                return False
            self._health.update(changed)
            snapshot = self._bump()
        self._notify(snapshot)
        return True

    def _bump(self) -> dict[str, DeviceHealth]:
        """With the lock held: a new version, streams woken; the snapshot listeners get."""
        self._version += 1
        self._cond.notify_all()
        return dict(self._health)

    def _notify(self, snapshot: dict[str, DeviceHealth]) -> None:
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # a failing listener must not stop health propagation
                LOG.exception("health listener failed")

    def wait_change(self, version: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    def unhealthy(self) -> dict[str, str]:
        with self._cond:
            return {name: h.message for name, h in self._health.items() if not h.healthy}

    def unmonitored(self) -> list[str]:
        with self._cond:
            return sorted(name for name, h in self._health.items() if not h.monitored)


def parse_health_file(text: str) -> dict[str, DeviceHealth]:
    """``{gpu-1: unhealthy}`` or ``{gpu-1: {healthy: false, message: "XID 79"}}`` (YAML or JSON)."""
    data = yaml.safe_load(text) if text.strip() else {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("health file must map device names to 'healthy'/'unhealthy' or {healthy, message}")
    now = time.time()
    result = {}
    for name, value in data.items():
        if isinstance(value, str) and value.lower() in ("healthy", "unhealthy"):
            result[str(name)] = DeviceHealth(value.lower() == "healthy", "", now)
        elif isinstance(value, dict) and isinstance(value.get("healthy"), bool):
            result[str(name)] = DeviceHealth(value["healthy"], str(value.get("message", "")), now)
        else:
            raise ValueError(f"{name}: expected 'healthy', 'unhealthy' or {{healthy: bool, message: str}}")
    return result


class HealthFileWatcher:
    """Simulated mode: polls a YAML/JSON file; devices not listed are healthy."""

    def __init__(self, path: Path, state: HealthState, interval: float = 0.5) -> None:
        self.path = path
        self.state = state
        self.interval = interval
        self._stop = threading.Event()
        self._last: tuple[float, int] | None = None

    def poll(self) -> None:
        try:
            stat = self.path.stat()
            key = (stat.st_mtime, stat.st_size)
        except FileNotFoundError:
            key = (0.0, -1)
        if key == self._last:
            return
        self._last = key
        try:
            reported = parse_health_file(self.path.read_text()) if key[1] >= 0 else {}
        except (OSError, ValueError, yaml.YAMLError) as err:
            LOG.error("health file %s ignored: %s", self.path, err)
            return
        _, current = self.state.snapshot()
        now = time.time()
        updates = {name: reported.get(name, DeviceHealth(True, "", now)) for name in current}
        self.state.set(updates)

    def run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def start(self) -> threading.Thread:
        _, current = self.state.snapshot()
        self.state.set_monitored(current)  # the file speaks for every device
        thread = threading.Thread(target=self.run, name="health-file", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


class NvmlHealthWatcher:
    """Real nodes: NVML's XIDs mark a GPU unhealthy; it is healthy again once it recovers.

    The NVML side (its own initialisation, per-GPU registration, which XIDs count, GPU lost, the
    recovery probe) is :class:`dra_driver.devices.nvml_events.NvmlEventWatcher`; this class only
    turns its reports into :class:`HealthState` updates. ``start`` registers the GPUs before it
    returns and marks those it watches monitored. ``recovery_s`` 0 keeps a mark until the plugin
    restarts (NVIDIA's behaviour).
    """

    def __init__(
        self,
        uuids_by_name: dict[str, str],
        state: HealthState,
        *,
        nvml: Any = None,
        ignored_xids: Iterable[int] = (),
        recovery_s: float = 0.0,
        wait_ms: int = 1000,
        retry_s: float = 1.0,
    ) -> None:
        self.uuids_by_name = uuids_by_name
        self.state = state
        self.events = NvmlEventWatcher(
            uuids_by_name,
            self._unhealthy,
            nvml=nvml,
            ignored_xids=ignored_xids,
            recovered=self._recovered,
            recovery_s=recovery_s,
            wait_ms=wait_ms,
            retry_s=retry_s,
        )

    @property
    def monitored(self) -> tuple[str, ...]:
        """The device names whose events are watched (those whose registration succeeded)."""
        return self.events.monitored

    def _unhealthy(self, reasons: dict[str, str]) -> None:
        now = time.time()
        self.state.set({name: DeviceHealth(False, reason, now) for name, reason in reasons.items()})

    def _recovered(self, names: list[str]) -> None:
        now = time.time()
        self.state.set({name: DeviceHealth(True, "recovered", now) for name in names})

    def start(self) -> threading.Thread | None:
        thread = self.events.start()
        self.state.set_monitored(self.events.monitored if thread is not None else ())
        return thread

    def stop(self) -> None:
        self.events.stop()


class HealthService:
    """DRAResourceHealth v1alpha1: a full device list at start and on every change."""

    def __init__(self, state: HealthState, pool: str, timeout_seconds: int = 0) -> None:
        self.state = state
        self.pool = pool
        self.timeout_seconds = timeout_seconds

    def _message(self, health: dict[str, DeviceHealth]) -> Any:
        pb = health_v1alpha1
        return pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=_status(value),
                    last_updated_time=int(value.since),
                    health_check_timeout_seconds=self.timeout_seconds,
                    message=value.message[:1024],
                )
                for name, value in sorted(health.items())
            ]
        )

    def node_watch_resources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        version, health = self.state.snapshot()
        yield self._message(health)
        while context.is_active():
            new_version = self.state.wait_change(version, timeout=1.0)
            if new_version != version:
                version, health = self.state.snapshot()
                yield self._message(health)

    def handler(self) -> grpc.GenericRpcHandler:
        pb = health_v1alpha1
        return grpc.method_handlers_generic_handler(
            HEALTH_V1ALPHA1_SERVICE,
            {
                "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                    self.node_watch_resources,
                    request_deserializer=pb.NodeWatchResourcesRequest.FromString,
                    response_serializer=pb.NodeWatchResourcesResponse.SerializeToString,
                )
            },
        )


def _status(value: DeviceHealth) -> Any:
    """UNHEALTHY when marked; HEALTHY only when something watches the device, else UNKNOWN."""
    pb = health_v1alpha1
    if not value.healthy:
        return pb.UNHEALTHY
    return pb.HEALTHY if value.monitored else pb.UNKNOWN


def describe(health: dict[str, DeviceHealth]) -> str:
    """Compact JSON of unhealthy devices (for logs)."""
    return json.dumps({k: v.message for k, v in health.items() if not v.healthy})
