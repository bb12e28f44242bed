"""The Preparer on its own: an in-memory claim source, a real checkpoint and CDI directory.

These pin down behaviour a mutation run (``make mutation``) found unchecked: which checkpoint
entries a rebuild from the claim records keeps and what they say, that a claim deleted from the
API keeps its entry and share until kubelet unprepares it (the report only reports), one answer
per claim named twice, the per-operation metrics, the exact simulated CDI edits, the error each
failure path returns, and the crash hook itself.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin import failpoint
from dra_driver.kubeletplugin import prepare as prepare_module
from dra_driver.kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimEntry,
    ClaimRecords,
)
from dra_driver.kubeletplugin.claims import ClaimError, ClaimNotFound, ClaimRef, devices_for_node
from dra_driver.kubeletplugin.control_nodes import HostView
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.inventory import Inventory
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.prepare import CAPACITY_HINT, Preparer, PreparerConfig, PrepareResult
from dra_driver.kubeletplugin.toolkit import ToolkitRegistry
from tests.kubeletplugin.helpers import DRIVER, claim, gpu, result, validate_cdi
from tests.kubeletplugin.toolkit_specs import (
    DRIVER_VERSION,
    LIB_DIR,
    common_edits,
    host_root_with_libraries,
    write_toolkit_spec,
)

POOL = "node-1"
BOOT = "boot-2"


class FakeClaims:
    """The API as the Preparer sees it (get only); ``unreadable`` names claims whose lookups fail."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.by_uid = {c["metadata"]["uid"]: c for c in claims}
        self.unreadable: set[str] = set()
        self.down = False
        self.reads = 0
        self.checks: list[str] = []

    def get(self, ref: ClaimRef) -> dict[str, Any]:
        self.reads += 1
        if self.down:
            raise ClaimError("the API is down")
        if ref.uid not in self.by_uid:
            raise ClaimNotFound(f"ResourceClaim {ref} not found")
        return self.by_uid[ref.uid]

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        self.checks.append(uid)
        if self.down or uid in self.unreadable:
            raise ClaimError(f"cannot read {namespace}/{name}")
        return uid in self.by_uid

    def delete(self, obj: dict[str, Any]) -> None:
        """The claim is deleted from the API (a tenant stripped the finalizer); its pod runs on."""
        del self.by_uid[obj["metadata"]["uid"]]


def reserved(obj: dict[str, Any]) -> dict[str, Any]:
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}]
    return obj


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def make(
    tmp_path: Path,
    claims: FakeClaims,
    *,
    simulated: bool = True,
    library: bool = False,
    metrics: PluginMetrics | None = None,
    toolkit: ToolkitRegistry | None = None,
) -> Preparer:
    lib = tmp_path / "libvgpu.so"
    lib.write_text("")
    config = PreparerConfig(
        driver=DRIVER,
        pool=POOL,
        cdi_dir=tmp_path / "cdi",
        hami=HamiCoreConfig(tmp_path / "hami", lib if library else None),
        simulated=simulated,
        boot_id=BOOT,
    )
    (tmp_path / "cdi").mkdir(exist_ok=True)
    inventory = Inventory([gpu(0), gpu(1)])
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    return Preparer(config, inventory, claims, checkpoint, metrics, toolkit=toolkit)


def entry_for(obj: dict[str, Any], *, boot: str = BOOT, state: str = PREPARE_COMPLETED) -> ClaimEntry:
    devices = devices_for_node(obj, ref_of(obj), DRIVER, POOL)
    return ClaimEntry(obj["metadata"]["namespace"], obj["metadata"]["name"], state, boot, devices, [["x"]])


# --- rebuilding a corrupt checkpoint from the claim records on the node ---------------------------


