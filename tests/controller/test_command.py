"""``hami-dra controller`` as a process against the real control plane (with kube-scheduler and
kube-controller-manager, tests/controller/harness.py ``plane_harness``): it allocates, and exits
cleanly on SIGTERM."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import cli, flags
from dra_driver.cli import main as cli_main
from dra_driver.flags import BindAddress
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import (
    DRIVER,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)

ENTRY = "import sys; from dra_driver.cli import main; sys.exit(main())"
#: A kubeconfig that loads but whose server is never reached (the command fails before).
UNREACHABLE_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane) as h:
        yield h


@pytest.mark.slow
def test_controller_process_allocates_and_stops_on_sigterm(harness: Harness) -> None:
    harness.publish("node-1", "t4", 4)
    harness.create_class(device_class(DRIVER, {"policy": "mutex,binpack"}))
    args = [
        "controller",
        "--kubeconfig",
        str(harness.server.kubeconfig_path),
        "--metrics-bind-address=0",
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
    # The caches and state were built, then set aside from the garbage collector, before it ran.
    settled, running = output.index("set aside from garbage collection"), output.index("running for driver")
    assert settled < running


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--default-policy", "nonsense"], "default policy 'nonsense'"),
        (["--default-node-policy", "packed"], "default node policy"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load Kubernetes config from"),
        (["--normal-event-burst", "-1"], "--normal-event-burst must be at least 0"),
        (["--write-workers", "0"], "--write-workers must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["controller", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "70000"], "argument --metrics-port: a port must be within 0..65535, got 70000"),
        (["--metrics-bind-address", "8080"], "argument --metrics-bind-address: expected HOST:PORT"),
        (["--metrics-bind-address", "garbage"], "argument --metrics-bind-address: expected HOST:PORT"),
        (["--metrics-bind-address=no such:80"], "argument --metrics-bind-address: HOST must be an IP"),
    ],
)
def test_bad_metrics_flags_are_argument_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["controller", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "env", "address"),
    [
        ([], {}, BindAddress("", 8080)),
        (["--metrics-bind-address", ":9090"], {}, BindAddress("", 9090)),
        (["--metrics-bind-address=0.0.0.0:9090"], {}, BindAddress("0.0.0.0", 9090)),
        (["--metrics-bind-address=0"], {}, BindAddress("", 0)),
        (["--metrics-bind-address=127.0.0.1:9090"], {}, BindAddress("127.0.0.1", 9090)),
        (["--metrics-bind-address=[::]:9090"], {}, BindAddress("::", 9090)),
        (["--metrics-bind-address=[::1]:9090"], {}, BindAddress("::1", 9090)),
        (["--metrics-port", "9090"], {}, BindAddress("", 9090)),
        (["--metrics-port=0"], {}, BindAddress("", 0)),
        ([], {"METRICS_BIND_ADDRESS": ":9191"}, BindAddress("", 9191)),
        (["--metrics-bind-address=:9090"], {"METRICS_BIND_ADDRESS": ":9191"}, BindAddress("", 9090)),
    ],
)
def test_metrics_bind_address_and_its_deprecated_alias(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], address: BindAddress
) -> None:
    monkeypatch.delenv("METRICS_BIND_ADDRESS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parsed = cli.build_parser().parse_args(["controller", *args])
    assert parsed.metrics_bind_address == address
    assert flags.metrics_address(parsed) == (address if address.port else None)


def test_a_metrics_address_it_cannot_listen_on_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    # 192.0.2.1 (TEST-NET-1) is never an address of this machine.
    args = ["controller", "--kubeconfig", str(kubeconfig), "--metrics-bind-address", "192.0.2.1:9090"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "--metrics-bind-address 192.0.2.1:9090: cannot listen there" in err and "Traceback" not in err


def test_metrics_port_warns_naming_the_new_flag(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(flags, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        assert cli_main(["controller", "--metrics-port", "0", "--default-policy", "nonsense"]) == 2
    capsys.readouterr()
    assert [r.getMessage() for r in caplog.records] == [
        "--metrics-port is deprecated: use --metrics-bind-address=0"
    ]
