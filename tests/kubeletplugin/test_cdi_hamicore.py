"""CDI spec content and HAMi-core env rules (hami-core-enforcement.md section 0)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dra_driver.kubeletplugin import cdi
from dra_driver.kubeletplugin.claims import AllocatedDevice, ClaimError
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig, claim_edits, memory_limit
from tests.kubeletplugin.helpers import GIB, gpu, validate_cdi

MIB = 1024 * 1024
UID = "0c5e7a52-1f3b-4c9e-9a57-2b8e5f1d3a11"


def share(device: str, memory: int, cores: int = 0) -> AllocatedDevice:
    return AllocatedDevice("gpu", "node-1", device, str(uuid.uuid4()), {"memory": memory, "cores": cores})


def whole(device: str) -> AllocatedDevice:
    return AllocatedDevice("gpu", "node-1", device)


def env_of(edits: dict[str, object]) -> dict[str, str]:
    return dict(str(e).split("=", 1) for e in edits.get("env", []))  # type: ignore[attr-defined]


def test_memory_limit_uses_m_suffix_without_padding() -> None:
    assert memory_limit(8000 * MIB) == "8000m"
    assert memory_limit(8000 * MIB + 5) == "8000m"
    assert memory_limit(512 * 1024) == "1m"
    assert not memory_limit(80 * MIB).startswith("0")


def test_ordinals_follow_pci_bus_order_not_host_index(tmp_path: Path) -> None:
    # host gpu-3 sits on a lower PCI bus than gpu-1: it is CUDA ordinal 0 in the container
    g1, g3 = gpu(1, "0000:b1:00.0"), gpu(3, "0000:3b:00.0")
    edits = claim_edits(
        UID,
        [(share("gpu-1", 4000 * MIB, 50), g1), (share("gpu-3", 8000 * MIB, 30), g3)],
        HamiCoreConfig(tmp_path),
    )
    env = env_of(edits)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m" and env["CUDA_DEVICE_SM_LIMIT_0"] == "30"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4000m" and env["CUDA_DEVICE_SM_LIMIT_1"] == "50"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"/usr/local/vgpu/claims/{UID}/cudevshr.cache"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert not any(k.endswith("Mi") or v.endswith("Mi") for k, v in env.items())


def test_sm_limit_only_between_0_and_100(tmp_path: Path) -> None:
    for cores, expected in ((0, None), (100, None), (1, "1"), (99, "99")):
        env = env_of(claim_edits(UID, [(share("gpu-0", GIB, cores), gpu(0))], HamiCoreConfig(tmp_path)))
        assert env.get("CUDA_DEVICE_SM_LIMIT_0") == expected, cores


def test_whole_gpu_claim_gets_no_hami_edits(tmp_path: Path) -> None:
    assert (
        claim_edits(
            UID,
            [(whole("gpu-0"), gpu(0)), (whole("gpu-1"), gpu(1))],
            HamiCoreConfig(tmp_path, Path("/lib/libvgpu.so")),
        )
        == {}
    )


def test_mixed_claim_gives_whole_gpu_its_full_memory(tmp_path: Path) -> None:
    env = env_of(
        claim_edits(UID, [(whole("gpu-0"), gpu(0)), (share("gpu-1", GIB), gpu(1))], HamiCoreConfig(tmp_path))
    )
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{15 * 1024}m"
    assert "CUDA_DEVICE_SM_LIMIT_0" not in env
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "1024m"


def test_library_and_preload_mounts_only_with_hami_core_lib(tmp_path: Path) -> None:
    devices = [(share("gpu-0", GIB, 20), gpu(0))]
    without = claim_edits(UID, devices, HamiCoreConfig(tmp_path))
    assert [m["containerPath"] for m in without["mounts"]] == [f"/usr/local/vgpu/claims/{UID}"]
    config = HamiCoreConfig(tmp_path, Path("/opt/hami/libvgpu.so"), lock_dir=tmp_path / "vgpulock")
    config.ensure_preload_file()
    assert config.preload_file.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert oct((tmp_path / "vgpulock").stat().st_mode & 0o777) == "0o777"  # any container UID locks
    mounts = {m["containerPath"]: m for m in claim_edits(UID, devices, config)["mounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["hostPath"] == "/opt/hami/libvgpu.so"
    assert mounts["/etc/ld.so.preload"]["hostPath"] == str(config.preload_file)
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert mounts["/tmp/vgpulock"]["hostPath"] == str(tmp_path / "vgpulock")  # libvgpu <= v2.8.0's lock


def test_a_result_consuming_the_whole_card_is_whole_although_it_has_a_share_id(tmp_path: Path) -> None:
    """Every result of ours carries a shareID; one that takes all memory and cores is a whole card."""
    full = AllocatedDevice("gpu", "node-1", "gpu-0", str(uuid.uuid4()), {"memory": 15 * GIB, "cores": 100})
    assert claim_edits(UID, [(full, gpu(0))], HamiCoreConfig(tmp_path, Path("/lib/libvgpu.so"))) == {}


@pytest.mark.parametrize(("policy", "value"), [("default", None), ("force", "FORCE"), ("disable", "DISABLE")])
def test_the_core_utilization_policy_is_set_only_with_a_cores_limit(
    tmp_path: Path, policy: str, value: str | None
) -> None:
    config = HamiCoreConfig(tmp_path, utilization_policy=policy)
    limited = env_of(claim_edits(UID, [(share("gpu-0", GIB, 30), gpu(0))], config))
    assert limited.get("GPU_CORE_UTILIZATION_POLICY") == value
    assert "GPU_CORE_UTILIZATION_POLICY" not in env_of(
        claim_edits(UID, [(share("gpu-0", GIB), gpu(0))], config)
    )
    with pytest.raises(ValueError, match="core utilization policy must be one of"):
        HamiCoreConfig(tmp_path, utilization_policy="sometimes")


def test_minimum_cdi_version() -> None:
    kind = "k8s.gpu.hami.io/gpu"
    assert (
        cdi.minimum_version({"kind": kind, "devices": [{"name": "gpu0", "containerEdits": {"env": ["A=1"]}}]})
        == "0.3.0"
    )
    assert (
        cdi.minimum_version({"kind": kind, "devices": [{"name": "0abc", "containerEdits": {"env": ["A=1"]}}]})
        == "0.5.0"
    )
    node = {"path": "/dev/nvidia0", "hostPath": "/dev/null"}
    assert (
        cdi.minimum_version(
            {"kind": kind, "devices": [{"name": "a", "containerEdits": {"deviceNodes": [node]}}]}
        )
        == "0.5.0"
    )
    assert (
        cdi.minimum_version(
            {"kind": "v.com/a.b", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
        )
        == "0.6.0"
    )
    assert cdi.minimum_version({"kind": kind, "annotations": {"a": "b"}, "devices": []}) == "0.6.0"
    mount = {"hostPath": "/a", "containerPath": "/a", "type": "bind"}
    assert (
        cdi.minimum_version({"kind": kind, "devices": [{"name": "a", "containerEdits": {"mounts": [mount]}}]})
        == "0.4.0"
    )


def test_names_and_atomic_write(tmp_path: Path) -> None:
    names = cdi.CdiNames("gpu.hami.io")
    assert names.kind == "k8s.gpu.hami.io/gpu"
    assert names.spec_file_name("abc") == "k8s.gpu.hami.io-gpu_abc.json"
    assert names.qualified(names.device_name("abc", "gpu-0", "s1")) == "k8s.gpu.hami.io/gpu=abc-gpu-0-s1"
    spec = cdi.make_spec(names.kind, [{"name": "abc-gpu-0", "containerEdits": {"env": ["A=1"]}}], {"env": []})
    assert "containerEdits" not in spec and spec["cdiVersion"] == "0.3.0"
    validate_cdi(spec)
    path = tmp_path / "cdi" / names.spec_file_name("abc")
    cdi.write_spec(path, spec)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left behind
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert cdi.remove_spec(path) and not cdi.remove_spec(path)


def test_a_temp_name_that_is_taken_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A temp file of the same name (a crashed process's, or one of another PID namespace's
    process with our PID) is neither opened nor removed: the write takes the next name."""
    import itertools
    import os

    monkeypatch.setattr(cdi, "_TEMP_NUMBERS", itertools.count(7))
    path = tmp_path / "spec.json"
    taken = tmp_path / f".spec.json.{os.getpid()}-7.tmp"
    taken.write_text("someone else's")
    cdi.replace_file(path, b"ours")
    assert path.read_bytes() == b"ours" and taken.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [taken.name, "spec.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    path = tmp_path / "spec.json"
    cdi.replace_file(path, b"old")

    def full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        cdi.replace_file(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_written_specs_match_the_upstream_cdi_schema(tmp_path: Path) -> None:
    """The one check that needs ../shared: our specs against the CDI project's own JSON schema."""
    from tests.kubeletplugin.helpers import validate_cdi_schema
    from tests.kubeletplugin.upstream import CDI_SCHEMA_DIR

    if not (CDI_SCHEMA_DIR / "schema.json").is_file():
        pytest.skip(f"the upstream CDI schema is not at {CDI_SCHEMA_DIR} (../shared is absent)")
    devices = [(share("gpu-0", GIB, 20), gpu(0)), (share("gpu-1", 2 * GIB, 0), gpu(1))]
    edits = claim_edits(UID, devices, HamiCoreConfig(tmp_path, Path("/opt/hami/libvgpu.so")))
    spec = cdi.make_spec(
        "k8s.gpu.hami.io/gpu", [{"name": f"{UID}-gpu-0", "containerEdits": {"env": ["A=1"]}}], edits
    )
    validate_cdi_schema(spec)


def test_a_share_without_memory_is_limited_as_counted_so_it_is_refused(tmp_path: Path) -> None:
    """The node's check and the controller count a share that lists no memory as taking none;
    HAMi-core would have to give it nothing, so prepare refuses it with the reason (it used to
    get the whole card's memory as its limit while every other tenant counted it as 0)."""
    no_memory = AllocatedDevice("gpu", "node-1", "gpu-0", str(uuid.uuid4()), {"cores": 30})
    with pytest.raises(ClaimError, match=r"share of gpu-0 takes no memory .*capacity\.requests\.memory"):
        claim_edits(UID, [(no_memory, gpu(0))], HamiCoreConfig(tmp_path))
    # Beside a share that does list memory on another card, still refused (naming only the empty one).
    with pytest.raises(ClaimError, match=r"share of gpu-0 takes") as refused:
        claim_edits(UID, [(no_memory, gpu(0)), (share("gpu-1", GIB, 10), gpu(1))], HamiCoreConfig(tmp_path))
    assert "gpu-1" not in str(refused.value)
    # The limits are the counted amounts: memory and cores as consumedCapacity lists them.
    counted = claim_edits(UID, [(share("gpu-0", 3 * GIB, 30), gpu(0))], HamiCoreConfig(tmp_path))
    assert env_of(counted)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3072m"