def corrupt(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text("{not json")


def test_a_rebuild_restores_every_prepared_claim_from_its_record_without_the_api(tmp_path: Path) -> None:
    first = claim("first", [result("gpu-0")], namespace="team-a")
    second = claim("second", [result("gpu-1", share=False)], namespace="team-b")
    claims = FakeClaims(first, second)
    before = make(tmp_path, claims, library=True)
    before.start()
    assert not any(a.error for a in before.prepare([ref_of(first), ref_of(second)]).values())
    prepared = before.prepared()
    corrupt(tmp_path)
    claims.down = True  # the rebuild needs nothing from the API
    preparer = make(tmp_path, claims, library=True)
    preparer.start()
    entries = preparer.prepared()
    assert entries == prepared and {e.state for e in entries.values()} == {PREPARE_COMPLETED}
    for obj in (first, second):
        entry = entries[obj["metadata"]["uid"]]
        assert (entry.namespace, entry.name, entry.boot_id) == (
            obj["metadata"]["namespace"], obj["metadata"]["name"], BOOT,
        )  # fmt: skip
        assert [d.device for d in entry.devices] == [
            obj["status"]["allocation"]["devices"]["results"][0]["device"]
        ]
    assert list(tmp_path.glob("checkpoint.json.corrupt-*"))
    # What was rebuilt is on disk: a restart loads the same entries.
    assert Checkpoint(tmp_path / "checkpoint.json").load() == entries
    # The rebuilt entries count as prepared in this boot: a repeated prepare reads nothing.
    reads = claims.reads
    assert not preparer.prepare([ref_of(first)])[first["metadata"]["uid"]].error
    assert claims.reads == reads


@pytest.mark.parametrize("reboot", [False, True])
def test_a_record_without_its_spec_in_this_boot_is_rebuilt_as_started(tmp_path: Path, reboot: bool) -> None:
    obj = claim("nospec", [result("gpu-0", memory="4Gi")])
    claims = FakeClaims(obj)
    before = make(tmp_path, claims)
    before.start()
    assert not before.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    corrupt(tmp_path)
    if reboot:  # the spec survived (a persistent CDI dir), the record is of an earlier boot
        path = tmp_path / "prepared" / f"{obj['metadata']['uid']}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "bootID": "boot-1"}))
    else:
        (tmp_path / "cdi" / before.names.spec_file_name(obj["metadata"]["uid"])).unlink()
    preparer = make(tmp_path, claims)
    preparer.start()
    assert preparer.prepared()[obj["metadata"]["uid"]].state == PREPARE_STARTED  # prepared again on request
    reads = claims.reads
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    assert claims.reads == reads + 1
    assert (tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])).is_file()


def test_a_rebuild_keeps_a_claim_deleted_from_the_api_and_the_report_flags_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    running = claim("running", [result("gpu-0", memory="10Gi")], namespace="team-a")
    claims = FakeClaims(running)
    before = make(tmp_path, claims)
    before.start()
    assert not before.prepare([ref_of(running)])[running["metadata"]["uid"]].error
    claims.delete(running)
    corrupt(tmp_path)
    preparer = make(tmp_path, claims)
    preparer.start()
    uid = running["metadata"]["uid"]
    assert preparer.prepared()[uid].state == PREPARE_COMPLETED
    with caplog.at_level(logging.WARNING, logger=prepare_module.__name__):
        assert preparer.report_deleted() == [uid]
    assert f"claim team-a/running ({uid}) no longer exists in the API but is still prepared" in caplog.text
    assert uid in preparer.prepared()
    rival = claim("rival", [result("gpu-0", memory="10Gi")])
    claims.by_uid[rival["metadata"]["uid"]] = rival
    assert "memory overcommitted" in preparer.prepare([ref_of(rival)])[rival["metadata"]["uid"]].error


def test_a_spec_without_a_record_and_an_unreadable_record_are_named_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer = make(tmp_path, FakeClaims())
    orphan = str(uuid.uuid4())
    (tmp_path / "cdi" / preparer.names.spec_file_name(orphan)).write_text("{}")
    (tmp_path / "cdi" / "nvidia.yaml").write_text("")  # not ours: ignored
    broken = str(uuid.uuid4())
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / f"{broken}.json").write_text('{"uid": "' + broken + '", "state"')
    corrupt(tmp_path)
    preparer.start()
    assert preparer.prepared() == {}
    assert f"CDI spec of claim {orphan} has no claim record" in caplog.text
    assert f"claim record {tmp_path / 'prepared' / broken}.json is unreadable" in caplog.text


def test_a_record_must_name_the_claim_of_its_file(tmp_path: Path) -> None:
    obj = claim("named", [result("gpu-0")])
    records = ClaimRecords(tmp_path / "prepared")
    records.write(obj["metadata"]["uid"], entry_for(obj))
    other = tmp_path / "prepared" / f"{uuid.uuid4()}.json"
    other.write_bytes((tmp_path / "prepared" / f"{obj['metadata']['uid']}.json").read_bytes())
    assert set(records.load_all()) == {obj["metadata"]["uid"]}
    with pytest.raises(ValueError, match="not a Kubernetes UID"):
        records.write("../x", entry_for(obj))


