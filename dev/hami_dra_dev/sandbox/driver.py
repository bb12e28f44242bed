"""Where ``hami-dra sandbox up`` starts the driver itself next to the simulated cluster.

This is the one place that wires the driver's real components into the sandbox; each is its own
small function so it can be changed (or switched off with ``--no-driver``) independently:

- :func:`start_kubelet_plugins`: per node, ``hami-dra kubelet-plugin --source simulated`` as a
  child process with the node's private plugin/registry/CDI dirs (:class:`NodeContext`);
- :func:`kubelet_factory`: per node, the kubelet simulator (``hami_dra_dev.kubelet``) that
  registers those plugins over their sockets and prepares claims;
- :func:`start_controller`: ``hami-dra controller`` as a child process;
- :func:`start_webhook`: ``hami-dra webhook`` with a self-signed certificate, registered as a
  Mutating- and ValidatingWebhookConfiguration (``url`` client config with its ``caBundle``).

Children run ``dra_driver.cli.main`` under ``sys.executable`` with the sandbox kubeconfig and log to
``<state dir>/logs/<name>.log``.
"""

from __future__ import annotations

import base64
import logging
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import CHILD_ENTRY
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.sandbox.cluster import NodeContext, SandboxCluster, Stoppable
from hami_dra_dev.sandbox.webhooks import register_webhooks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverOptions:
    profile: str = "t4"
    gpus: int = 4
    driver_name: str = DEFAULT_DRIVER_NAME


class ChildProcess:
    """A ``hami-dra`` subcommand run as a child; :meth:`stop` terminates it (then kills)."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD_ENTRY, "-v", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_kubelet_plugins(cluster: SandboxCluster, options: DriverOptions) -> None:
    logs = cluster.server.state_dir / "logs"
    for name in cluster.node_names:
        ctx = cluster.node_context(name)
        args = [
            "kubelet-plugin",
            "--node-name",
            name,
            "--driver-name",
            options.driver_name,
            "--source",
            "simulated",
            "--profile",
            options.profile,
            "--gpus",
            str(options.gpus),
            "--kubeconfig",
            str(cluster.server.kubeconfig_path),
            "--plugin-dir",
            str(ctx.plugins_dir / options.driver_name),
            "--registry-dir",
            str(ctx.registry_dir),
            "--cdi-dir",
            str(ctx.cdi_dir),
            "--metrics-bind-address",
            "0",
            "--health-file",
            str(ctx.root / "plugin-healthy"),
            "--boot-id-file",
            str(ctx.root / "boot_id"),
        ]
        (ctx.root / "boot_id").write_text(f"sandbox-{name}\n")
        cluster.add_component(ChildProcess(f"kubelet-plugin-{name}", args, logs))


def kubelet_factory(repo_root: Path | None = None) -> Any:
    """A ``NodeContext -> kubelet simulator`` factory (None when the simulator cannot load)."""
    try:
        from hami_dra_dev import kubelet
    except ImportError as err:  # pragma: no cover - only while kubelet.py is being written
        log.warning("kubelet simulator unavailable: %s", err)
        return None
    root = repo_root or Path(__file__).resolve().parents[3]
    try:
        protocol = kubelet.KubeletProtocol.own(root)
    except Exception as err:
        log.warning("kubelet simulator unavailable (protos under %s/api/kubelet): %s", root, err)
        return None

    def start(ctx: NodeContext) -> Stoppable:
        sim = kubelet.KubeletSimulator(ctx.name, ctx.registry_dir, ctx.server.api_client(), protocol)
        sim.start()
        return sim

    return start


def start_controller(cluster: SandboxCluster, options: DriverOptions) -> None:
    args = [
        "controller",
        "--kubeconfig",
        str(cluster.server.kubeconfig_path),
        "--driver-name",
        options.driver_name,
        "--metrics-bind-address",
        "0",
    ]
    cluster.add_component(ChildProcess("controller", args, cluster.server.state_dir / "logs"))


def start_webhook(cluster: SandboxCluster, options: DriverOptions) -> None:
    state = cluster.server.state_dir
    pair = make_self_signed(state / "webhook-tls", "hami-dra-webhook")
    port = _free_port()
    args = [
        "webhook",
        "--tls-cert-file",
        str(pair.cert_file),
        "--tls-key-file",
        str(pair.key_file),
        "--port",
        str(port),
        "--driver-name",
        options.driver_name,
        "--kubeconfig",
        str(cluster.server.kubeconfig_path),
    ]
    cluster.add_component(ChildProcess("webhook", args, state / "logs"))
    _wait_port(port, 15.0)
    ca = base64.b64encode(pair.ca_pem).decode()
    register_webhooks(cluster.server.api, f"https://127.0.0.1:{port}", ca, options.driver_name)


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    log.warning("webhook did not start listening on port %d within %.0fs", port, timeout)


def start_driver(cluster: SandboxCluster, options: DriverOptions) -> None:
    """Start every driver component for ``cluster`` (the documented wiring place)."""
    start_webhook(cluster, options)
    start_controller(cluster, options)
    start_kubelet_plugins(cluster, options)
