"""The Preparer on its own: an in-memory claim source, a real checkpoint and CDI directory.

These pin down behaviour a mutation run (``make mutation``) found unchecked: which checkpoint
entries a rebuild keeps and what they say, which stale entries a cleanup removes when others
cannot be checked, one answer per claim named twice, the per-operation metrics, the exact
simulated CDI edits, the error each failure path returns, and the crash hook itself.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin import prepare as prepare_module
from dra_driver.kubeletplugin.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, Checkpoint, ClaimEntry
from dra_driver.kubeletplugin.claims import ClaimError, ClaimNotFound, ClaimRef, devices_for_node
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.inventory import Inventory
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.prepare import Preparer, PreparerConfig
from tests.kubeletplugin.helpers import DRIVER, claim, gpu, result

POOL = "node-1"
BOOT = "boot-2"


class FakeClaims:
    """The API as the Preparer sees it; ``unreadable`` names claims whose lookups fail."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.by_uid = {c["metadata"]["uid"]: c for c in claims}
        self.unreadable: set[str] = set()
        self.list_fails = False
        self.reads = 0

    def get(self, ref: ClaimRef) -> dict[str, Any]:
        self.reads += 1
        if ref.uid not in self.by_uid:
            raise ClaimNotFound(f"ResourceClaim {ref} not found")
        return self.by_uid[ref.uid]

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        if uid in self.unreadable:
            raise ClaimError(f"cannot read {namespace}/{name}")
        return uid in self.by_uid

    def list_all(self) -> list[dict[str, Any]]:
        if self.list_fails:
            raise ClaimError("the API is down")
        return list(self.by_uid.values())


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
    return Preparer(config, inventory, claims, Checkpoint(tmp_path / "checkpoint.json"), metrics)


def entry_for(obj: dict[str, Any], *, boot: str = BOOT, state: str = PREPARE_COMPLETED) -> ClaimEntry:
    devices = devices_for_node(obj, ref_of(obj), DRIVER, POOL)
    return ClaimEntry(obj["metadata"]["namespace"], obj["metadata"]["name"], state, boot, devices, [["x"]])


# --- rebuilding a corrupt checkpoint from the API ------------------------------------------------


def test_a_rebuild_keeps_every_reserved_claim_of_ours_and_records_it_fully(tmp_path: Path) -> None:
    unreserved = claim("idle", [result("gpu-0")])
    elsewhere = reserved(claim("elsewhere", [result("gpu-9")]))  # a device this node lacks
    first = reserved(claim("first", [result("gpu-0")], namespace="team-a"))
    second = reserved(claim("second", [result("gpu-1")], namespace="team-b"))
    claims = FakeClaims(unreserved, elsewhere, first, second)
    (tmp_path / "checkpoint.json").write_text("{not json")
    preparer = make(tmp_path, claims, library=True)
    preparer.start()
    entries = preparer.prepared()
    assert set(entries) == {first["metadata"]["uid"], second["metadata"]["uid"]}
    for obj in (first, second):
        entry = entries[obj["metadata"]["uid"]]
        assert (entry.namespace, entry.name) == (obj["metadata"]["namespace"], obj["metadata"]["name"])
        assert (entry.state, entry.boot_id) == (PREPARE_COMPLETED, BOOT)
        assert [d.device for d in entry.devices] == [
            obj["status"]["allocation"]["devices"]["results"][0]["device"]
        ]
        spec = tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])
        assert spec.is_file()
        assert (tmp_path / "hami" / "claims" / obj["metadata"]["uid"]).is_dir()  # HAMi-core cache
    # What was rebuilt is on disk: a restart loads the same entries without the API.
    assert set(Checkpoint(tmp_path / "checkpoint.json").load()) == set(entries)
    # The rebuilt entries count as prepared in this boot: a repeated prepare reads nothing.
    reads = claims.reads
    assert not preparer.prepare([ref_of(first)])[first["metadata"]["uid"]].error
    assert claims.reads == reads


def test_a_rebuild_without_the_api_starts_empty(tmp_path: Path) -> None:
    claims = FakeClaims(reserved(claim("c", [result("gpu-0")])))
    claims.list_fails = True
    (tmp_path / "checkpoint.json").write_text("garbage")
    preparer = make(tmp_path, claims)
    preparer.start()
    assert preparer.prepared() == {}
    assert Checkpoint(tmp_path / "checkpoint.json").load() == {}
    assert list(tmp_path.glob("checkpoint.json.corrupt*")) or list(tmp_path.glob("*corrupt*"))


# --- start-up cleanup of claims deleted while the plugin was down --------------------------------


def test_cleanup_removes_deleted_claims_past_entries_it_cannot_check(tmp_path: Path) -> None:
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
    preparer = make(tmp_path, claims)
    preparer.start()
    spec = tmp_path / "cdi" / preparer.names.spec_file_name(gone["metadata"]["uid"])
    spec.write_text("{}")
    assert preparer.cleanup_deleted() == [gone["metadata"]["uid"]]
    assert not spec.exists()
    assert set(preparer.prepared()) == {"..not-a-uid", unknown["metadata"]["uid"], kept["metadata"]["uid"]}
    assert gone["metadata"]["uid"] not in Checkpoint(tmp_path / "checkpoint.json").load()


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


def test_a_real_node_names_the_nvidia_toolkit_device_too(tmp_path: Path) -> None:
    obj = claim("real", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj), simulated=False)
    preparer.start()
    (answer,) = preparer.prepare([ref_of(obj)]).values()
    spec = json.loads((tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])).read_text())
    assert "deviceNodes" not in spec.get("containerEdits", {})
    assert "deviceNodes" not in spec["devices"][0]["containerEdits"]
    assert answer.devices[0].cdi_ids[1] == "nvidia.com/gpu=GPU-00000000"


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
        assert sample("hami_dra_gpu_allocated_memory_bytes", device="gpu-0") == 3 * 1024**3
        assert sample("hami_dra_gpu_allocated_cores", device="gpu-0") == 30
        assert sample("hami_dra_gpu_allocated_memory_bytes", device="gpu-1") == 0
    preparer.unprepare([ref_of(a)])
    assert sample("hami_dra_kubelet_plugin_prepared_devices") == 1
    assert sample("hami_dra_gpu_allocated_cores", device="gpu-0") == 10


def test_the_crash_hook_kills_this_process_with_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(prepare_module.os, "kill", lambda pid, sig: calls.append((pid, sig)))
    monkeypatch.setenv(prepare_module.FAILPOINT_ENV, "after-prepare-started")
    prepare_module._failpoint("before-something-else")
    assert calls == []
    prepare_module._failpoint("after-prepare-started")
    assert calls == [(os.getpid(), signal.SIGKILL)]


def test_the_crash_point_sits_between_the_durable_started_entry_and_the_side_effects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = claim("crash", [result("gpu-0")])
    preparer = make(tmp_path, FakeClaims(obj))
    preparer.start()
    seen: list[tuple[str, bool]] = []

    def kill(pid: int, sig: int) -> None:
        entry = Checkpoint(tmp_path / "checkpoint.json").load()[obj["metadata"]["uid"]]
        spec = tmp_path / "cdi" / preparer.names.spec_file_name(obj["metadata"]["uid"])
        seen.append((entry.state, spec.exists()))

    monkeypatch.setattr(prepare_module.os, "kill", kill)
    monkeypatch.setenv(prepare_module.FAILPOINT_ENV, "after-prepare-started")
    assert not preparer.prepare([ref_of(obj)])[obj["metadata"]["uid"]].error
    assert seen == [(PREPARE_STARTED, False)]
