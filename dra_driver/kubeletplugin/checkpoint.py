"""The plugin's on-disk memory of prepared claims (``<plugin-dir>/checkpoint.json``).

Why it exists: NodeUnprepareResources must work after the claim object is gone, kubelet re-calls
NodePrepareResources after restarts, and the last-line-of-defence check needs to know what is
already prepared on the node. Properties that peers got wrong and we must not:
- an entry is ``PrepareCompleted`` and on disk before kubelet hears that its claim is prepared,
  so the share of every claim a container may use survives a crash; one write per
  NodePrepareResources call serves all its claims (``prepare.py`` says why no durable intent
  entry precedes the CDI spec). ``PrepareStarted`` marks an entry whose files may be incomplete (a
  claim being prepared, a rebuilt entry without its spec, or an entry older plugin versions wrote
  before the spec): it keeps its share and is prepared again on request;
- atomic replace with an fsync of the file before the rename, so no crash leaves a half-written
  file, and of the directory after it where a power loss must not undo the rename (removals:
  ``Preparer._persist``);
- a version and a SHA-256 checksum, so corruption is detected (and the caller rebuilds from the
  claim records instead of crashing); every format written before is converted on load
  (``checkpoint_formats.py``), and a format newer than this code is refused with what to do;
- the node boot ID, so entries written before a reboot (when ``/var/run/cdi`` was wiped) are
  re-prepared, not trusted.

:class:`ClaimRecords` keeps one file per prepared claim beside it, so a corrupt checkpoint is
rebuilt from the node alone: the plugin may only ``get`` claims (listing every claim in the
cluster is a right it does not have), and the API cannot describe a claim deleted while its pod
runs, whose share must still count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin.cdi import fsync_dir, replace_file
from dra_driver.kubeletplugin.checkpoint_formats import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    WRITER,
    EntryV2,
    FormatError,
    NewerFormat,
    canonical,
    decode,
    decode_entry,
)
from dra_driver.kubeletplugin.claims import AllocatedDevice, is_kubernetes_uid

LOG = logging.getLogger(__name__)

__all__ = [
    "CURRENT_VERSION",
    "PREPARE_COMPLETED",
    "PREPARE_STARTED",
    "Checkpoint",
    "CheckpointFromNewerVersion",
    "CheckpointUnreadable",
    "ClaimEntry",
    "ClaimRecords",
    "CorruptCheckpoint",
    "read_boot_id",
]

DEFAULT_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
#: The top of every file this code writes, up to the checksum (the writer as a JSON string).
_HEADER = b'{"version":%d,"writer":%s,"checksum":"' % (CURRENT_VERSION, json.dumps(WRITER).encode())


class CheckpointUnreadable(OSError):
    """The checkpoint exists but cannot be read; the message names the file."""


class CheckpointFromNewerVersion(CheckpointUnreadable):
    """The checkpoint is of a format newer than this plugin reads (a downgrade): left in place.

    Not quarantined: the claims it records hold GPU shares that this plugin cannot count, so
    starting without them could hand the same room out twice. The message says what to do.
    """


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

    def completed(self) -> ClaimEntry:
        """This entry in the ``PrepareCompleted`` state (a new object: entries are never mutated)."""
        return replace(self, state=PREPARE_COMPLETED)

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
    def from_model(cls, entry: EntryV2) -> ClaimEntry:
        """The entry an on-disk one (current format, validated) describes."""
        return cls(
            namespace=entry.namespace,
            name=entry.name,
            state=entry.state,
            boot_id=entry.bootID,
            devices=[
                AllocatedDevice(d.request, d.pool, d.device, d.shareID, dict(d.consumed), d.adminAccess)
                for d in entry.devices
            ],
            cdi_ids=[list(ids) for ids in entry.cdiIDs],
        )


def read_boot_id(path: Path = DEFAULT_BOOT_ID_FILE) -> str:
    """The kernel's boot ID; changes on every reboot."""
    try:
        return path.read_text().strip()
    except OSError:
        LOG.warning("cannot read boot ID from %s; entries will not be invalidated on reboot", path)
        return "unknown"


