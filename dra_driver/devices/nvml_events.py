"""NVML health events: which of this node's GPUs went bad, why, and when one is good again.

:class:`NvmlEventWatcher` holds its own NVML initialisation (:mod:`dra_driver.devices.nvml_session`)
from :meth:`~NvmlEventWatcher.start` until its loop ends, registers every GPU on its own (a GPU
that cannot register is logged and left unmonitored; the others are still watched) and reports
unhealthy GPUs to a callback as ``{device name: reason}``. The rules are NVIDIA's (its DRA
driver's ``device_health.go`` and its device plugin's ``health.go``):

* XID, double- and single-bit ECC events are registered, and only XIDs are acted on: an XID marks
  its GPU, except the application XIDs both NVIDIA plugins skip (:data:`APPLICATION_XIDS`: a
  faulting kernel says nothing about the card) and the ones the operator adds
  (``--additional-xids-to-ignore``). An ECC event is only logged: an uncorrectable error the card
  cannot contain raises an XID of its own (48, 63/64, 94/95), and that one is acted on;
* a GPU whose XID events cannot be registered is not monitored (logged, and reported by
  :attr:`NvmlEventWatcher.monitored`); ECC events alone are not enough, since they are not acted on;
* ``NVML_ERROR_GPU_IS_LOST`` from the wait, or an XID NVML cannot attribute to one of our GPUs,
  marks every GPU: NVML does not say which one is gone.

Recovery (ours; NVIDIA's plugins keep a mark until they restart): with ``recovery_s`` > 0 a GPU
marked that long ago, with no new XID since, is probed, and reported to ``recovered`` when NVML
reaches it again and it has no reset pending (no row remapping pending or failed, no pages
pending retirement). A fault that repeats marks the GPU again and restarts the window.
Tests drive this module through ``hack/mock-nvml``, whose ``MOCK_NVML_EVENTS`` file injects events
and state changes (a GPU falling off the bus, a pending row remap, a reset).
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dra_driver.devices.nvml_session import NvmlSession
from dra_driver.devices.source import DeviceSourceError

log = logging.getLogger(__name__)

#: Application errors (graphics engine exception, memory page fault, stopped processing, preemptive
#: cleanup, video processor exception, context switch timeout): the GPU itself is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: nvml.h event types (``nvmlEventType*``); pynvml names them the same.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
#: What NVIDIA's plugins register; of these only XIDs mark a GPU.
REGISTERED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC
#: How often at most marked GPUs are probed for recovery.
PROBE_INTERVAL_S = 10.0

Report = Callable[[dict[str, str]], None]
Recovered = Callable[[list[str]], None]

_XID_SEPARATORS = re.compile(r"[\s,]+")


def parse_xids(text: str) -> frozenset[int]:
    """``"79, 48"`` -> ``{79, 48}``; commas or blanks separate. A value that is not an XID is an error
    (NVIDIA's plugins skip it silently; a typo here would leave a GPU marked that was meant not to be).
    """
    xids = set()
    for token in filter(None, _XID_SEPARATORS.split(text.strip())):
        if not token.isdigit() or int(token) < 1:
            raise ValueError(f"{token!r} is not an XID (a positive integer such as 79); give e.g. '79,48'")
        xids.add(int(token))
    return frozenset(xids)


class NvmlEventWatcher:
    """Watches ``uuids_by_name`` (device name -> GPU UUID) and calls ``report`` with bad GPUs.

    ``ignored_xids`` are skipped on top of :data:`APPLICATION_XIDS`. ``recovered`` is called with
    the GPUs found good again ``recovery_s`` after their last mark (0: never, as NVIDIA's plugins).
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
        ignored_xids: Iterable[int] = (),
        recovered: Recovered | None = None,
        recovery_s: float = 0.0,
        wait_ms: int = 1000,
        retry_s: float = 1.0,
    ) -> None:
        self.uuids_by_name = dict(uuids_by_name)
        self.report = report
        self.ignored_xids = APPLICATION_XIDS | frozenset(ignored_xids)
        self.recovered = recovered
        self.recovery_s = recovery_s if recovered is not None else 0.0
        #: When each marked GPU was last marked (monotonic seconds); probed once ``recovery_s`` old.
        self._marked: dict[str, float] = {}
        self._still_bad: dict[str, str] = {}
        self._next_probe = 0.0
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

    @property
    def not_recovered(self) -> dict[str, str]:
        """Marked GPUs probed and found still bad, with why (logged once each)."""
        return dict(self._still_bad)

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
            log.info(
                "watching NVML health events of %s; XIDs ignored: %s",
                ", ".join(self.monitored), ", ".join(map(str, sorted(self.ignored_xids))),
            )  # fmt: skip
            return True
        log.error("GPU health is not monitored: no GPU could register for NVML events")
        self._close()
        return False

    def _register(self, nvml: Any, name: str) -> bool:
        uuid = self.uuids_by_name[name]
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            wanted = REGISTERED_EVENTS & supported
            if wanted & EVENT_XID_CRITICAL:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, self._event_set)
        except nvml.NVMLError as err:
            log.error(
                "%s (%s) is not monitored: NVML health events could not be registered (%s); "
                "the other GPUs still are",
                name, uuid, err,
            )  # fmt: skip
            return False
        if not wanted & EVENT_XID_CRITICAL:
            log.error("%s (%s) is not monitored: NVML offers no XID events for it", name, uuid)
            return False
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
                finally:
                    self._recover_due(nvml)
                last_error = None
                self._event(nvml, event)
        finally:
            self._close()

    def _event(self, nvml: Any, event: Any) -> None:
        kind = int(event.eventType)
        name = self._names_by_handle.get(_address(event.device))
        if kind == EVENT_DOUBLE_BIT_ECC:
            log.warning(
                "%s: double-bit ECC error; not acted on (NVIDIA's rule): the XID it raises if the card "
                "cannot contain it marks the GPU",
                name or "a GPU",
            )
            return
        if kind != EVENT_XID_CRITICAL:
            log.debug("%s: NVML event type %#x not acted on", name or "a GPU", kind)
            return
        xid = int(event.eventData)
        if xid in self.ignored_xids:
            why = "an application error" if xid in APPLICATION_XIDS else "in --additional-xids-to-ignore"
            log.info("%s: XID %d is %s; the GPU stays healthy", name or "a GPU", xid, why)
            return
        reason = f"XID {xid}"
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
        now = time.monotonic()
        for name in reasons:
            self._marked[name] = now
            self._still_bad.pop(name, None)
        try:
            self.report(reasons)
        except Exception:  # the loop must outlive a failing consumer, or health silently stops
            log.exception("reporting unhealthy GPUs %s failed", sorted(reasons))

    def _recover_due(self, nvml: Any) -> None:
        """Probe the GPUs marked ``recovery_s`` ago or more; report those that are good again."""
        if not self.recovery_s or not self._marked or self.recovered is None:
            return
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + min(self.recovery_s, PROBE_INTERVAL_S)
        back = []
        for name, marked in sorted(self._marked.items()):
            if now - marked < self.recovery_s:
                continue
            problem = self._probe(nvml, name)
            if problem is None:
                back.append(name)
            elif self._still_bad.get(name) != problem:
                self._still_bad[name] = problem
                log.warning("%s stays unhealthy: %s", name, problem)
        if not back:
            return
        for name in back:
            del self._marked[name]
            self._still_bad.pop(name, None)
        log.warning(
            "%s recovered: no XID for %gs, NVML reaches it and no reset is pending",
            ", ".join(back), self.recovery_s,
        )  # fmt: skip
        try:
            self.recovered(back)
        except Exception:  # as in _report: the loop goes on
            log.exception("reporting recovered GPUs %s failed", back)

    def _probe(self, nvml: Any, name: str) -> str | None:
        """Why ``name`` is not good again, or None: NVML must reach it and no reset may be pending."""
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(self.uuids_by_name[name])
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as err:
            return f"NVML cannot reach it ({err})"
        absent = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
        try:  # Ampere on: an uncorrectable error remaps a memory row at the next reset
            _, _, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        except nvml.NVMLError as err:
            if err.value not in absent:
                return f"its row remapping state cannot be read ({err})"
        else:
            if failed:
                return "row remapping failed: the GPU needs servicing"
            return "row remapping is pending: reset the GPU" if pending else None
        try:  # before Ampere: the page is retired at the next reset
            if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                return "pages are pending retirement: reset the GPU"
        except nvml.NVMLError as err:
            if err.value not in absent:
                return f"its page retirement state cannot be read ({err})"
        return None

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
