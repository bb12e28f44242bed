"""The plugin waits for the NVIDIA driver (``kubeletplugin/driver_wait.py``) instead of crash-looping.

Under the GPU Operator the driver root is an empty directory when the plugin's pod starts; the
driver container fills it minutes later. The plugin must stay up, say in one line what it waits
for, keep ``/healthz`` answering (so kubelet does not restart it) with ``/readyz`` giving the
reason, and start as soon as NVML loads. The end-to-end test runs the real CLI against a driver
root that is empty at first and then gets the mock NVML (``tests/nvidia_layouts.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dra_driver.devices.model import Gpu
from dra_driver.devices.simulated import profile_gpus
from dra_driver.devices.source import DeviceSourceError, DriverNotReady
from dra_driver.kubeletplugin.driver_wait import DriverWait
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.kubeletplugin.conftest import NODE, Dirs
from tests.kubeletplugin.test_recovery import HAMI_DRA
from tests.kubeletplugin.upstream import REPO_ROOT
from tests.nvidia_layouts import PROFILE_IN_ROOT, PROFILES, mock_driver_root
from tests.waiting import wait_for


class Driver:
    """A discovery that fails with ``failures`` in turn, then finds two GPUs."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> list[Gpu]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return profile_gpus("t4", node_name=NODE, gpus=2)


def test_waits_while_nvml_does_not_load_logging_each_reason_once(caplog: pytest.LogCaptureFixture) -> None:
    missing = DriverNotReady("libnvidia-ml.so.1 not found under the NVIDIA driver root /driver-root")
    failing = DriverNotReady("NVML not found (nvmlInit: Driver Not Loaded)")
    driver = Driver(missing, missing, missing, failing)
    wait = DriverWait(driver, threading.Event(), retry_seconds=0.01)
    assert wait.ready() == "discovering the node's GPUs"
    with caplog.at_level(logging.INFO, logger="dra_driver.kubeletplugin.driver_wait"):
        gpus = wait.run()
    assert gpus is not None and [g.name for g in gpus] == ["gpu-0", "gpu-1"]
    assert driver.calls == 5
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == [
        f"waiting for the NVIDIA driver (NVML not loaded, retrying every 0.01s): {missing}",
        f"waiting for the NVIDIA driver (NVML not loaded, retrying every 0.01s): {failing}",
    ], "one line per reason, not one per try"
    assert len(lines) == 3 and lines[2].startswith("NVIDIA driver ready after ")
    assert lines[2].endswith("NVML loaded, 2 GPU(s)")
    assert wait.ready() == f"waiting for the NVIDIA driver: {failing}", "the last reason, for /readyz"


def test_a_reason_that_stays_is_repeated_now_and_then(caplog: pytest.LogCaptureFixture) -> None:
    reason = DriverNotReady("libnvidia-ml.so.1 not found")
    driver = Driver(reason, reason, reason)
    wait = DriverWait(driver, threading.Event(), retry_seconds=0.0, repeat_seconds=0.0)
    with caplog.at_level(logging.WARNING, logger="dra_driver.kubeletplugin.driver_wait"):
        assert wait.run() is not None
    assert sum("waiting for the NVIDIA driver" in r.getMessage() for r in caplog.records) == 3


def test_errors_time_does_not_fix_still_end_the_process() -> None:
    driver = Driver(DeviceSourceError("--profile and --gpus only apply to --source simulated"))
    with pytest.raises(DeviceSourceError, match="only apply to --source simulated"):
        DriverWait(driver, threading.Event(), retry_seconds=0.0).run()
    assert driver.calls == 1


def test_stopping_while_waiting_returns_nothing() -> None:
    stop = threading.Event()
    stop.set()
    driver = Driver(DriverNotReady("no driver"))
    assert DriverWait(driver, stop, retry_seconds=60).run() is None
    assert driver.calls == 1


# --- the real CLI, a driver root that fills in later ----------------------------------------------


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # not listening (yet, or any more)
        return 0, str(err)


def test_the_plugin_waits_for_an_empty_driver_root_and_starts_when_the_driver_appears(
    dirs: Dirs, apiserver: ControlPlane, tmp_path: Path
) -> None:
    root = tmp_path / "run-nvidia-driver"
    root.mkdir()  # what DirectoryOrCreate leaves before the driver container mounts its root there
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "plugin.log"
    cmd = [
        *HAMI_DRA, "kubelet-plugin",
        "--node-name", NODE, "--source", "nvml", "--nvidia-driver-root", str(root), "--nvidia-cdi-kind", "",
        "--kubeconfig", str(apiserver.kubeconfig_path), "--publish=false",
        "--plugin-dir", str(dirs.plugin), "--registry-dir", str(dirs.registry), "--cdi-dir", str(dirs.cdi),
        "--boot-id-file", str(dirs.boot_id), "--metrics-bind-address", f"127.0.0.1:{port}",
        "--driver-retry-seconds", "0.2",
    ]  # fmt: skip
    env = dict(os.environ, MOCK_NVML_PROFILE=str(root / PROFILE_IN_ROOT))
    with log.open("w") as stderr:
        process = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )  # fmt: skip
    try:
        wait_for(lambda: "waiting for the NVIDIA driver" in log.read_text(), 30, "the plugin's waiting line")
        (line,) = [line for line in log.read_text().splitlines() if "waiting for the NVIDIA driver" in line]
        assert f"libnvidia-ml.so.1 not found under the NVIDIA driver root {root}" in line
        assert "kubeletPlugin.nvidiaDriverRoot" in line, "it names the value to check"
        assert _get(port, "/healthz") == (200, "ok"), "kubelet must not restart a plugin that waits"
        status, why = _get(port, "/readyz")
        assert status == 503 and "waiting for the NVIDIA driver" in why and "libnvidia-ml.so.1" in why
        assert process.poll() is None

        mock_driver_root(root, PROFILES / "t4-4x-node-1.json")  # the driver container's files arrive
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready.startswith("ready:"), log.read_text()
        text = log.read_text()
        assert "NVIDIA driver ready after" in text and "NVML loaded, 4 GPU(s)" in text
        # One line per reason: the root is built file by file, so a second reason (the library
        # there, NVML not initialising yet) may be met on the way, but no reason is repeated.
        waiting = [
            line.split("): ", 1)[-1] for line in text.splitlines() if "waiting for the NVIDIA driver" in line
        ]
        assert len(waiting) == len(set(waiting)), f"one line while the reason stayed: {waiting}"
        wait_for(lambda: _get(port, "/healthz") == (200, "ok"), 30, "the plugin's own endpoint")
        status, why = _get(port, "/readyz")
        assert status == 503 and "kubelet has not registered" in why, "now it waits for kubelet, not NVML"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