def test_entries_without_a_record_get_one_at_start_up(tmp_path: Path) -> None:
    obj = claim("old", [result("gpu-0")])
    uid = obj["metadata"]["uid"]
    Checkpoint(tmp_path / "checkpoint.json").save({uid: entry_for(obj), "..not-a-uid": entry_for(obj)})
    make(tmp_path, FakeClaims(obj)).start()  # written by a version without records
    assert ClaimRecords(tmp_path / "prepared").load_all() == {uid: entry_for(obj)}
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == [f"{uid}.json"]


# --- claims deleted from the API while prepared ---------------------------------------------------


def test_the_report_keeps_deleted_claims_and_skips_entries_it_cannot_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = claim("kept", [result("gpu-0", memory="1Gi")])
    gone = claim("gone", [result("gpu-1", memory="1Gi")])
    unknown = claim("unknown", [result("gpu-1", memory="1Gi")])
    claims = FakeClaims(kept, unknown)
    claims.unreadable.add(unknown["metadata"]["uid"])
    entries = {
        "..not-a-uid": entry_for(kept),  # a hand-edited checkpoint: never used as a path
        unknown["metadata"]["uid"]: entry_for(unknown),
        gone["metadata"]["uid"]: entry_for(gone),
        kept["metadata"]["uid"]: entry_for(kept),
    }
    Checkpoint(tmp_path / "checkpoint.json").save(entries)
    metrics = PluginMetrics()
    preparer = make(tmp_path, claims, metrics=metrics)
    preparer.start()
    spec = tmp_path / "cdi" / preparer.names.spec_file_name(gone["metadata"]["uid"])
    spec.write_text("{}")
    with caplog.at_level(logging.WARNING, logger=prepare_module.__name__):
        assert preparer.report_deleted() == [gone["metadata"]["uid"]]
        assert preparer.report_deleted() == [gone["metadata"]["uid"]]
    assert spec.exists()
    assert set(preparer.prepared()) == set(entries)  # nothing removed
    assert set(Checkpoint(tmp_path / "checkpoint.json").load()) == set(entries)
    assert caplog.text.count("no longer exists in the API") == 1  # once per claim
    assert claims.checks.count(gone["metadata"]["uid"]) == 1  # a deleted UID never comes back
    assert claims.checks.count(unknown["metadata"]["uid"]) == 2  # unreadable: asked again next time
    assert "'..not-a-uid' (default/kept) is not a Kubernetes UID" in caplog.text
    assert metrics.registry.get_sample_value("hami_dra_kubelet_plugin_deleted_claims_prepared") == 1


