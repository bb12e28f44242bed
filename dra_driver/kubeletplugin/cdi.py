"""CDI specs: one transient spec per prepared claim, written atomically into the CDI dir.

The container runtime reads ``/var/run/cdi`` and injects what a spec says for the CDI IDs that
kubelet passes it. Naming follows dra-example-driver (vendor ``k8s.<driver>``, class ``gpu``,
file ``<vendor>-<class>_<claimUID>.json``, device ``<claimUID>-<device>[-<shareID>]``) so that IDs
are unique per claim and runtime caches never serve a stale device. ``cdiVersion`` is the lowest
version whose features the spec uses, because runtimes with older CDI libraries (podman 4.3
accepts up to 0.5.0) reject specs that declare a newer version than they know.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CDI_CLASS = "gpu"

#: Versions in order, with the features that require each (cncf-tags/container-device-interface
#: pkg/cdi/version.go). Anything not listed needs only the earliest version, 0.3.0.
_V030, _V040, _V050, _V060, _V070 = "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0"
_V110 = "1.1.0"


@dataclass(frozen=True)
class CdiNames:
    """CDI vendor/class/kind and file/device naming for one driver name."""

    driver_name: str

    @property
    def vendor(self) -> str:
        return f"k8s.{self.driver_name}"

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{CDI_CLASS}"

    def spec_file_name(self, claim_uid: str) -> str:
        return f"{self.vendor}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"

    def claim_uid(self, file_name: str) -> str | None:
        """The claim UID in one of our spec file names (inverse of :meth:`spec_file_name`), else None."""
        prefix, suffix = f"{self.vendor}-{CDI_CLASS}_", ".json"
        if (
            file_name.startswith(prefix)
            and file_name.endswith(suffix)
            and len(file_name) > len(prefix + suffix)
        ):
            return file_name[len(prefix) : -len(suffix)]
        return None

    def device_name(self, claim_uid: str, device: str, share_id: str | None) -> str:
        return f"{claim_uid}-{device}-{share_id}" if share_id else f"{claim_uid}-{device}"

    def qualified(self, device_name: str) -> str:
        return f"{self.kind}={device_name}"


def _edits_version(edits: dict[str, Any]) -> str:
    version = _V030
    rdt = edits.get("intelRdt") or {}
    if edits.get("netDevices") or rdt.get("schemata") is not None or rdt.get("enableMonitoring"):
        return _V110
    if edits.get("intelRdt") or edits.get("additionalGids"):
        return _V070
    for node in edits.get("deviceNodes") or []:
        if "hostPath" in node:
            version = max(version, _V050)
    for mount in edits.get("mounts") or []:
        if "type" in mount:
            version = max(version, _V040)
    return version


def minimum_version(spec: dict[str, Any]) -> str:
    """Lowest CDI spec version that accepts ``spec`` (string compare is safe for 0.x.0 versions)."""
    version = _V030
    kind = str(spec.get("kind", ""))
    if "." in kind.partition("/")[2] or spec.get("annotations"):
        version = _V060
    version = max(version, _edits_version(spec.get("containerEdits") or {}))
    for device in spec.get("devices") or []:
        if device.get("annotations"):
            version = max(version, _V060)
        if str(device.get("name", ""))[:1].isdigit():
            version = max(version, _V050)
        version = max(version, _edits_version(device.get("containerEdits") or {}))
    return version


def make_spec(kind: str, devices: list[dict[str, Any]], container_edits: dict[str, Any]) -> dict[str, Any]:
    """A complete spec dict with ``cdiVersion`` set to the minimum the content needs."""
    spec: dict[str, Any] = {"cdiVersion": _V030, "kind": kind, "devices": devices}
    if any(container_edits.values()):
        spec["containerEdits"] = {k: v for k, v in container_edits.items() if v}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Write ``spec`` to ``path`` atomically: temp file in the same dir, then rename.

    The temp name starts with a dot and does not end in .json, so a runtime scanning the dir never
    parses a half-written spec. No fsync: the CDI dir is a tmpfs (``/var/run/cdi``)
    that a reboot empties anyway, and the plugin re-creates missing specs on the next prepare;
    the checkpoint, not the spec, is the durable record.
    """
    data = json.dumps(spec, separators=(",", ":")).encode() + b"\n"  # compact: the C encoder
    replace_file(path, data, mode=0o644)


def replace_file(path: Path, data: bytes, *, mode: int = 0o600, sync: bool = False) -> None:
    """Atomically replace ``path`` with ``data``: a dot temp file beside it, then a rename.

    ``mode`` is set on the file descriptor (the umask does not apply); ``sync`` fsyncs the
    contents before the rename, so the rename never exposes a file whose data a power loss can
    take. A failure leaves the old file and no temp file. Plain ``os`` calls on one descriptor:
    this runs up to three times per prepared claim, and a Python file object, ``tempfile``'s
    random names and path-based ``chmod`` were a tenth of the plugin's CPU per prepare.
    """
    fd, tmp_name = temp_file_in(path.parent, prefix=f".{path.name}.")
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:  # a regular file does not do this; never loop on it
                    raise OSError(errno.EIO, f"writing {tmp_name}: nothing written")
                view = view[written:]
            if mode != 0o600:
                os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


#: Numbers the temp files of this process (``next`` on it is atomic under the GIL).
_TEMP_NUMBERS = itertools.count()
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_file_in(directory: Path, prefix: str) -> tuple[int, str]:
    """A new file ``<directory>/<prefix><pid>-<n>.tmp`` (mode 0600) open for writing, and its name.

    ``O_EXCL`` makes the file ours alone, as ``tempfile.mkstemp`` does, without its random
    names: a name taken (left by a crashed process, or used by a process of the same PID in
    another PID namespace) moves on to the next number. The directory is created only when it
    is missing: on the prepare path it exists, and a ``mkdir`` per write was a system call per
    file for nothing.
    """
    created = False
    while True:
        name = f"{directory}/{prefix}{os.getpid()}-{next(_TEMP_NUMBERS)}.tmp"
        try:
            return os.open(name, _TEMP_FLAGS, 0o600), name
        except FileExistsError:
            continue
        except FileNotFoundError:
            if created:
                raise
            directory.mkdir(parents=True, exist_ok=True)
            created = True


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_spec(path: Path) -> bool:
    """Delete a spec; True if it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
