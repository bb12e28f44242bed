"""The checkpoint file's contract: its format, what counts as corrupt (and says why), atomic saves.

The file outlives plugin versions and is read after crashes, so its encoding is pinned here byte
for byte (sorted keys, the checksum over exactly the ``claims`` text), and each refusal names the
file and the reason an operator needs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin import checkpoint as module
from dra_driver.kubeletplugin.checkpoint import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimEntry,
    CorruptCheckpoint,
    read_boot_id,
)
from dra_driver.kubeletplugin.checkpoint_formats import WRITER

UID = "8d0a4c1e-3b2f-4e6a-9c7d-1f2e3a4b5c6d"


def entry(**overrides: Any) -> ClaimEntry:
    values: dict[str, Any] = {"namespace": "ns", "name": "c", "state": PREPARE_COMPLETED, "boot_id": "boot-1"}
    values.update(overrides)
    return ClaimEntry(**values)


def document(claims: dict[str, Any], version: int = 1, checksum: str | None = None) -> bytes:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    digest = checksum if checksum is not None else hashlib.sha256(canonical).hexdigest()
    return json.dumps({"version": version, "checksum": digest, "claims": claims}).encode()


def test_saved_file_is_the_canonical_encoding(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "checkpoint.json"  # parents are created
    Checkpoint(path).save({UID: entry()})
    raw = path.read_bytes()
    claims = {UID: {"bootID": "boot-1", "cdiIDs": [], "devices": [], "name": "c", "namespace": "ns",
                    "state": PREPARE_COMPLETED}}  # fmt: skip
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    checksum = hashlib.sha256(canonical.encode()).hexdigest()
    head = f'{{"version":{CURRENT_VERSION},"writer":{json.dumps(WRITER)},"checksum":"{checksum}"'
    assert raw == f'{head},"claims":{canonical}}}'.encode()
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.json"], "no temp file left behind"


def test_a_file_written_with_other_key_order_is_accepted(tmp_path: Path) -> None:
    """The checksum is over the canonical (sorted) form, whatever order the file has."""
    claims = {UID: {"state": PREPARE_COMPLETED, "namespace": "ns", "name": "c", "bootID": "b"}}
    path = tmp_path / "checkpoint.json"
    path.write_bytes(document(claims))
    loaded = Checkpoint(path).load()
    assert loaded[UID].boot_id == "b" and loaded[UID].devices == [] and loaded[UID].cdi_ids == []


def test_missing_boot_id_loads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(document({UID: {"state": PREPARE_COMPLETED, "namespace": "ns", "name": "c"}}))
    assert Checkpoint(path).load()[UID].boot_id == ""


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"[]", "not a JSON object"),
        (document({}, version=-1), "unsupported version -1 (want 1 to 2)"),
        (json.dumps({"version": 1, "checksum": "", "claims": []}).encode(), "claims is not an object"),
        (document({UID: {"state": PREPARE_COMPLETED, "namespace": "n", "name": "c"}}, checksum="0" * 64),
         "checksum mismatch"),
        (document({UID: {"state": "Halfway", "namespace": "n", "name": "c"}}), "unknown state 'Halfway'"),
        (b"{not json", "Expecting property name"),
    ],
)  # fmt: skip
def test_corrupt_files_name_the_file_and_the_reason(tmp_path: Path, raw: bytes, reason: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(raw)
    with pytest.raises(CorruptCheckpoint) as refused:
        Checkpoint(path).load()
    assert str(refused.value).startswith(f"{path}: ") and reason in str(refused.value)


def test_an_unreadable_file_says_how_to_recover(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    with pytest.raises(OSError) as refused:
        Checkpoint(path).load()
    assert str(refused.value) == (
        f"cannot read the checkpoint {path}: Is a directory; fix it or move it away "
        "(the plugin then rebuilds it from the API)"
    )


def test_saves_go_through_a_dot_temp_file_in_the_same_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new contents are whole (fsynced) in a dot temp file beside the checkpoint before the
    rename: a crash never leaves a half-written checkpoint, nor a temp file a scan would read."""
    renames: list[tuple[str, str, bytes]] = []
    synced: list[int] = []
    real_replace, real_fsync = module.os.replace, module.os.fsync

    def recording_replace(source: str, target: Path) -> None:
        renames.append((source, str(target), Path(source).read_bytes()))
        real_replace(source, target)

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(module.os, "replace", recording_replace)
    monkeypatch.setattr(module.os, "fsync", recording_fsync)
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save({UID: entry()}, sync_directory=False)
    ((source, target, contents),) = renames
    assert target == str(path) and contents == path.read_bytes()
    temp = Path(source)
    assert temp.parent == tmp_path and temp.name.startswith(".checkpoint.") and temp.suffix == ".tmp"
    assert len(synced) == 1  # the file's contents, before the rename
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_a_failed_save_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save({UID: entry()})
    before = path.read_bytes()

    def fail(*_: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(module.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        Checkpoint(path).save({UID: entry(boot_id="boot-2")})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_an_unreadable_boot_id_is_reported_with_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "boot_id"
    with caplog.at_level(logging.WARNING, logger=module.LOG.name):
        assert read_boot_id(missing) == "unknown"
    assert caplog.messages == [
        f"cannot read boot ID from {missing}; entries will not be invalidated on reboot"
    ]


def test_unchanged_entries_reuse_their_encoding_and_changed_ones_are_encoded_again(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    entries = {UID: entry()}
    checkpoint.save(entries)
    first = checkpoint._encoded[UID][3]
    checkpoint.save(entries)
    assert checkpoint._encoded[UID][3] is first, "an unchanged entry is not encoded again"
    entries[UID].boot_id = "boot-2"
    checkpoint.save(entries)
    assert checkpoint._encoded[UID][3] is not first
    assert Checkpoint(tmp_path / "checkpoint.json").load()[UID].boot_id == "boot-2"
