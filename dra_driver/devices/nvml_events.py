"""NVML health events: which of this node's GPUs went bad, and why.

:class:`NvmlEventWatcher` holds its own NVML initialisation (:mod:`dra_driver.devices.nvml_session`)
from :meth:`~NvmlEventWatcher.start` until its loop ends, registers every GPU on its own (a GPU
that cannot register is logged and left unmonitored; the others are still watched) and reports
unhealthy GPUs to a callback as ``{device name: reason}``:

* an XID critical error marks that GPU, except the application XIDs NVIDIA's own plugins skip
  (:data:`APPLICATION_XIDS`: a faulting kernel says nothing about the card);
* a double-bit ECC error (uncorrectable) marks that GPU; single-bit ones are corrected by the
  hardware and are not watched;
* ``NVML_ERROR_GPU_IS_LOST`` from the wait, or an event NVML cannot attribute to one of our GPUs,
  marks every GPU: NVML does not say which one is gone.

A mark is never lifted here: the plugin's health state (``dra_driver/kubeletplugin/health.py``)
keeps it until the plugin restarts, which is when a reset GPU is discovered afresh.
Tests drive this module through ``hack/mock-nvml``, whose ``MOCK_NVML_EVENTS`` file injects events.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dra_driver.devices.nvml_session import NvmlSession
from dra_driver.devices.source import DeviceSourceError

log = logging.getLogger(__name__)

#: Application errors (graphics engine exception, memory page fault, stopped processing, preemptive
#: cleanup, video processor exception, context switch timeout): the GPU itself is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: nvml.h event types (``nvmlEventType*``); pynvml names them the same.
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
WATCHED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC

Report = Callable[[dict[str, str]], None]


class NvmlEventWatcher:
    """Watches ``uuids_by_name`` (device name -> GPU UUID) and calls ``report`` with bad GPUs.

    ``wait_ms`` bounds how long :meth:`stop` takes to be noticed; ``retry_s`` is the pause after a
    failed wait, so that a persistent error is not a busy loop. ``nvml`` lets tests pass another
    module with pynvml's API.
    """

    def __init__(
        self,
        uuids_by_name: Mapping[str, str],
        report: Report,
        *,
        nvml: Any = None,
        ignored_xids: Iterable[int] = APPLICATION_XIDS,
        wait_ms: int = 1000,
        retry_s: float = 1.0,
    ) -> None:
        self.uuids_by_name = dict(uuids_by_name)
        self.report = report
        self.ignored_xids = frozenset(ignored_xids)
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.monitored: tuple[str, ...] = ()
        self._session = NvmlSession(nvml)
        self._nvml: Any = None
        self._event_set: Any = None
        self._names_by_handle: dict[int | None, str] = {}
        self._stop = threading.Event()

    def start(self) -> threading.Thread | None:
        """Register the GPUs now, then watch in a daemon thread; None (logged) if nothing is watched."""
        if not self._open():
            return None
        thread = threading.Thread(target=self.run, name="nvml-health", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Ask the loop to end; it gives NVML back within ``wait_ms``."""
        self._stop.set()

    def _open(self) -> bool:
        try:
            nvml = self._nvml = self._session.open()
        except DeviceSourceError as err:
            log.error("GPU health is not monitored: %s", err)
            return False
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error("GPU health is not monitored: NVML could not create an event set (%s)", err)
            self._session.close()
            return False
        self.monitored = tuple(name for name in sorted(self.uuids_by_name) if self._register(nvml, name))
        if self.monitored:
            log.info("watching NVML health events of %s", ", ".join(self.monitored))
            return True
        log.error("GPU health is not monitored: no GPU could register for NVML events")
        self._close()
        return False

    def _register(self, nvml: Any, name: str) -> bool:
        uuid = self.uuids_by_name[name]
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            wanted = WATCHED_EVENTS & supported
            if wanted:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, self._event_set)
        except nvml.NVMLError as err:
            log.error(
                "%s (%s) is not monitored: NVML health events could not be registered (%s); "
                "the other GPUs still are",
                name, uuid, err,
            )  # fmt: skip
            return False
        if not wanted:
            log.error("%s (%s) is not monitored: NVML offers neither XID nor ECC events for it", name, uuid)
            return False
        if not wanted & EVENT_XID_CRITICAL:
            log.warning("%s (%s): NVML offers no XID events for it; only ECC errors are watched", name, uuid)
        self._names_by_handle[_address(handle)] = name
        return True

    def run(self) -> None:
        """The wait loop; gives NVML back when :meth:`stop` is called."""
        nvml = self._nvml
        last_error: int | None = None
        try:
            while not self._stop.is_set():
                try:
                    event = nvml.nvmlEventSetWait_v2(self._event_set, self.wait_ms)
                except nvml.NVMLError as err:
                    if err.value == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    if err.value == nvml.NVML_ERROR_GPU_IS_LOST:
                        if last_error != err.value:
                            log.error("NVML: a GPU is lost (%s); marking every GPU unhealthy", err)
                        self._report(dict.fromkeys(self.uuids_by_name, "GPU lost"))
                    elif last_error != err.value:
                        log.error(
                            "waiting for NVML events failed (%s); retrying every %.1fs", err, self.retry_s
                        )
                    last_error = err.value
                    self._stop.wait(self.retry_s)
                    continue
                last_error = None
                self._event(nvml, event)
        finally:
            self._close()

    def _event(self, nvml: Any, event: Any) -> None:
        kind = int(event.eventType)
        name = self._names_by_handle.get(_address(event.device))
        if kind == EVENT_XID_CRITICAL:
            xid = int(event.eventData)
            if xid in self.ignored_xids:
                log.info("%s: XID %d is an application error; the GPU stays healthy", name or "a GPU", xid)
                return
            reason = f"XID {xid}"
        elif kind == EVENT_DOUBLE_BIT_ECC:
            reason = "double-bit ECC error"
        else:
            log.debug("NVML event type %#x ignored", kind)
            return
        if name is None:
            name = self._name_by_uuid(nvml, event.device)
        if name is None:
            log.error("NVML reported %s on a GPU it cannot name; marking every GPU unhealthy", reason)
            self._report(dict.fromkeys(self.uuids_by_name, f"{reason} on an unidentified GPU"))
            return
        log.error("%s (%s): %s; marking it unhealthy", name, self.uuids_by_name[name], reason)
        self._report({name: reason})

    def _name_by_uuid(self, nvml: Any, handle: Any) -> str | None:
        if not handle:
            return None
        try:
            raw = nvml.nvmlDeviceGetUUID(handle)
        except nvml.NVMLError:
            return None
        uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
        return next((name for name, known in self.uuids_by_name.items() if known == uuid), None)

    def _report(self, reasons: dict[str, str]) -> None:
        try:
            self.report(reasons)
        except Exception:  # the loop must outlive a failing consumer, or health silently stops
            log.exception("reporting unhealthy GPUs %s failed", sorted(reasons))

    def _close(self) -> None:
        nvml, event_set = self._nvml, self._event_set
        self._event_set = None
        if event_set is not None:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as err:
                log.warning("nvmlEventSetFree failed: %s", err)
        self._session.close()


def _address(handle: Any) -> int | None:
    """The C pointer behind a pynvml handle: how an event's device is matched to ours."""
    return ctypes.cast(handle, ctypes.c_void_p).value if handle else None
