"""What the image installs: ``pip install .`` without extras starts every deployed component.

The distribution is installed into a fresh virtualenv (no ``--system-site-packages``), so a
component that imports a development-only module (the sandbox's validation, say) fails here as it
would in the image, and so does one that needs the development package (``dev/``, never in the
wheel: the sandbox, the cluster harness, the demo). Each component then starts for real against the
run's real kube-apiserver (tests/apiserver_fixtures.py, started by the test process, which has the
development extra) and must report that it runs."""

from __future__ import annotations

import os
import socket
import subprocess
import venv
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import DEV_ABSENT
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("controller", "kubelet-plugin", "webhook", "simulate", "discover")


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<venv>/bin/hami-dra`` of a fresh virtualenv holding only the production distribution."""
    root = tmp_path_factory.mktemp("production-venv")
    venv.create(root, with_pip=True)
    python = root / "bin" / "python"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "bin" / "hami-dra"


def test_no_development_package_is_installed(production: Path) -> None:
    python = production.parent / "python"
    for module in ("jsonschema", "kubernetes_validate", "pytest", "hami_dra_dev"):
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, check=False)
        assert probe.returncode != 0, f"{module} is installed in the production virtualenv"


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_prints_its_help(production: Path, component: str) -> None:
    result = subprocess.run(
        [str(production), component, "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"hami-dra {component}" in result.stdout


@pytest.mark.parametrize("tool", ("sandbox", "demo", "cluster"))
def test_development_tools_say_where_they_come_from(production: Path, tool: str, tmp_path: Path) -> None:
    # An empty state dir: the real-cluster suite may run a cluster from the default one meanwhile.
    args = {"sandbox": ["up"], "demo": [], "cluster": ["status", "--state-dir", str(tmp_path)]}[tool]
    result = subprocess.run([str(production), tool, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"hami-dra {tool}: error: {DEV_ABSENT}"]
    listed = subprocess.run([str(production), "--help"], capture_output=True, text=True, check=False)
    assert tool in listed.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _start(production: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(production), "-v", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def test_components_start_against_an_api_server(
    production: Path, apiserver: ControlPlane, api_namespace: str, tmp_path: Path
) -> None:
    kubeconfig = str(apiserver.kubeconfig_path)
    node = f"{api_namespace}-prod"  # the shared server's nodes are every test's own
    tls = make_self_signed(tmp_path / "tls", "hami-dra-webhook")
    plugin_dir, registry = tmp_path / "plugin", tmp_path / "registry"
    port = _free_port()
    starts = {
        "controller": (
            ["controller", "--kubeconfig", kubeconfig, "--metrics-bind-address", "0"],
            "running for driver",
        ),
        "kubelet-plugin": (
            [
                "kubelet-plugin",
                "--node-name",
                node,
                "--source",
                "simulated",
                "--profile",
                "t4",
                "--gpus",
                "2",
                "--kubeconfig",
                kubeconfig,
                "--plugin-dir",
                str(plugin_dir),
                "--registry-dir",
                str(registry),
                "--cdi-dir",
                str(tmp_path / "cdi"),
                "--metrics-bind-address",
                "0",
                "--boot-id-file",
                str(tmp_path / "boot_id"),
            ],
            None,
        ),
        "webhook": (
            [
                "webhook",
                "--tls-cert-file",
                str(tls.cert_file),
                "--tls-key-file",
                str(tls.key_file),
                "--port",
                str(port),
                "--kubeconfig",
                kubeconfig,
            ],
            None,
        ),
    }
    (tmp_path / "boot_id").write_text("production-install-test\n")
    processes = {}
    try:
        for name, (args, _) in starts.items():
            processes[name] = _start(production, tmp_path / f"{name}.log", *args)
        wait_for(
            lambda: "running for driver" in (tmp_path / "controller.log").read_text(),
            30,
            "controller running",
        )
        wait_for(lambda: (plugin_dir / "dra.sock").exists(), 30, "the kubelet plugin's DRA socket")
        from kubernetes import client

        resource: Any = client.ResourceV1Api(apiserver.api_client())
        slices = lambda: resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items  # noqa: E731
        wait_for(slices, 30, "the kubelet plugin's ResourceSlice")
        wait_for(lambda: _listening(port), 30, "the webhook's HTTPS port")
        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited:\n{(tmp_path / f'{name}.log').read_text()}"
    finally:
        for process in processes.values():
            _stop(process)
