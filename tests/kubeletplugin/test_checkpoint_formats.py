"""Every checkpoint format the plugin has written loads into the same prepared claims.

The fixtures were written by the old plugins' own code (``hack/checkpoint_fixtures.py`` runs each
commit's Preparer from ``git archive``): the same three claims on a two-GPU node, ``a`` sharing
gpu-0, ``b`` holding gpu-1 whole, ``c`` sharing gpu-0 and left ``PrepareStarted``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.kubeletplugin.checkpoint import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointFromNewerVersion,
    CheckpointUnreadable,
    ClaimEntry,
    ClaimRecords,
    CorruptCheckpoint,
)
from dra_driver.kubeletplugin.checkpoint_formats import WRITER, EntryV1, canonical, checksum, decode
from dra_driver.kubeletplugin.claims import AllocatedDevice, ClaimRef
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.inventory import Inventory, NodeGpu
from dra_driver.kubeletplugin.prepare import CAPACITY_HINT, Preparer, PreparerConfig
from tests.kubeletplugin.helpers import DRIVER, GIB, claim, result, validate_cdi

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints"
#: Format 1 with CDI specs in the entries, and format 1 as its last writer left it.
HISTORICAL = ["v1-8b268a3.json", "v1-28f86d3.json"]

BOOT = "3f6c1f0e-0d5b-4d3e-9a43-6b1f4c2d7e10"
UID_A = "0b5d3c52-6f4e-4a8e-9d1c-2e7f8a9b0c1d"
UID_B = "1c6e4d63-7a5f-4b9f-8e2d-3f8a9b0c1d2e"
UID_C = "2d7f5e74-8b6a-4cad-9f3e-4a9b0c1d2e3f"
SHARE_A = "6c1e2d3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
SHARE_C = "7d2f3e4a-5b6c-4d7e-9f8a-0b1c2d3e4f5a"
CDI_A = f"k8s.gpu.hami.io/gpu={UID_A}-gpu-0-{SHARE_A}"

#: What the fixtures' writers were asked to prepare (their claims, read back by hand).
EXPECTED = {
    UID_A: ClaimEntry(
        "team-a", "a", PREPARE_COMPLETED, BOOT,
        [AllocatedDevice("gpu", "node-1", "gpu-0", SHARE_A, {"memory": 4 * GIB, "cores": 25, "slots": 1})],
        [[CDI_A]],
    ),
    UID_B: ClaimEntry(
        "team-a", "b", PREPARE_COMPLETED, BOOT,
        [AllocatedDevice("whole", "node-1", "gpu-1")],
        [[f"k8s.gpu.hami.io/gpu={UID_B}-gpu-1"]],
    ),
    UID_C: ClaimEntry(
        "team-a", "c", PREPARE_STARTED, BOOT,
        [AllocatedDevice("gpu/small", "node-1", "gpu-0", SHARE_C,
                         {"memory": 2 * GIB, "cores": 10, "slots": 1})],
        [[f"k8s.gpu.hami.io/gpu={UID_C}-gpu-0-{SHARE_C}"]],
    ),
}  # fmt: skip


def copy_fixture(name: str, directory: Path) -> Path:
    path = directory / "checkpoint.json"
    path.write_bytes((FIXTURES / name).read_bytes())
    return path


def v2_document(claims: dict[str, Any], **top: Any) -> bytes:
    body = {"version": 2, "writer": WRITER, "checksum": checksum(claims), "claims": claims, **top}
    return json.dumps(body).encode()


@pytest.mark.parametrize("name", HISTORICAL)
def test_each_historical_format_loads_into_the_same_entries(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = copy_fixture(name, tmp_path)
    before = path.read_bytes()
    assert json.loads(before)["version"] == 1
    with caplog.at_level(logging.WARNING):
        assert Checkpoint(path).load() == EXPECTED
    assert caplog.messages == [
        f"checkpoint {path} is format 1; read as format 2, and rewritten so at the next write"
    ]
    assert path.read_bytes() == before, "loading converts in memory; the file changes at the next write"


def test_the_first_format_kept_cdi_specs_and_the_conversion_drops_them() -> None:
    raw = (FIXTURES / "v1-8b268a3.json").read_bytes()
    assert all(entry["spec"]["kind"] == "k8s.gpu.hami.io/gpu" for entry in json.loads(raw)["claims"].values())
    version, contents = decode(raw)
    assert version == 1 and contents.version == CURRENT_VERSION
    assert all("spec" not in entry.model_dump() for entry in contents.claims.values())


@pytest.mark.parametrize("name", HISTORICAL)
def test_the_next_write_rewrites_the_file_in_the_current_format(name: str, tmp_path: Path) -> None:
    checkpoint = Checkpoint(copy_fixture(name, tmp_path))
    checkpoint.save(checkpoint.load())
    document = json.loads(checkpoint.path.read_bytes())
    assert (document["version"], document["writer"]) == (CURRENT_VERSION, WRITER)
    assert document["checksum"] == checksum(document["claims"])
    assert all("spec" not in entry for entry in document["claims"].values())
    assert Checkpoint(checkpoint.path).load() == EXPECTED


def fixture_node() -> Inventory:
    """The fixtures' node: two 16 GiB GPUs."""
    return Inventory([
        NodeGpu("gpu-0", 0, 0, "GPU-5e0c7a4b-1d2e-4f3a-8b9c-0d1e2f3a4b5c", "0000:3b:00.0", 16 * GIB),
        NodeGpu("gpu-1", 1, 1, "GPU-6f1d8b5c-2e3f-4a4b-9cad-1e2f3a4b5c6d", "0000:86:00.0", 16 * GIB),
    ])  # fmt: skip


