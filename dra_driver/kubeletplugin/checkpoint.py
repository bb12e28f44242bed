"""The plugin's on-disk memory of prepared claims (``<plugin-dir>/checkpoint.json``).

Why it exists: NodeUnprepareResources must work after the claim object is gone, kubelet re-calls
NodePrepareResources after restarts, and the last-line-of-defence check needs to know what is
already prepared on the node. Properties that peers got wrong and we must not:
- two phases per claim: ``PrepareStarted`` is durable *before* any side effect (CDI spec), and
  ``PrepareCompleted`` after, so a crash in between is visible and the claim is simply prepared again;
- atomic replace with fsync (file and directory), so a crash never leaves a half-written file;
- a version and a SHA-256 checksum, so corruption is detected (and the caller rebuilds from the API
  instead of crashing);
- the node boot ID, so entries written before a reboot (when ``/var/run/cdi`` was wiped) are
  re-prepared, not trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin.cdi import fsync_dir
from dra_driver.kubeletplugin.claims import AllocatedDevice

LOG = logging.getLogger(__name__)

VERSION = 1
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
DEFAULT_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


class CheckpointUnreadable(OSError):
    """The checkpoint exists but cannot be read; the message names the file."""


class CorruptCheckpoint(Exception):
    """The checkpoint file exists but cannot be trusted."""


@dataclass
class ClaimEntry:
    """One claim's prepared state."""

    namespace: str
    name: str
    state: str
    boot_id: str
    devices: list[AllocatedDevice] = field(default_factory=list)
    #: CDI IDs returned per device, in the order of ``devices``.
    cdi_ids: list[list[str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "bootID": self.boot_id,
            "devices": [d.to_json() for d in self.devices],
            "cdiIDs": self.cdi_ids,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClaimEntry:
        state = data["state"]
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise ValueError(f"unknown state {state!r}")
        return cls(
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            state=state,
            boot_id=str(data.get("bootID", "")),
            devices=[AllocatedDevice.from_json(d) for d in data.get("devices") or []],
            cdi_ids=[[str(i) for i in ids] for ids in data.get("cdiIDs") or []],
        )


def read_boot_id(path: Path = DEFAULT_BOOT_ID_FILE) -> str:
    """The kernel's boot ID; changes on every reboot."""
    try:
        return path.read_text().strip()
    except OSError:
        LOG.warning("cannot read boot ID from %s; entries will not be invalidated on reboot", path)
        return "unknown"


def _canonical(claims: dict[str, Any]) -> bytes:
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def _checksum(claims: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(claims)).hexdigest()


class Checkpoint:
    """Load/save the claim map; callers serialise access (the Preparer holds a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Encoded entries by uid, reused while the entry (object and state) is unchanged: a save
        # then costs O(changed entries) in JSON work instead of O(all prepared claims). Holding
        # the entry object keeps its identity from being reused by another object.
        self._encoded: dict[str, tuple[ClaimEntry, str, str, bytes]] = {}

    def _encode(self, entries: dict[str, ClaimEntry]) -> bytes:
        """The canonical JSON of the claims map, byte-identical to ``_canonical`` of it."""
        parts = []
        fresh: dict[str, tuple[ClaimEntry, str, str, bytes]] = {}
        for uid in sorted(entries):
            entry = entries[uid]
            cached = self._encoded.get(uid)
            if cached is not None and cached[0] is entry and cached[1:3] == (entry.state, entry.boot_id):
                encoded = cached[3]
            else:
                encoded = _canonical(entry.to_json())
            fresh[uid] = (entry, entry.state, entry.boot_id, encoded)
            parts.append(json.dumps(uid).encode() + b":" + encoded)
        self._encoded = fresh
        return b"{" + b",".join(parts) + b"}"

    def load(self) -> dict[str, ClaimEntry]:
        """Entries by claim UID; {} when absent. Raises CorruptCheckpoint on anything untrustworthy."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as err:
            # Not corrupt, unreadable (permissions, a directory, I/O): quarantining it would lose
            # what it knows, so the plugin refuses to start and says which file to fix.
            raise CheckpointUnreadable(
                f"cannot read the checkpoint {self.path}: {err.strerror or err}; fix it or move it away "
                "(the plugin then rebuilds it from the API)"
            ) from err
        try:
            document = json.loads(raw)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            if document.get("version") != VERSION:
                raise ValueError(f"unsupported version {document.get('version')!r} (want {VERSION})")
            claims = document["claims"]
            if not isinstance(claims, dict):
                raise ValueError("claims is not an object")
            if document.get("checksum") != _checksum(claims):
                raise ValueError("checksum mismatch")
            return {uid: ClaimEntry.from_json(entry) for uid, entry in claims.items()}
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptCheckpoint(f"{self.path}: {err}") from err

    def save(self, entries: dict[str, ClaimEntry]) -> None:
        """Atomically replace the checkpoint with ``entries``."""
        canonical = self._encode(entries)
        checksum = hashlib.sha256(canonical).hexdigest()
        # The claims object is embedded exactly as hashed, so one serialisation serves both.
        data = b'{"version":%d,"checksum":"%s","claims":%s}' % (VERSION, checksum.encode(), canonical)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".checkpoint.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, self.path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)

    def quarantine(self) -> Path | None:
        """Move a corrupt file aside (kept for post-mortem) so the next save starts clean."""
        if not self.path.exists():
            return None
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, target)
        return target
