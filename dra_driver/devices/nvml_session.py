"""One reference on NVML's initialisation, held by whoever calls NVML for as long as it does.

NVML counts initialisations: every ``nvmlInit`` adds one, every ``nvmlShutdown`` takes one away,
and only when the count is back at zero does every other call (on handles and event sets obtained
earlier too) answer ``NVML_ERROR_UNINITIALIZED``. Discovery (:mod:`dra_driver.devices.nvml`) and
the health watcher (:mod:`dra_driver.devices.nvml_events`) each hold their own
:class:`NvmlSession`, so neither can end the other's: discovery used to shut NVML down before the
watcher (which never initialised it) created its event set, and health was never watched.
``hack/mock-nvml/mock_nvml.c`` counts the same way, so the tests catch an unbalanced pair.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from dra_driver.devices.source import DeviceSourceError, DriverNotReady

log = logging.getLogger(__name__)

NVML_NOT_FOUND_HINT = "NVML not found: is the NVIDIA driver installed and /dev/nvidia* mounted?"


def load_pynvml(nvml: Any = None) -> Any:
    """``nvml`` if given (tests pass a stand-in), else the ``pynvml`` module of ``nvidia-ml-py``."""
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise DeviceSourceError(
            "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
        ) from err
    return pynvml


class NvmlSession:
    """Holds one NVML initialisation from :meth:`open` until :meth:`close` (or a ``with`` block)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._held = False

    def open(self) -> Any:
        """Initialise NVML (one more reference) and return the module; idempotent while held.

        Raises :class:`DeviceSourceError` with one actionable line when NVML cannot start.
        """
        nvml = self._nvml = load_pynvml(self._nvml)
        if self._held:
            return nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise DriverNotReady(f"{NVML_NOT_FOUND_HINT} (nvmlInit: {err})") from err
        self._held = True
        return nvml

    def close(self) -> None:
        """Give the reference back; a second call does nothing."""
        if not self._held:
            return
        self._held = False
        nvml = self._nvml
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            log.warning("nvmlShutdown failed (%s); NVML may stay initialised in this process", err)

    def __enter__(self) -> Any:
        return self.open()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
