"""The NVIDIA Container Toolkit's real CDI specs for our mock GPU nodes, and a real runtime using one.

Issue 24: the kubelet plugin has to compose with whatever spec NVIDIA's toolkit left on the node.
These tests pin down what those specs are (kinds, device names, per-device and common edits) by
running the real ``nvidia-ctk cdi generate`` (hack/cluster/build.sh, ``make cluster-build``)
against the mock NVML library and a mock driver root (tests/nvidia_layouts.py), for each layout,
on a T4 box whose device nodes are as most real nodes have them (nvidia-drm loaded: DRM nodes
0660 in groups video and render; nvidia-uvm not loaded when the spec is generated) and a
MIG-capable H100 box (MIG off) whose driver is hardened (``/dev/nvidia*`` 0660, group video);
then the kubelet plugin composes each claim's spec from them, which the real CDI library
(``nvidia-ctk cdi list``) must accept, and podman applies the host layout's spec to a container,
hooks included. Skips where the toolkit is not built; the mock driver root needs gcc (a failure,
as in tests/devices/conftest.py) and root (device nodes).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.kubeletplugin.control_nodes import HostView
from dra_driver.kubeletplugin.toolkit import ToolkitRegistry
from tests.kubeletplugin.helpers import claim, result
from tests.kubeletplugin.test_preparer_units import FakeClaims, make, prepared_spec
from tests.nvidia_layouts import (
    DRM_MAJOR,
    HARDENED,
    KINDS,
    LIB_DIR,
    NVIDIA_MAJOR,
    NVIDIA_UVM_MAJOR,
    NVIDIACTL_MINOR,
    PROFILES,
    RENDER_GID,
    RENDER_MINOR_BASE,
    SPEC_FILES,
    VIDEO_GID,
    DeviceFiles,
    DriverRoot,
    Layout,
    cdi_list,
    generate_spec,
    mock_driver_root,
    require_toolkit,
)
from tests.podman import CDI_DIR, Podman, busybox_podman

SPEC_LAYOUTS: tuple[Layout, ...] = ("host", "operator", "index-only")
CONTAINER_LIB_DIR = "/" + str(LIB_DIR)


@pytest.fixture(scope="module")
def toolkit() -> Path:
    return require_toolkit()


NODES = {"t4-4x-node-1": DeviceFiles(), "h100-8x-node-1": HARDENED}


@pytest.fixture(scope="module", params=sorted(NODES))
def driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DriverRoot:
    """A mock driver root per profile, placed where the GPU Operator keeps its driver."""
    base = tmp_path_factory.mktemp(request.param)
    root = base / "run" / "nvidia" / "driver"
    return mock_driver_root(root, PROFILES / f"{request.param}.json", NODES[request.param])


def nvidia_gids(driver: DriverRoot) -> list[int]:
    """The group toolkit >= 1.19 asks for to open /dev/nvidia* (none when they are world-rw)."""
    files = driver.files
    return [files.nvidia_gid] if files.nvidia_gid and files.nvidia_mode & 0o6 != 0o6 else []


def load_spec(path: Path) -> dict[str, Any]:
    spec = yaml.safe_load(path.read_text())
    assert isinstance(spec, dict), path
    return spec


def devices_by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {device["name"]: device["containerEdits"] for device in spec["devices"]}


def node_numbers(node: dict[str, Any]) -> tuple[int, int]:
    """(major, minor) of a spec's device node; the toolkit leaves zero values out."""
    return node.get("major", 0), node.get("minor", 0)


def all_hooks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    hooks = list(spec["containerEdits"].get("hooks", []))
    for device in spec["devices"]:
        hooks += device["containerEdits"].get("hooks", [])
    return hooks


