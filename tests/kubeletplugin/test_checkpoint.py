"""Checkpoint format: round trip, checksum, corruption, version (older and newer formats:
``test_checkpoint_formats.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimEntry,
    CorruptCheckpoint,
    read_boot_id,
)
from dra_driver.kubeletplugin.claims import AllocatedDevice


def entries() -> dict[str, ClaimEntry]:
    device = AllocatedDevice("gpu/small", "node-1", "gpu-0", "s-1", {"memory": 1024, "cores": 10})
    return {
        "u1": ClaimEntry("ns", "c1", PREPARE_COMPLETED, "boot-a", [device], [["k/gpu=x"]]),
        "u2": ClaimEntry("ns", "c2", PREPARE_STARTED, "boot-a"),
    }


def test_round_trip_and_atomic(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    assert checkpoint.load() == {}
    checkpoint.save(entries())
    loaded = checkpoint.load()
    assert loaded == entries()
    assert loaded["u1"].devices[0].base_request == "gpu"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda text: text[: len(text) // 2],  # torn write
        lambda text: text.replace('"c1"', '"c9"'),  # content changed under the checksum
        lambda text: json.dumps({**json.loads(text), "version": 0}),  # no format ever had it
        lambda text: "[]",
        lambda text: json.dumps({**json.loads(text), "claims": {"u": {"state": "Bogus"}}}),
    ],
)
def test_corruption_is_detected(tmp_path: Path, mutate: object) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    checkpoint.save(entries())
    checkpoint.path.write_text(mutate(checkpoint.path.read_text()))  # type: ignore[operator]
    with pytest.raises(CorruptCheckpoint):
        checkpoint.load()
    moved = checkpoint.quarantine()
    assert moved is not None and moved.exists() and not checkpoint.path.exists()


def test_boot_id(tmp_path: Path) -> None:
    (tmp_path / "boot").write_text("abc\n")
    assert read_boot_id(tmp_path / "boot") == "abc"
    assert read_boot_id(tmp_path / "missing") == "unknown"


def test_incremental_encoding_matches_canonical_form(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    current = entries()
    checkpoint.save(current)
    current["u2"].state = PREPARE_COMPLETED  # mutated in place: must not reuse the stale encoding
    del current["u1"]
    checkpoint.save(current)
    loaded = checkpoint.load()  # verifies the checksum against a fresh canonical dump
    assert loaded["u2"].state == PREPARE_COMPLETED and "u1" not in loaded