class Checkpoint:
    """Load/save the claim map; callers serialise access (the Preparer holds a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Encoded ``"uid":{entry}`` members by uid, reused while the entry (object and state) is
        # unchanged: a save then costs O(changed entries) in JSON work instead of O(all prepared
        # claims). Holding the entry object keeps its identity from being reused by another object.
        self._encoded: dict[str, tuple[ClaimEntry, str, str, bytes]] = {}

    def _encode(self, entries: dict[str, ClaimEntry]) -> bytes:
        """The canonical JSON of the claims map, byte-identical to ``canonical`` of it."""
        parts = []
        fresh: dict[str, tuple[ClaimEntry, str, str, bytes]] = {}
        previous = self._encoded
        for uid in sorted(entries):
            entry = entries[uid]
            cached = previous.get(uid)
            if (
                cached is not None
                and cached[0] is entry
                and cached[1] == entry.state
                and cached[2] == entry.boot_id
            ):
                member = cached[3]
            else:
                member = b"%s:%s" % (json.dumps(uid).encode(), canonical(entry.to_json()))
            fresh[uid] = (entry, entry.state, entry.boot_id, member)
            parts.append(member)
        self._encoded = fresh
        return b"{" + b",".join(parts) + b"}"

    def load(self) -> dict[str, ClaimEntry]:
        """Entries by claim UID; {} when absent. An earlier format is converted (in memory).

        Raises CorruptCheckpoint on anything untrustworthy, CheckpointUnreadable when the file
        cannot be read, and its CheckpointFromNewerVersion for a format newer than this code.
        """
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
            version, contents = decode(raw)
        except FormatError as err:
            raise CorruptCheckpoint(f"{self.path}: {err}") from err
        except NewerFormat as newer:
            raise CheckpointFromNewerVersion(self._newer_message(newer)) from None
        if version != CURRENT_VERSION:
            LOG.warning(
                "checkpoint %s is format %d; read as format %d, and rewritten so at the next write",
                self.path, version, CURRENT_VERSION,
            )  # fmt: skip
        return {uid: ClaimEntry.from_model(entry) for uid, entry in contents.claims.items()}

    def _newer_message(self, newer: NewerFormat) -> str:
        by = f" (written by {newer.writer})" if newer.writer else ""
        return (
            f"the checkpoint {self.path} is format {newer.version}{by}, newer than this plugin "
            f"({WRITER}) reads (formats 1 to {CURRENT_VERSION}); it records the claims prepared on "
            "this node, whose GPU shares this plugin could not count. Run the newer plugin again; to "
            "downgrade, drain the node of pods with GPU claims while the newer plugin runs (kubelet "
            "unprepares their claims), then downgrade and move this file away: the plugin starts empty"
        )

    def save(self, entries: dict[str, ClaimEntry], *, sync_directory: bool = True) -> None:
        """Atomically replace the checkpoint with ``entries``; its contents are on disk when it returns.

        ``sync_directory=False`` leaves the rename itself to the file system's next commit (a
        process crash still sees it; a power loss may bring back the previous file, whole): the
        caller then calls :meth:`sync_directory` before it relies on the new file surviving one.
        """
        encoded = self._encode(entries)
        checksum = hashlib.sha256(encoded).hexdigest()
        # The claims object is embedded exactly as hashed, so one serialisation serves both.
        data = b'%s%s","claims":%s}' % (_HEADER, checksum.encode(), encoded)
        replace_file(self.path, data, sync=True)
        if sync_directory:
            self.sync_directory()

    def sync_directory(self) -> None:
        """Make the last rename of the checkpoint durable (fsync of its directory)."""
        fsync_dir(self.path.parent)

    def quarantine(self) -> Path | None:
        """Move a corrupt file aside (kept for post-mortem) so the next save starts clean."""
        if not self.path.exists():
            return None
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, target)
        return target


class ClaimRecords:
    """One record per prepared claim, ``<dir>/<uid>.json``: the claim's entry, the checkpoint's backup.

    Written before the claim's CDI spec and removed after it, so every spec of ours on the node
    has a record. A record is ``{"uid", **entry}`` in the entry layout of every checkpoint format
    so far (:class:`~dra_driver.kubeletplugin.checkpoint_formats.EntryV2`), which is what lets a
    downgraded plugin rebuild its checkpoint from them: a change of that layout needs a version
    field here too. Records are not fsynced: they matter only when the checkpoint is corrupt within
    the same boot (a crash of the node loses ``/var/run/cdi`` too, and every live claim is then
    prepared again from the API), and an atomic rename never leaves a half-written record.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, claim_uid: str) -> Path:
        """The record file; refuses anything but a Kubernetes UID (it becomes a file name)."""
        if not is_kubernetes_uid(claim_uid):
            raise ValueError(f"refusing a claim record for uid {claim_uid[:64]!r}: not a Kubernetes UID")
        return self.directory / f"{claim_uid}.json"

    def write(self, claim_uid: str, entry: ClaimEntry) -> None:
        """Atomically replace the record of ``claim_uid``."""
        data = json.dumps({"uid": claim_uid, **entry.to_json()}, sort_keys=True).encode()
        replace_file(self.path(claim_uid), data)

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)

    def exists(self, claim_uid: str) -> bool:
        return self.path(claim_uid).is_file()

    def load_all(self) -> dict[str, ClaimEntry]:
        """Every readable record by claim UID; unreadable ones are skipped with a warning naming them."""
        entries: dict[str, ClaimEntry] = {}
        if not self.directory.is_dir():
            return entries
        for path in sorted(self.directory.glob("*.json")):
            entry = self._load(path)
            if entry is not None:
                entries[path.stem] = entry
        return entries

    @staticmethod
    def _load(path: Path) -> ClaimEntry | None:
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict) or data.get("uid") != path.stem or not is_kubernetes_uid(path.stem):
                raise ValueError("not the record of the claim its file name says")
            return ClaimEntry.from_model(decode_entry(data))
        except (OSError, ValueError) as err:
            LOG.warning("claim record %s is unreadable (%s); skipped", path, err)
            return None
