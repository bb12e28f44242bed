"""``hami-dra demo`` end to end: the seed's lab outcomes, a wrong placement failing, and clean-up."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import cli
from hami_dra_dev.demo import manifests, render
from hami_dra_dev.demo.checks import Checks
from hami_dra_dev.demo.command import execute, run_demo
from hami_dra_dev.demo.stack import DemoStack
from hami_dra_dev.sandbox import SandboxServer

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[")
#: tests/api_proxy.py's PROXY_THREADS.
PROXY_THREADS = "api-fault-proxy"


def _observed(checks: Checks) -> dict[str, str]:
    return {check.name: check.observed for check in checks.items}


def _demo_threads() -> list[str]:
    """Live threads, without the real-cluster fault proxy's (tests/cluster/faults.py), which a
    session-long fixture keeps opening while these tests run."""
    return [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.name.startswith(PROXY_THREADS)
    ]


def _wait_threads_gone(before: set[str], timeout: float = 3.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [name for name in _demo_threads() if name not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture
def probe() -> Iterator[Path]:
    """An empty, short temp dir (unix socket paths must stay under 108 bytes) to watch for leftovers."""
    path = Path(tempfile.mkdtemp(prefix="hdp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(90)
def test_demo_reproduces_the_seed_lab_and_cleans_up(probe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Per-process caches live outside the probe: the sandbox's shared TLS dir and the kubernetes
    # client's copy of its CA (the subprocess test below checks that those go at exit too).
    with SandboxServer.start() as warm:
        warm.api_client().close()
    monkeypatch.setattr(tempfile, "tempdir", str(probe))
    threads_before = set(_demo_threads())
    out = io.StringIO()
    console = render.make_console(out)
    started = time.monotonic()

    checks = execute(console, use_kubectl=True, timeout=20.0)

    elapsed = time.monotonic() - started
    assert checks.passed, [f"{c.name}: expected {c.expected}, observed {c.observed}" for c in checks.failures]
    observed = _observed(checks)
    assert observed["webhook rejects an unknown policy name"] == "rejected naming binpak"
    assert observed["tenant-a (binpack) placed on"] == "gpu-0"
    assert observed["tenant-b (binpack) placed on"] == "gpu-0"
    assert observed["tenant-c (spread) placed on"] == "gpu-1"
    assert observed["latency-tier (mutex,binpack) placed on"] == "gpu-2"
    assert observed["scores GPU 0..3"] == "3.336273, 1.668137, 0.000000, 0.000000"
    assert observed["card chosen by mutex,binpack"] == "gpu-2"
    assert observed["CDI memory limit"] == "CUDA_DEVICE_MEMORY_LIMIT_0=1000m"
    assert observed["exclusive stays Pending"] == "<none>"
    assert observed["pending reason in condition"] == "True"
    assert observed["exclusive (mutex) placed on"] == "gpu-3"
    assert elapsed < 60, f"the demo took {elapsed:.1f}s"

    text = out.getvalue()
    for needle in (
        "gke-lab-node-gpu.hami.io-0",
        "3.336273",
        "1.668137",
        "CUDA_DEVICE_MEMORY_LIMIT_0=1000m",
        "ExclusiveDeviceAllocateConflict",
        "consumedCapacity",
    ):
        assert needle in text, needle
    if "kubectl not found" not in text:
        assert "$ kubectl get resourceslices" in text and "$ kubectl describe pod exclusive" in text
    assert not ANSI.search(text), "non-TTY output must carry no escape codes"
    assert max(len(line) for line in text.splitlines()) <= render.WIDTH

    assert _wait_threads_gone(threads_before) == []
    assert list(probe.iterdir()) == [], "temp files left behind"


@pytest.mark.timeout(90)
def test_a_wrong_placement_fails_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = manifests.DemoPod("latency-tier", "mutex-binpack", "gpu-3", "deliberately wrong expectation")
    monkeypatch.setattr(manifests, "LATENCY", wrong)
    out = io.StringIO()

    code = run_demo(out, use_kubectl=False, timeout=20.0)

    text = out.getvalue()
    assert code == 1
    assert "FAILED: latency-tier (mutex,binpack) placed on: expected gpu-3, observed gpu-2" in text
    assert "checks passed" not in text


def test_start_up_failure_stops_what_was_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from hami_dra_dev.demo import stack as stack_module

    class Broken:
        def __init__(self, *args: object) -> None:
            raise RuntimeError("controller could not start")

    threads_before = set(_demo_threads())
    monkeypatch.setattr(stack_module, "DemoController", Broken)
    with pytest.raises(RuntimeError, match="controller could not start"):
        DemoStack.start()
    assert _wait_threads_gone(threads_before) == []

    out = io.StringIO()
    assert run_demo(out, use_kubectl=False) == 1
    assert "FAILED: demo runs: expected no error, observed RuntimeError: controller could not start" in (
        out.getvalue()
    )


def test_cli_rejects_a_bad_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--timeout", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hami-dra demo: error: --timeout must be positive, got 0.0"


@pytest.mark.timeout(120)
def test_cli_subprocess_exits_0_and_leaves_no_temp_files(probe: Path) -> None:
    env = {**os.environ, "TMPDIR": str(probe), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "dra_driver", "demo", "--no-kubectl"],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "checks passed" in result.stdout
    assert result.stderr == "", "warnings would interleave with the tables"
    assert max(len(line) for line in result.stdout.splitlines()) <= render.WIDTH
    assert list(probe.iterdir()) == []
