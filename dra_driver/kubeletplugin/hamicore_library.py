"""Is HAMi-core usable on this node, and which version: what decides the GPUs' ``isolation``.

The library is never loaded here: libvgpu.so hooks ``dlsym`` and CUDA/NVML entry points of the
process that loads it, so the plugin only checks what a container's loader will need: the file
exists, is a 64-bit ELF shared object for this machine, and is recent enough. Its version comes from
``<library>.version`` (one line, e.g. ``v2.9.0``), which the chart's HAMi-core installer writes when it
copies the library out of HAMi's image; a library the admin placed without one is used with a
warning. Versions below :data:`MINIMUM_VERSION` are refused (``hami-core-enforcement.md`` in the
design notes, summarised in README "Isolation"): up to v2.5.0 every CUDA process can hang in
``cuInit``, v2.5.1-v2.8.0 silently drop the cores limit, and before v2.9.0 CUDA 13 allocations
escape the memory limit. A patch release of an older line that ships the same library as an accepted
release (:data:`SAME_LIBRARY_AS`) is accepted: the version names the HAMi release the image came
from, not what the library does.

The plugin inspects the library again while it runs (``plugin.py``), so a library that arrives,
changes or goes after start-up changes the published isolation without a restart.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

from dra_driver.contract import ISOLATION_HAMI_CORE, ISOLATION_NONE, ISOLATION_SIMULATED

MINIMUM_VERSION = (2, 9, 0)
#: HAMi releases below :data:`MINIMUM_VERSION` whose image carries the libvgpu of the release named:
#: v2.8.3, a patch of the 2.8 line, ships the HAMi-core of v2.9.0 (issue 33's review of HAMi's
#: releases), so a cluster that stays on HAMi 2.8 still gets enforced shares.
SAME_LIBRARY_AS: dict[tuple[int, int, int], tuple[int, int, int]] = {(2, 8, 3): (2, 9, 0)}
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183}


@dataclass(frozen=True)
class HamiCoreStatus:
    """What the plugin found: the library to preload (None: none), isolation, version, problem."""

    library: Path | None
    isolation: str
    version: str | None = None
    #: Why shares are not enforced (or a caveat when they are), for the log and the Node event.
    problem: str | None = None


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = _VERSION.match(text.strip())
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def _elf_problem(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError as err:
        return f"cannot be read: {err.strerror}"
    if header[:4] != b"\x7fELF":
        return "is not an ELF shared object"
    if header[4] != 2:
        return "is not a 64-bit ELF object"
    if int.from_bytes(header[16:18], "little") != 3:  # ET_DYN
        return "is not a shared object"
    expected = _ELF_MACHINES.get(platform.machine())
    machine = int.from_bytes(header[18:20], "little")
    if expected is not None and machine != expected:
        return f"is built for another CPU (ELF machine {machine}, this node needs {expected})"
    return None


def inspect_library(library: Path | None, *, simulated: bool) -> HamiCoreStatus:
    """Decide the node's isolation from the configured library (``--hami-core-lib``)."""
    unenforced = ISOLATION_SIMULATED if simulated else ISOLATION_NONE
    if library is None:
        return HamiCoreStatus(None, unenforced, problem="no HAMi-core library configured (--hami-core-lib)")
    if not library.is_file():
        return HamiCoreStatus(None, unenforced, problem=f"HAMi-core library {library} does not exist")
    elf = _elf_problem(library)
    if elf is not None:
        return HamiCoreStatus(None, unenforced, problem=f"HAMi-core library {library} {elf}")
    version_file = library.with_name(library.name + ".version")
    try:
        text = version_file.read_text().strip()
    except OSError:
        return HamiCoreStatus(
            library,
            ISOLATION_HAMI_CORE,
            problem=f"HAMi-core library {library} has no {version_file.name}: its version is unknown "
            f"(v{'.'.join(map(str, MINIMUM_VERSION))} or later is required)",
        )
    version = parse_version(text)
    if version is None:
        return HamiCoreStatus(
            None, unenforced, problem=f"{version_file} says {text[:40]!r}, which is not a version"
        )
    minimum = "v" + ".".join(map(str, MINIMUM_VERSION))
    if SAME_LIBRARY_AS.get(version, version) < MINIMUM_VERSION:
        return HamiCoreStatus(
            None,
            unenforced,
            version=text,
            problem=f"HAMi-core {text} at {library} is older than {minimum}: not used (older libraries "
            f"hang in cuInit, drop the cores limit or miss CUDA 13 allocations); install {minimum} or later",
        )
    return HamiCoreStatus(library, ISOLATION_HAMI_CORE, version=".".join(map(str, version)))