class OnlyClaims:
    """The API holding just ``claims``; every read is counted."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.by_uid = {c["metadata"]["uid"]: c for c in claims}
        self.reads: list[str] = []

    def get(self, ref: ClaimRef) -> dict[str, Any]:
        self.reads.append(ref.uid)
        return self.by_uid[ref.uid]

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        return uid in self.by_uid


@pytest.mark.parametrize("name", HISTORICAL)
def test_a_plugin_started_on_an_old_checkpoint_keeps_its_claims_and_their_shares(
    name: str, tmp_path: Path
) -> None:
    copy_fixture(name, tmp_path)
    big = claim("big", [result("gpu-0", memory="11Gi")], namespace="team-b")
    api = OnlyClaims(big)
    config = PreparerConfig(
        driver=DRIVER, pool="node-1", cdi_dir=tmp_path / "cdi", hami=HamiCoreConfig(tmp_path / "hami"),
        simulated=True, boot_id=BOOT,
    )  # fmt: skip
    (tmp_path / "cdi").mkdir()
    preparer = Preparer(config, fixture_node(), api, Checkpoint(tmp_path / "checkpoint.json"))
    preparer.start()

    # Prepared in this boot: answered from the entry, without the API, its CDI spec written again.
    answer = preparer.prepare([ClaimRef("team-a", "a", UID_A)])[UID_A]
    assert answer.error == "" and api.reads == []
    assert [(d.device, d.cdi_ids, d.share_id) for d in answer.devices] == [("gpu-0", [CDI_A], SHARE_A)]
    spec = json.loads((tmp_path / "cdi" / preparer.names.spec_file_name(UID_A)).read_text())
    validate_cdi(spec)
    assert f"{spec['kind']}={spec['devices'][0]['name']}" == CDI_A

    # a (4 GiB) and the half-prepared c (2 GiB) keep their room on gpu-0: 11 GiB more does not fit.
    refused = preparer.prepare([ClaimRef("team-b", "big", big["metadata"]["uid"])])
    error = refused[big["metadata"]["uid"]].error
    assert "gpu-0" in error and CAPACITY_HINT in error, error
    assert json.loads((tmp_path / "checkpoint.json").read_bytes())["version"] == 1, "nothing written yet"


def test_records_written_now_read_as_format_1_entries(tmp_path: Path) -> None:
    """A downgraded plugin (format 1) quarantines a format-2 checkpoint and rebuilds from the records."""
    records = ClaimRecords(tmp_path)
    records.write(UID_A, EXPECTED[UID_A])
    data = json.loads(records.path(UID_A).read_bytes())
    old = EntryV1.model_validate(data)
    assert (old.namespace, old.name, old.state, old.bootID) == ("team-a", "a", PREPARE_COMPLETED, BOOT)
    assert old.cdiIDs == [[CDI_A]]
    devices = [d.model_dump(exclude_defaults=True) for d in old.devices]
    assert devices == [EXPECTED[UID_A].devices[0].to_json()]
    assert records.load_all() == {UID_A: EXPECTED[UID_A]}


def test_a_newer_format_is_refused_in_place_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(v2_document({}, version=3, writer="hami-dra 9.0.0", shape="unknown to us"))
    with pytest.raises(CheckpointFromNewerVersion) as refused:
        Checkpoint(path).load()
    message = str(refused.value)
    assert isinstance(refused.value, CheckpointUnreadable), "the plugin stops with one line"
    assert message.startswith(f"the checkpoint {path} is format 3 (written by hami-dra 9.0.0), newer than")
    assert f"reads (formats 1 to {CURRENT_VERSION})" in message
    assert "Run the newer plugin again" in message and "drain the node" in message
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"], "left in place, not quarantined"


def test_a_plugin_refuses_to_start_on_a_newer_format(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(v2_document({}, version=7))
    before = path.read_bytes()
    config = PreparerConfig(
        driver=DRIVER, pool="node-1", cdi_dir=tmp_path / "cdi", hami=HamiCoreConfig(tmp_path / "hami"),
        simulated=True, boot_id=BOOT,
    )  # fmt: skip
    preparer = Preparer(config, fixture_node(), OnlyClaims(), Checkpoint(path))
    with pytest.raises(CheckpointFromNewerVersion, match="is format 7 "):
        preparer.start()
    assert path.read_bytes() == before


ENTRY = {"namespace": "n", "name": "c", "state": PREPARE_COMPLETED}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (v2_document({}, version=0), "unsupported version 0 (want 1 to 2)"),
        (v2_document({}, version=True), "unsupported version True"),
        (v2_document({}, version="2"), "unsupported version '2'"),
        (json.dumps({"version": 2, "checksum": checksum({}), "claims": {}}).encode(),
         "writer: Field required"),
        (v2_document({"u": {**ENTRY, "devices": [{"pool": "p"}]}}),
         "claims.u.devices.0.request: Field required"),
        (v2_document({"u": {**ENTRY, "cdiIDs": "x"}}), "claims.u.cdiIDs: Input should be a valid list"),
    ],
)  # fmt: skip
def test_malformed_current_files_are_corrupt_and_say_where(tmp_path: Path, raw: bytes, reason: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(raw)
    with pytest.raises(CorruptCheckpoint) as refused:
        Checkpoint(path).load()
    assert str(refused.value).startswith(f"{path}: ") and reason in str(refused.value)


def test_format_1_null_lists_and_a_missing_boot_id_read_as_empty(tmp_path: Path) -> None:
    claims = {UID_A: {**ENTRY, "state": PREPARE_STARTED, "devices": None, "cdiIDs": None, "spec": None}}
    path = tmp_path / "checkpoint.json"
    path.write_bytes(
        b'{"version":1,"checksum":"%s","claims":%s}' % (checksum(claims).encode(), canonical(claims))
    )
    assert Checkpoint(path).load() == {UID_A: ClaimEntry("n", "c", PREPARE_STARTED, "")}


def test_a_claim_record_of_the_last_format_1_writer_reads_as_its_entry(tmp_path: Path) -> None:
    """The rebuild after a corrupt checkpoint reads records an older plugin wrote."""
    (tmp_path / f"{UID_A}.json").write_bytes((FIXTURES / "record-28f86d3.json").read_bytes())
    assert ClaimRecords(tmp_path).load_all() == {UID_A: EXPECTED[UID_A]}


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_devices = st.builds(
    AllocatedDevice,
    request=_text,
    pool=_text,
    device=_text,
    share_id=st.none() | _text,
    consumed=st.dictionaries(st.sampled_from(["memory", "cores", "slots"]), st.integers(0, 1 << 50)),
    admin_access=st.booleans(),
)
_entries = st.builds(
    ClaimEntry,
    namespace=_text,
    name=_text,
    state=st.sampled_from([PREPARE_STARTED, PREPARE_COMPLETED]),
    boot_id=_text,
    devices=st.lists(_devices, max_size=3),
    cdi_ids=st.lists(st.lists(_text, max_size=2), max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(_text, _entries, max_size=4), min_size=1, max_size=3))
def test_what_is_saved_is_what_the_current_model_reads_back(
    tmp_path: Path, saves: list[dict[str, ClaimEntry]]
) -> None:
    """The hand-made encoder (cached per entry across saves) and the format-2 model agree."""
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    for entries in saves:
        checkpoint.save(entries)
        raw = checkpoint.path.read_bytes()
        version, contents = decode(raw)
        assert version == CURRENT_VERSION and contents.writer == WRITER
        assert Checkpoint(checkpoint.path).load() == entries
