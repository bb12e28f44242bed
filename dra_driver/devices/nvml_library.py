"""Find ``libnvidia-ml.so.1`` under the NVIDIA driver root and hand it to ``pynvml``.

The plugin's image carries no NVIDIA library: it comes from the node, as NVIDIA's own DRA driver
does it. The chart mounts the host's driver root read-only (``kubeletPlugin.nvidiaDriverRoot``:
``/`` for a driver installed on the host, ``/run/nvidia/driver`` under the GPU Operator) and
passes its path inside the container (``--nvidia-driver-root``, env ``NVIDIA_DRIVER_ROOT``).
``pynvml`` itself only asks the dynamic loader for the soname, which inside the container finds
nothing, so the library found here is given to it before the first ``nvmlInit``.

Symbolic links are followed inside the root: an absolute link target (``/usr/lib/...`` as the
host sees it) is read below the root, never from the container's own file system.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path, PurePosixPath
from typing import Any

from dra_driver.devices.source import DriverNotReady

log = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
#: Where the major distributions' NVIDIA packages and the GPU Operator's driver container put it.
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
_MAX_LINKS = 16


def resolve_in_root(root: Path, path: PurePosixPath) -> Path | None:
    """``path`` (as the host sees it) below ``root``, every link on the way followed inside the
    root (``/lib64 -> usr/lib64``, ``libnvidia-ml.so.1 -> libnvidia-ml.so.550.54.15``); None if absent."""
    pending = list(PurePosixPath("/", path).parts[1:])
    resolved = PurePosixPath("/")
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            resolved = resolved.parent
            continue
        if part in ("", "."):
            continue
        candidate = root / (resolved / part).relative_to("/")
        if candidate.is_symlink():
            links += 1
            if links > _MAX_LINKS:
                return None  # a loop of links
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                resolved = PurePosixPath("/")
            pending = list(target.parts[1:] if target.is_absolute() else target.parts) + pending
            continue
        resolved = resolved / part
    found = root / resolved.relative_to("/")
    return found if found.is_file() else None


def find_nvml_library(root: Path) -> Path:
    """The driver's NVML under ``root``; raises :class:`DriverNotReady` naming what to set."""
    if not root.is_dir():
        raise DriverNotReady(
            f"NVIDIA driver root {root} is not a directory: mount the host's driver root there "
            "(chart value kubeletPlugin.nvidiaDriverRoot: '/' for a host driver install, "
            "'/run/nvidia/driver' under the GPU Operator)"
        )
    for directory in LIBRARY_DIRS:
        found = resolve_in_root(root, PurePosixPath(directory) / LIBRARY)
        if found is not None:
            return found
    raise DriverNotReady(
        f"{LIBRARY} not found under the NVIDIA driver root {root} (looked in "
        f"{', '.join(LIBRARY_DIRS)}): set kubeletPlugin.nvidiaDriverRoot to where the driver is "
        "installed on the node ('/' for a host install, '/run/nvidia/driver' under the GPU Operator)"
    )


def use_driver_root(root: Path, nvml: Any) -> Path:
    """Load NVML from ``root`` into ``nvml`` (the ``pynvml`` module) unless one is loaded already."""
    library = find_nvml_library(root)
    if getattr(nvml, "nvmlLib", None) is not None:
        return library
    try:
        nvml.nvmlLib = ctypes.CDLL(str(library))
    except OSError as err:
        raise DriverNotReady(f"{library} could not be loaded: {err}") from err
    log.info("NVML loaded from %s", library)
    return library
