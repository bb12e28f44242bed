"""``hami-dra controller`` as a process against the sandbox: it allocates, and exits cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dra_driver.cli import main as cli_main
from dra_driver.sandbox import SandboxServer
from tests.controller.harness import (
    DRIVER,
    Harness,
    claim,
    device_class,
    pod,
    request,
    running_harness,
    wait_for,
)

ENTRY = "import sys; from dra_driver.cli import main; sys.exit(main())"


@pytest.fixture
def harness(sandbox: SandboxServer) -> Iterator[Harness]:
    with running_harness(sandbox) as h:
        yield h


def test_controller_process_allocates_and_stops_on_sigterm(harness: Harness) -> None:
    harness.publish("node-1", "t4", 4)
    harness.create_class(device_class(DRIVER, {"policy": "mutex,binpack"}))
    args = [
        "controller",
        "--kubeconfig",
        str(harness.server.kubeconfig_path),
        "--metrics-port",
        "0",
        "--leader-elect",
        "--leader-elect-namespace",
        "default",
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "-v", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        harness.create_claim(claim("cli", request(memory="1000Mi")))
        harness.create_pod(pod("cli-pod", {"gpu": "claim:cli"}))
        wait_for(lambda: harness.bound_node("cli-pod"), timeout=30, what="allocated by the process")
        assert harness.devices_of("cli") == ["node-1/gpu-0"]
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert "acquired leadership" in output and "policy=mutex,binpack(class)" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--default-policy", "nonsense"], "default policy 'nonsense'"),
        (["--default-node-policy", "packed"], "default node policy"),
        (["--metrics-port", "70000"], "--metrics-port must be within"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load Kubernetes config from"),
    ],
)
def test_bad_flags_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["controller", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