def test_a_claim_deleted_while_its_pod_runs_keeps_its_share_until_kubelet_unprepares_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finalizer stripped, claim deleted, pod still running: 10Gi + 10Gi must not fit a 15Gi card."""
    running = claim("running", [result("gpu-0", memory="10Gi")], namespace="team-a")
    second = claim("second", [result("gpu-0", memory="10Gi")], namespace="team-b")
    claims = FakeClaims(running, second)
    metrics = PluginMetrics()
    preparer = make(tmp_path, claims, metrics=metrics)
    preparer.start()
    uid = running["metadata"]["uid"]
    assert not preparer.prepare([ref_of(running)])[uid].error
    claims.delete(running)
    caplog.set_level(logging.INFO, logger=prepare_module.__name__)
    assert preparer.report_deleted() == [uid]

    refused = preparer.prepare([ref_of(second)])[second["metadata"]["uid"]]
    assert refused.devices == []
    assert refused.error == (
        f"gpu-0 memory overcommitted: 10Gi prepared + 10Gi requested > 15Gi ({CAPACITY_HINT})"
    )
    assert f"prepared there: team-a/running ({uid}, deleted from the API)" in caplog.text
    assert set(preparer.prepared()) == {uid}
    assert (tmp_path / "cdi" / preparer.names.spec_file_name(uid)).is_file()
    assert metrics.registry.get_sample_value("hami_dra_kubelet_plugin_deleted_claims_prepared") == 1

    assert preparer.unprepare([ref_of(running)]) == {uid: ""}  # the pod ended: kubelet unprepares
    assert f"claim team-a/running ({uid}), deleted from the API earlier, is unprepared" in caplog.text
    assert preparer.prepared() == {}
    assert not ClaimRecords(tmp_path / "prepared").exists(uid)
    assert metrics.registry.get_sample_value("hami_dra_kubelet_plugin_deleted_claims_prepared") == 0
    assert not preparer.prepare([ref_of(second)])[second["metadata"]["uid"]].error


def test_entries_of_an_earlier_boot_still_count(tmp_path: Path) -> None:
    old = claim("old", [result("gpu-0", share=False)])
    Checkpoint(tmp_path / "checkpoint.json").save({old["metadata"]["uid"]: entry_for(old, boot="boot-1")})
    new = claim("new", [result("gpu-0", memory="1Gi")])
    preparer = make(tmp_path, FakeClaims(new))  # the old claim is gone from the API too
    preparer.start()
    answer = preparer.prepare([ref_of(new)])[new["metadata"]["uid"]]
    assert answer.error.startswith(
        f"gpu-0 is allocated exclusively to prepared claim {old['metadata']['uid']}"
    )


# --- prepare --------------------------------------------------------------------------------------


def test_the_simulated_spec_has_exactly_the_stand_in_device_nodes(tmp_path: Path) -> None:
    obj = claim("sim", [result("gpu-1")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    (answer,) = preparer.prepare([ref_of(obj)]).values()
    assert not answer.error
    spec = json.loads((tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])).read_text())
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/dev/null"},
        {"path": "/dev/nvidia-uvm", "hostPath": "/dev/null"},
    ]
    (device,) = spec["devices"]
    assert device["containerEdits"]["env"] == ["HAMI_DRA_GPU_1_UUID=GPU-00000001"]
    assert device["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/null"}]
    assert answer.devices[0].cdi_ids == [preparer.names.qualified(device["name"])]


def prepared_spec(preparer: Preparer, obj: dict[str, Any]) -> tuple[PrepareResult, dict[str, Any]]:
    (answer,) = preparer.prepare([ref_of(obj)]).values()
    path = preparer.config.cdi_dir / preparer.names.spec_file_name(obj["metadata"]["uid"])
    return answer, json.loads(path.read_text()) if path.exists() else {}


def test_a_real_node_without_composition_gets_device_nodes_only_and_our_ids(tmp_path: Path) -> None:
    obj = claim("real", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj), simulated=False)
    preparer.start()
    answer, spec = prepared_spec(preparer, obj)
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert answer.devices[0].cdi_ids == [preparer.names.qualified(spec["devices"][0]["name"])]


@pytest.mark.parametrize("layout", ["host", "index-only", "operator"])
def test_every_toolkit_layout_gives_the_gpu_its_node_and_common_edits(tmp_path: Path, layout: str) -> None:
    """Whatever names the toolkit's spec uses, the claim's spec gets the same edits, ours the only ID."""
    write_toolkit_spec(tmp_path / "registry", layout, ["GPU-00000000", "GPU-00000001"], [0, 1])
    toolkit = ToolkitRegistry(
        (tmp_path / "registry",), host=HostView(host_root_with_libraries(tmp_path / "host"))
    )
    obj = claim("real", [result("gpu-1", share=False)])
    preparer = make(tmp_path, FakeClaims(obj), simulated=False, toolkit=toolkit)
    preparer.start()
    answer, spec = prepared_spec(preparer, obj)
    assert not answer.error
    common = common_edits()
    if layout == "operator":  # the control nodes come from the "all" device there
        del common["deviceNodes"]
    assert spec["containerEdits"] == common
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": "/dev/nvidia1"} and {"path": "/dev/nvidia0"} not in nodes
    if layout == "operator":
        assert nodes[1:] == [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    assert answer.devices[0].cdi_ids == [preparer.names.qualified(spec["devices"][0]["name"])]
    validate_cdi(spec)


def test_a_gpu_the_toolkit_spec_lacks_or_a_stale_spec_is_refused_with_the_reason(tmp_path: Path) -> None:
    write_toolkit_spec(tmp_path / "registry", "host", ["GPU-00000000"], [0])
    host = host_root_with_libraries(tmp_path / "host")
    toolkit = ToolkitRegistry((tmp_path / "registry",), host=HostView(host))
    lacking = claim("lacking", [result("gpu-1")])
    preparer = make(tmp_path, FakeClaims(lacking), simulated=False, toolkit=toolkit)
    preparer.start()
    answer, spec = prepared_spec(preparer, lacking)
    assert spec == {} and "defines no device with /dev/nvidia1" in answer.error
    (host / LIB_DIR.lstrip("/") / f"libcuda.so.{DRIVER_VERSION}").unlink()  # the driver was upgraded
    (tmp_path / "registry" / "nvidia.yaml").touch()
    stale = claim("stale", [result("gpu-0")])
    preparer.claims = FakeClaims(stale)
    answer, spec = prepared_spec(preparer, stale)
    assert spec == {} and f"names {LIB_DIR}/libcuda.so.{DRIVER_VERSION}, which does not exist" in answer.error


def test_the_hami_core_directory_is_shared_by_every_uid(tmp_path: Path) -> None:
    obj = claim("shared", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj), library=True)
    preparer.start()
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    mode = (tmp_path / "hami" / "claims" / obj["metadata"]["uid"]).stat().st_mode
    assert stat.S_IMODE(mode) == 0o777


def test_a_device_missing_from_this_node_is_refused_naming_the_claim(tmp_path: Path) -> None:
    obj = claim("lost", [result("gpu-7")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    answer = preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]]
    assert answer.error == "ResourceClaim default/lost: device gpu-7 does not exist on this node"
    assert preparer.prepared() == {}


def test_a_prepared_device_that_disappeared_is_reported_on_the_repeat(tmp_path: Path) -> None:
    obj = claim("vanish", [result("gpu-1")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    (tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])).unlink()
    preparer.inventory = Inventory([gpu(0)])  # gpu-1 is gone (health, hot-unplug)
    answer = preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]]
    assert answer.error == "ResourceClaim default/vanish: device gpu-1 does not exist on this node"


@pytest.mark.parametrize("state, boot", [(PREPARE_STARTED, BOOT), (PREPARE_COMPLETED, "boot-1")])
def test_an_unfinished_or_earlier_boot_entry_is_prepared_again(tmp_path: Path, state: str, boot: str) -> None:
    obj = claim("again", [result("gpu-0")])
    Checkpoint(tmp_path / "checkpoint.json").save(
        {obj["metadata"]["uid"]: entry_for(obj, boot=boot, state=state)}
    )
    claims = FakeClaims(obj)
    preparer = make(tmp_path, claims)
    preparer.start()
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    assert claims.reads == 1  # read from the API, not answered from the stale entry
    entry = preparer.prepared()[obj["metadata"]["uid"]]
    assert (entry.state, entry.boot_id) == (PREPARE_COMPLETED, BOOT)


def test_a_full_card_is_refused_with_the_capacity_error(tmp_path: Path) -> None:
    big = claim("big", [result("gpu-0", memory="15Gi")])
    more = claim("more", [result("gpu-0", memory="1Gi")])
    preparer = make(tmp_path, FakeClaims(big, more))
    preparer.start()
    assert not preparer.prepare([ref_of(big)])[big["metadata"]["uid"]].error
    answer = preparer.prepare([ref_of(more)])[more["metadata"]["uid"]]
    assert "overcommitted" in answer.error and answer.devices == []


def test_a_state_write_failure_is_that_claims_error(tmp_path: Path) -> None:
    obj = claim("nowrite", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    (tmp_path / "cdi").rmdir()
    (tmp_path / "cdi").write_text("a file where the CDI directory should be")
    answer = preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]]
    assert answer.error.startswith("writing state for claim default/nowrite: ")
    assert preparer.prepared() == {}  # its room is given back: kubelet's retry takes it again


def test_claims_named_twice_are_answered_once_and_the_rest_still_handled(tmp_path: Path) -> None:
    a, b = claim("a", [result("gpu-0")]), claim("b", [result("gpu-1")])
    metrics = PluginMetrics()
    preparer = make(tmp_path, FakeClaims(a, b), metrics=metrics)
    preparer.start()
    bad = ClaimRef("default", "bad", "..")
    answers = preparer.prepare([ref_of(a), ref_of(a), bad, ref_of(b)])
    assert list(answers) == [a["metadata"]["uid"], "..", b["metadata"]["uid"]]
    assert not answers[b["metadata"]["uid"]].error and answers[".."].error.startswith(
        "invalid claim reference"
    )
    done = preparer.unprepare([ref_of(a), ref_of(a), bad, ref_of(b)])
    assert done == {a["metadata"]["uid"]: "", "..": done[".."], b["metadata"]["uid"]: ""}
    assert done[".."].startswith("invalid claim reference default/bad")
    registry = metrics.registry
    for operation in ("prepare", "unprepare"):
        labels = {"operation": operation}
        assert registry.get_sample_value("hami_dra_kubelet_plugin_requests_total", labels) == 3
        assert registry.get_sample_value("hami_dra_kubelet_plugin_errors_total", labels) == 1
    assert preparer.prepared() == {}


def test_an_unprepare_that_cannot_remove_the_spec_reports_it_and_keeps_the_entry(tmp_path: Path) -> None:
    obj = claim("stuck", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    spec = tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])
    spec.unlink()
    spec.mkdir()  # unlink fails with IsADirectoryError
    (spec / "x").write_text("")
    error = preparer.unprepare([ref_of(obj)])[obj["metadata"]["uid"]]
    assert error.startswith("removing state of claim default/stuck: ")
    assert obj["metadata"]["uid"] in preparer.prepared()  # retried by kubelet, never forgotten


def test_unpreparing_an_unknown_claim_writes_no_checkpoint(tmp_path: Path) -> None:
    preparer = make(tmp_path, FakeClaims())
    preparer.start()
    path = tmp_path / "checkpoint.json"
    before = path.stat().st_mtime_ns if path.exists() else None
    uid = str(uuid.uuid4())
    assert preparer.unprepare([ClaimRef("default", "x", uid)]) == {uid: ""}  # unknown claims succeed
    assert (path.stat().st_mtime_ns if path.exists() else None) == before


def test_the_allocation_gauges_follow_prepares(tmp_path: Path) -> None:
    metrics = PluginMetrics()
    a = claim("a", [result("gpu-0", memory="2Gi", cores=20)])
    b = claim("b", [result("gpu-0", memory="1Gi", cores=10)])
    preparer = make(tmp_path, FakeClaims(a, b), metrics=metrics)
    preparer.start()
    registry = metrics.registry

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("hami_dra_kubelet_plugin_prepared_devices") == 0
    preparer.prepare([ref_of(a), ref_of(b)])
    for _ in range(2):  # the second scrape is served from the cache
        assert sample("hami_dra_kubelet_plugin_prepared_devices") == 2
        assert sample("hami_dra_kubelet_plugin_prepared_memory_bytes", node="", device="gpu-0") == 3 * 1024**3
        assert sample("hami_dra_kubelet_plugin_prepared_cores", node="", device="gpu-0") == 30
        assert sample("hami_dra_kubelet_plugin_prepared_memory_bytes", node="", device="gpu-1") == 0
    preparer.unprepare([ref_of(a)])
    assert sample("hami_dra_kubelet_plugin_prepared_devices") == 1
    assert sample("hami_dra_kubelet_plugin_prepared_cores", node="", device="gpu-0") == 10


def test_the_crash_hook_kills_this_process_with_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, int]] = []
    monkeypatch.setattr(failpoint.os, "kill", lambda pid, sig: calls.append(("kill", pid, sig)))
    monkeypatch.setattr(failpoint.os, "_exit", lambda status: calls.append(("exit", status, 0)))
    monkeypatch.setenv(prepare_module.FAILPOINT_ENV, "after-side-effects")
    failpoint.hit("after-admission")
    assert calls == []
    failpoint.hit("after-side-effects")
    # SIGKILL, and the same abrupt end where the kernel drops it (PID 1 of the chart's container).
    assert calls == [("kill", os.getpid(), signal.SIGKILL), ("exit", 128 + signal.SIGKILL, 0)]


#: What is on the node at each crash point of a call: (checkpoint state, record, CDI spec) per claim.
ON_DISK_AT = {
    "after-admission": (None, False, False),  # admitted in memory only
    "after-side-effects": (None, True, True),  # files written, no entry: never answered, holds no share
    "after-checkpoint": (PREPARE_COMPLETED, True, True),  # durable before kubelet hears of it
}


@pytest.mark.parametrize("point", prepare_module.FAILPOINTS)
def test_each_crash_point_of_a_call_sees_the_files_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    objs = [claim("one", [result("gpu-0")]), claim("two", [result("gpu-1", share=False)])]
    preparer = make(tmp_path, FakeClaims(*objs))
    preparer.start()
    seen: list[list[tuple[str | None, bool, bool]]] = []

    def kill() -> None:
        entries = Checkpoint(tmp_path / "checkpoint.json").load()
        seen.append([
            (
                entries[uid].state if uid in entries else None,
                ClaimRecords(tmp_path / "prepared").exists(uid),
                (tmp_path / "cdi" / preparer.names.spec_file_name(uid)).exists(),
            )
            for uid in (o["metadata"]["uid"] for o in objs)
        ])  # fmt: skip

    monkeypatch.setattr(failpoint, "kill_self", kill)
    monkeypatch.setenv(prepare_module.FAILPOINT_ENV, point)
    answers = preparer.prepare([ref_of(o) for o in objs])
    assert not any(a.error for a in answers.values())
    assert seen == [[ON_DISK_AT[point]] * 2]  # one crash point per call, whatever its claims


def counting_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every os.fsync of the process from now on (the checkpoint's file and directory, any other)."""
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_a_call_makes_one_checkpoint_write_whatever_its_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = [claim(f"c{i}", [result(f"gpu-{i % 2}", memory="1Gi")]) for i in range(3)]
    preparer = make(tmp_path, FakeClaims(*objs))
    preparer.start()
    fsyncs = counting_fsyncs(monkeypatch)
    saves: list[int] = []
    real_save = Checkpoint.save

    def save(self: Checkpoint, entries: dict[str, ClaimEntry], **kwargs: bool) -> None:
        saves.append(len(entries))
        real_save(self, entries, **kwargs)

    monkeypatch.setattr(Checkpoint, "save", save)
    assert not any(a.error for a in preparer.prepare([ref_of(o) for o in objs]).values())
    assert (saves, len(fsyncs)) == ([3], 1)  # the file; its rename needs no fsync (see _persist)
    assert {e.state for e in Checkpoint(tmp_path / "checkpoint.json").load().values()} == {PREPARE_COMPLETED}
    assert not any(a.error for a in preparer.prepare([ref_of(o) for o in objs]).values())
    assert (saves, len(fsyncs)) == ([3], 1)  # a repeat is answered from memory: no write
    assert preparer.unprepare([ref_of(o) for o in objs]) == {o["metadata"]["uid"]: "" for o in objs}
    assert (saves, len(fsyncs)) == ([3, 0], 3)  # a removal: the file and its directory
    assert Checkpoint(tmp_path / "checkpoint.json").load() == {}