@pytest.mark.parametrize("layout", SPEC_LAYOUTS)
def test_layout_spec_names_the_profiles_gpus_from_the_mock_root(
    layout: Layout, driver: DriverRoot, toolkit: Path, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    path = generate_spec(layout, driver, cdi_dir)
    assert path == cdi_dir / SPEC_FILES[layout]
    assert sorted(cdi_dir.iterdir()) == [path]
    spec = load_spec(path)
    assert spec["kind"] == KINDS[layout]
    assert isinstance(spec["cdiVersion"], str)
    devices = devices_by_name(spec)
    dev_root = driver.dev_root  # holds dev/: a node's hostPath is dev_root + its path

    indexes = {str(gpu.index) for gpu in driver.gpus}
    uuids = {gpu.uuid for gpu in driver.gpus}
    expected = {"host": indexes | uuids | {"all"}, "operator": {"all"}, "index-only": indexes | {"all"}}
    assert set(devices) == expected[layout]
    assert len(spec["devices"]) == len(devices)  # no name twice

    nvidia_nodes = {"fileMode": driver.files.nvidia_mode} | (
        {"gid": driver.files.nvidia_gid} if driver.files.nvidia_gid else {}
    )
    if layout == "operator":
        # Management mode: every NVIDIA node in the one device, nothing per GPU, no NVML needed;
        # nvidia-uvm was not loaded when the spec was generated, so its nodes are missing.
        nodes = {n["path"]: n for n in devices["all"]["deviceNodes"]}
        wanted = {gpu.device_node: (NVIDIA_MAJOR, gpu.minor) for gpu in driver.gpus}
        wanted |= {"/dev/nvidiactl": (NVIDIA_MAJOR, NVIDIACTL_MINOR)}
        assert {p: node_numbers(n) for p, n in nodes.items()} == wanted
        assert all(n["hostPath"] == f"{dev_root}{p}" for p, n in nodes.items())
        assert all(n.items() >= nvidia_nodes.items() for n in nodes.values())
        assert devices["all"].get("additionalGids", []) == nvidia_gids(driver)
    else:
        for gpu in driver.gpus:
            card, render = driver.drm_nodes(gpu)
            names = [str(gpu.index)] + ([gpu.uuid] if layout == "host" else [])
            for name in names:
                edits = devices[name]
                nodes = {n["path"]: n for n in edits["deviceNodes"]}
                assert list(nodes) == [gpu.device_node, f"/dev/dri/{card}", f"/dev/dri/{render}"]
                for path, node in nodes.items():
                    assert node["hostPath"] == f"{dev_root}{path}"
                assert node_numbers(nodes[gpu.device_node]) == (NVIDIA_MAJOR, gpu.minor)
                assert nodes[gpu.device_node].items() >= nvidia_nodes.items()
                assert node_numbers(nodes[f"/dev/dri/{card}"]) == (DRM_MAJOR, gpu.index + 1)
                assert nodes[f"/dev/dri/{card}"]["gid"] == VIDEO_GID
                assert nodes[f"/dev/dri/{render}"]["fileMode"] == 0o660
                assert node_numbers(nodes[f"/dev/dri/{render}"]) == (DRM_MAJOR, RENDER_MINOR_BASE + gpu.index)
                # Toolkit >= 1.19: the groups of the nodes that are not world-read-writable.
                assert sorted(edits["additionalGids"]) == sorted(
                    {*nvidia_gids(driver), VIDEO_GID, RENDER_GID}
                )
                (by_path,) = [h for h in edits["hooks"] if h["args"][1] == "create-symlinks"]
                # The link's path is where the toolkit found it, its dev root included.
                assert f"../{card}::{dev_root}/dev/dri/by-path/pci-{gpu.bus_id}-card" in by_path["args"]
        common_nodes = {n["path"]: n["hostPath"] for n in spec["containerEdits"]["deviceNodes"]}
        assert common_nodes == {"/dev/nvidiactl": f"{dev_root}/dev/nvidiactl"}, "no nvidia-uvm yet"
        all_nodes = {n["path"] for n in devices["all"]["deviceNodes"]}
        assert {gpu.device_node for gpu in driver.gpus} <= all_nodes
    needs_groups = layout != "operator" or nvidia_gids(driver)
    assert spec["cdiVersion"] == ("0.7.0" if needs_groups else "0.5.0"), "additionalGids need 0.7.0"

    common = spec["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    assert mounts[f"{CONTAINER_LIB_DIR}/{driver.libcuda.name}"] == str(driver.libcuda)
    assert mounts[f"{CONTAINER_LIB_DIR}/{driver.nvml_library.name}"] == str(driver.nvml_library)
    assert mounts["/usr/bin/nvidia-smi"] == str(driver.root / "usr" / "bin" / "nvidia-smi")
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]

    hooks = all_hooks(spec)
    assert hooks and all(h["path"] == str(toolkit / "nvidia-cdi-hook") for h in hooks)
    assert all(h["args"][0] == "nvidia-cdi-hook" for h in hooks)
    by_command = {h["args"][1]: h["args"][2:] for h in common["hooks"]}
    assert by_command["update-ldcache"] == ["--folder", CONTAINER_LIB_DIR]
    links = by_command["create-symlinks"]
    assert f"{driver.libcuda.name}::{CONTAINER_LIB_DIR}/libcuda.so.1" in links
    assert f"{driver.nvml_library.name}::{CONTAINER_LIB_DIR}/libnvidia-ml.so.1" in links


def test_with_nvidia_uvm_loaded_the_spec_has_its_nodes(
    driver: DriverRoot, toolkit: Path, tmp_path: Path
) -> None:
    path = generate_spec("host", driver, tmp_path / "cdi", uvm_loaded=True)
    assert path is not None
    nodes = {n["path"]: node_numbers(n) for n in load_spec(path)["containerEdits"]["deviceNodes"]}
    assert nodes == {
        "/dev/nvidiactl": (NVIDIA_MAJOR, NVIDIACTL_MINOR),
        "/dev/nvidia-uvm": (NVIDIA_UVM_MAJOR, 0),
        "/dev/nvidia-uvm-tools": (NVIDIA_UVM_MAJOR, 1),
    }
    assert driver.uvm_loaded(), "the nodes are back after generation"


@pytest.mark.parametrize("layout", SPEC_LAYOUTS)
def test_claim_specs_composed_from_the_real_spec_pass_the_real_cdi_library(
    layout: Layout, driver: DriverRoot, toolkit: Path, tmp_path: Path
) -> None:
    """Issue 33: additionalGids carried, nvidia-uvm completed from the host, a GPU's own nodes only;
    ``nvidia-ctk cdi list`` (the CDI library containerd uses) lists every ID we hand kubelet."""
    registry = tmp_path / "registry"
    generate_spec(layout, driver, registry)
    assert driver.uvm_loaded(), "loaded after the spec was generated (the mock root has it)"
    preparer = make(
        tmp_path, FakeClaims(), simulated=False, toolkit=ToolkitRegistry((registry,), host=HostView())
    )
    preparer.start()
    ids = []
    for gpu in driver.gpus[:2]:
        obj = claim(f"gpu-{gpu.index}", [result(f"gpu-{gpu.index}", share=False)])
        preparer.claims = FakeClaims(obj)
        answer, spec = prepared_spec(preparer, obj)
        assert not answer.error, answer.error
        ids += [cdi_id for device in answer.devices for cdi_id in device.cdi_ids]
        (device,) = spec["devices"]
        nodes = [n["path"] for n in spec["containerEdits"].get("deviceNodes", [])]
        nodes += [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        gpu_nodes = [p for p in nodes if p.startswith("/dev/nvidia") and p[len("/dev/nvidia") :].isdigit()]
        assert gpu_nodes == [gpu.device_node], "its own card only"
        assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(nodes)
        groups = set(spec["containerEdits"].get("additionalGids", []))
        groups |= set(device["containerEdits"].get("additionalGids", []))
        drm = {VIDEO_GID, RENDER_GID} if layout != "operator" else set()
        assert groups == {*nvidia_gids(driver), *drm}
        if layout == "operator":
            assert not any(p.startswith(("/dev/nvidia-caps", "/dev/dri/")) for p in nodes)
        else:
            card, render = driver.drm_nodes(gpu)
            assert {f"/dev/dri/{card}", f"/dev/dri/{render}"} <= set(nodes)
    listed, errors = cdi_list(tmp_path / "cdi", toolkit)
    assert errors == []
    assert sorted(listed) == sorted(ids)


def test_none_layout_writes_nothing(driver: DriverRoot, toolkit: Path, tmp_path: Path) -> None:
    assert generate_spec("none", driver, tmp_path / "cdi") is None
    assert not (tmp_path / "cdi").exists()


_MIG_SLOTS = """
import json, pynvml
def answer(call, *args):
    try:
        result = call(*args)
    except pynvml.NVMLError as err:
        return str(err)
    return result if isinstance(result, int) else "a MIG device"
pynvml.nvmlInit()
out = []
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    out.append([answer(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)]
               + [answer(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot) for slot in (0, 6, 7)])
print(json.dumps(out))
"""


def test_the_mock_answers_the_mig_walk_like_a_gpu_without_mig_devices(run_nvml_script: Any) -> None:
    """go-nvlib walks the MIG slots of every MIG-capable GPU (MIG on or off) when nvidia-ctk
    generates a spec: a capable GPU has 7 slots (or the profile's maxMigDevices), none in use."""
    gpu: dict[str, Any] = {"uuid": "GPU-a", "minor": 0}
    profile = {
        "driverVersion": "550.54.15",
        "devices": [{**gpu, "migMode": 0}, {**gpu, "uuid": "GPU-b", "migMode": 1, "maxMigDevices": 4}, gpu],
    }
    proc = run_nvml_script(_MIG_SLOTS, profile)
    assert json.loads(proc.stdout) == [
        [7, "Not Found", "Not Found", "Invalid Argument"],
        [4, "Not Found", "Invalid Argument", "Invalid Argument"],
        ["Not Supported"] * 4,
    ]


# ---------------------------------------------------------------- a real runtime applies the spec
IMAGE = "localhost/hami-dra-toolkit-busybox:test"


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    """Busybox has no ldconfig and no libc: the toolkit's hooks must cope (update-ldcache runs the
    host's ldconfig in the container's root)."""
    return busybox_podman(tmp_path_factory.mktemp("podman"), IMAGE)


@pytest.fixture(scope="module")
def plain_driver(tmp_path_factory: pytest.TempPathFactory) -> DriverRoot:
    """A node without nvidia-drm: podman 4.3 reads CDI specs up to 0.5.0, and the additionalGids
    that the DRM nodes bring need 0.7.0 (containerd reads them: tests/cluster/test_gpu_nodes.py)."""
    root = tmp_path_factory.mktemp("plain") / "driver"
    return mock_driver_root(root, PROFILES / "t4-4x-node-1.json", DeviceFiles(drm=False))


@pytest.fixture
def host_spec_in_podman(plain_driver: DriverRoot, toolkit: Path, tmp_path: Path) -> Iterator[Path]:
    """The host layout's spec, under a name of its own in podman's CDI dir for the test's length
    (never the node's own nvidia.yaml, which a GPU machine may have)."""
    spec = generate_spec("host", plain_driver, tmp_path / "cdi", uvm_loaded=True)
    assert spec is not None
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    installed = CDI_DIR / f"hami-dra-test-toolkit-{os.getpid()}.yaml"
    shutil.copyfile(spec, installed)
    try:
        yield installed
    finally:
        installed.unlink(missing_ok=True)


def test_podman_applies_the_host_spec_and_its_hooks(
    podman: Podman, plain_driver: DriverRoot, host_spec_in_podman: Path
) -> None:
    driver = plain_driver
    gpu = driver.gpus[-1]
    others = [g.device_node for g in driver.gpus if g != gpu]
    script = (
        "ls -l /dev/; ls -l /usr/lib/x86_64-linux-gnu/; "
        "grep -q libcuda.so.1 /etc/ld.so.cache && echo LDCACHE-HAS-LIBCUDA; "
        "cat /etc/ld.so.conf.d/00-nvcr-*.conf; nvidia-smi -L"
    )
    run = podman(
        "run", "--rm", "--network=none", f"--device=nvidia.com/gpu={gpu.uuid}", IMAGE, "sh", "-c", script
    )
    # runc fails the container when any hook (createRuntime, createContainer) exits non-zero.
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()

    def char_device(name: str, major: int, minor: int) -> bool:
        return any(
            line.startswith("crw-rw-rw-") and line.split()[-1] == name and f"{major}, {minor:>3}" in line
            for line in lines
        )

    assert char_device(f"nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor), run.stdout
    assert char_device("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
    assert char_device("nvidia-uvm", NVIDIA_UVM_MAJOR, 0)
    assert not any(line.split()[-1] == Path(node).name for line in lines if line for node in others)
    # The mount, then create-symlinks' links, then update-ldcache's drop-in and cache.
    assert any(line.startswith("-") and line.endswith(f" {driver.libcuda.name}") for line in lines)
    assert any(line.endswith(f" libcuda.so.1 -> {driver.libcuda.name}") for line in lines)
    assert any(line.endswith(f" libnvidia-ml.so.1 -> {driver.nvml_library.name}") for line in lines)
    assert "LDCACHE-HAS-LIBCUDA" in lines
    assert CONTAINER_LIB_DIR in lines
    assert f"GPU {gpu.index}: " in run.stdout and gpu.uuid in run.stdout  # the mounted nvidia-smi
