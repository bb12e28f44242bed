"""NVML from the node's driver root (dra_driver/devices/nvml_library.py): the layouts of the major
distributions and of the GPU Operator, links followed inside the root, one actionable line when
the library is not there; and the plugin's own discovery loading the mock NVML from a driver root
with nothing on ``LD_LIBRARY_PATH`` (how the chart runs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from mock_profiles import profile_from_gpus

from dra_driver.devices.nvml_library import LIBRARY, find_nvml_library, use_driver_root
from dra_driver.devices.simulated import profile_gpus
from dra_driver.devices.source import DeviceSourceError, open_source

VERSIONED = "libnvidia-ml.so.550.54.15"


def install(root: Path, directory: str, *, link: str | None = None) -> Path:
    """The driver's files in ``root/directory``: the versioned library, the soname as a link to it."""
    target = root / directory
    target.mkdir(parents=True, exist_ok=True)
    (target / VERSIONED).write_bytes(b"\x7fELF")
    (target / LIBRARY).symlink_to(link or VERSIONED)
    return target / VERSIONED


@pytest.mark.parametrize(
    "directory",
    ["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib"],
    ids=["debian-ubuntu", "rhel-suse", "arm64", "lib64", "arch"],
)
def test_the_library_is_found_in_each_distribution_layout(tmp_path: Path, directory: str) -> None:
    versioned = install(tmp_path, directory)
    assert find_nvml_library(tmp_path) == versioned


def test_the_gpu_operator_driver_root_has_the_same_layout(tmp_path: Path) -> None:
    root = tmp_path / "run" / "nvidia" / "driver"
    versioned = install(root, "usr/lib/x86_64-linux-gnu")
    assert find_nvml_library(root) == versioned


def test_absolute_links_are_followed_inside_the_root_not_in_the_container(tmp_path: Path) -> None:
    # Merged /usr: /lib64 -> /usr/lib64 (absolute, as the host sees it); soname -> absolute path.
    versioned = install(tmp_path, "usr/lib64", link=f"/usr/lib64/{VERSIONED}")
    (tmp_path / "lib64").symlink_to("/usr/lib64")
    (tmp_path / "usr/lib64" / LIBRARY).unlink()
    (tmp_path / "usr/lib64" / LIBRARY).symlink_to(f"/lib64/{VERSIONED}")
    assert find_nvml_library(tmp_path) == tmp_path / "usr/lib64" / VERSIONED == versioned


def test_a_missing_library_names_the_value_to_set(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64" / LIBRARY).symlink_to("libnvidia-ml.so.gone")  # a dangling link
    with pytest.raises(DeviceSourceError) as raised:
        find_nvml_library(tmp_path)
    message = str(raised.value)
    assert f"{LIBRARY} not found under the NVIDIA driver root {tmp_path}" in message
    assert "kubeletPlugin.nvidiaDriverRoot" in message and "/run/nvidia/driver" in message
    assert "\n" not in message


def test_a_driver_root_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DeviceSourceError, match="is not a directory: mount the host's driver root"):
        find_nvml_library(tmp_path / "absent")


def test_a_loop_of_links_is_not_followed_forever(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64" / LIBRARY).symlink_to(LIBRARY)
    with pytest.raises(DeviceSourceError, match="not found"):
        find_nvml_library(tmp_path)


def test_a_library_already_loaded_is_kept(tmp_path: Path) -> None:
    install(tmp_path, "usr/lib64")
    loaded = SimpleNamespace(nvmlLib="already")
    use_driver_root(tmp_path, loaded)
    assert loaded.nvmlLib == "already"


def test_a_file_that_is_no_library_is_refused_clearly(tmp_path: Path) -> None:
    versioned = install(tmp_path, "usr/lib64")
    with pytest.raises(DeviceSourceError, match=f"{versioned} could not be loaded"):
        use_driver_root(tmp_path, SimpleNamespace(nvmlLib=None))


def test_the_driver_root_only_applies_to_nvml(tmp_path: Path) -> None:
    with pytest.raises(DeviceSourceError, match="only applies to --source nvml"):
        open_source("simulated", node_name="n", profile="t4", driver_root=tmp_path)


def test_discover_loads_nvml_from_the_driver_root_alone(mock_nvml: dict[str, Path], tmp_path: Path) -> None:
    """`hami-dra discover --nvidia-driver-root` in a process whose loader cannot find NVML itself."""
    root = tmp_path / "driver-root"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    shutil.copy(mock_nvml["current"] / LIBRARY, root / "usr/lib/x86_64-linux-gnu" / VERSIONED)
    (root / "usr/lib/x86_64-linux-gnu" / LIBRARY).symlink_to(VERSIONED)
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            profile_from_gpus(
                profile_gpus("t4", node_name="n", gpus=2),
                driver_version="550.54.15",
                cuda_driver_version=12040,
            )
        )
    )
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    env.update(MOCK_NVML_PROFILE=str(profile), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    command = [
        sys.executable,
        "-m",
        "dra_driver",
        "discover",
        "--source",
        "nvml",
        "--node-name",
        "n",
        "-o",
        "json",
    ]
    without = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert without.returncode != 0, "the loader must not find NVML on its own in this test"
    found = subprocess.run(
        [*command, "--nvidia-driver-root", str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    slices = json.loads(found.stdout)
    devices = [device for piece in (slices.get("items") or [slices]) for device in piece["spec"]["devices"]]
    assert len(devices) == 2