def test_a_removal_another_callers_write_took_along_only_needs_the_directory_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = claim("gone", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    calls: list[str] = []
    real_save, real_sync = Checkpoint.save, Checkpoint.sync_directory

    def save(self: Checkpoint, entries: dict[str, ClaimEntry], *, sync_directory: bool = True) -> None:
        calls.append(f"save sync_directory={sync_directory}")
        real_save(self, entries, sync_directory=sync_directory)

    def sync(self: Checkpoint) -> None:
        calls.append("sync_directory")
        real_sync(self)

    monkeypatch.setattr(Checkpoint, "save", save)
    monkeypatch.setattr(Checkpoint, "sync_directory", sync)
    with preparer._lock:  # an unprepare removes the entry; a prepare's write runs first
        preparer._entries.pop(obj["metadata"]["uid"])
        version = preparer._changed()
    preparer._persist(version, removal=False)
    preparer._persist(version, removal=True)
    preparer._persist(version, removal=True)  # durable already: nothing more
    assert calls == ["save sync_directory=False", "sync_directory"]
    assert Checkpoint(tmp_path / "checkpoint.json").load() == {}


def test_a_failed_checkpoint_write_fails_the_calls_claims_and_a_retry_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = [claim("a", [result("gpu-0", share=False)]), claim("b", [result("gpu-1")])]
    claims = FakeClaims(*objs)
    preparer = make(tmp_path, claims)
    preparer.start()
    real_save = Checkpoint.save
    failing = [True]

    def save(self: Checkpoint, entries: dict[str, ClaimEntry], **kwargs: bool) -> None:
        if failing[0]:
            raise OSError(28, "No space left on device")
        real_save(self, entries, **kwargs)

    monkeypatch.setattr(Checkpoint, "save", save)
    answers = preparer.prepare([ref_of(o) for o in objs])
    assert [a.error for a in answers.values()] == [
        "writing state for claim default/a: [Errno 28] No space left on device",
        "writing state for claim default/b: [Errno 28] No space left on device",
    ]
    # Not durable, so not prepared: the room stays taken (their specs are on the node) until a
    # retry prepares them again, which reads the API, rewrites the files and the checkpoint.
    assert {e.state for e in preparer.prepared().values()} == {PREPARE_STARTED}
    rival = claim("rival", [result("gpu-0", memory="1Gi")])
    claims.by_uid[rival["metadata"]["uid"]] = rival
    failing[0] = False
    assert "allocated exclusively" in preparer.prepare([ref_of(rival)])[rival["metadata"]["uid"]].error
    reads = claims.reads
    assert not any(a.error for a in preparer.prepare([ref_of(o) for o in objs]).values())
    assert claims.reads == reads + 2
    durable = Checkpoint(tmp_path / "checkpoint.json").load()
    assert {uid: e.state for uid, e in durable.items()} == {
        o["metadata"]["uid"]: PREPARE_COMPLETED for o in objs
    }


def test_a_failed_checkpoint_write_on_unprepare_keeps_the_entries_for_kubelets_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = claim("keep", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    uid = obj["metadata"]["uid"]
    assert not preparer.prepare([ref_of(obj)])[uid].error
    real_save = Checkpoint.save
    monkeypatch.setattr(Checkpoint, "save", lambda *_, **__: (_ for _ in ()).throw(OSError(5, "I/O error")))
    assert preparer.unprepare([ref_of(obj)]) == {
        uid: "removing state of claim default/keep: [Errno 5] I/O error"
    }
    assert set(preparer.prepared()) == {uid}  # the durable checkpoint still has it: so does memory
    monkeypatch.setattr(Checkpoint, "save", real_save)
    assert preparer.unprepare([ref_of(obj)]) == {uid: ""}
    assert preparer.prepared() == {} and Checkpoint(tmp_path / "checkpoint.json").load() == {}


def test_a_claim_whose_files_cannot_be_written_gives_back_its_room_and_not_its_neighbours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = claim("old", [result("gpu-0", share=False)])
    Checkpoint(tmp_path / "checkpoint.json").save({old["metadata"]["uid"]: entry_for(old, boot="boot-1")})
    fine = claim("fine", [result("gpu-1")])
    preparer = make(tmp_path, FakeClaims(old, fine))
    preparer.start()
    real_write = ClaimRecords.write

    def write(self: ClaimRecords, uid: str, entry: ClaimEntry) -> None:
        if uid == old["metadata"]["uid"]:
            raise OSError(30, "Read-only file system")
        real_write(self, uid, entry)

    monkeypatch.setattr(ClaimRecords, "write", write)
    answers = preparer.prepare([ref_of(old), ref_of(fine)])
    assert answers[old["metadata"]["uid"]].error.startswith("writing state for claim default/old: ")
    assert not answers[fine["metadata"]["uid"]].error
    # the earlier boot's entry is back as it was (it keeps its share), the neighbour is prepared
    assert preparer.prepared()[old["metadata"]["uid"]] == entry_for(old, boot="boot-1")
    durable = Checkpoint(tmp_path / "checkpoint.json").load()
    assert durable[old["metadata"]["uid"]].boot_id == "boot-1"
    assert durable[fine["metadata"]["uid"]].state == PREPARE_COMPLETED


def test_calls_naming_the_same_claims_in_opposite_orders_never_deadlock(tmp_path: Path) -> None:
    objs = [claim(f"c{i}", [result(f"gpu-{i % 2}", memory="1Gi")]) for i in range(6)]
    preparer = make(tmp_path, FakeClaims(*objs))
    preparer.start()
    refs = [ref_of(o) for o in objs]
    failures: list[str] = []

    def work(order: list[ClaimRef]) -> None:
        for _ in range(20):
            failures.extend(a.error for a in preparer.prepare(order).values() if a.error)
            failures.extend(e for e in preparer.unprepare(order[:2]).values() if e)

    threads = [threading.Thread(target=work, args=(o,)) for o in (refs, refs[::-1], refs[2:] + refs[:2])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a call waits on another's claim locks forever"
    assert failures == []
    assert preparer.prepared().keys() <= {r.uid for r in refs}
    assert Checkpoint(tmp_path / "checkpoint.json").load() == preparer.prepared()
