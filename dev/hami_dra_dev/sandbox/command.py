"""``hami-dra sandbox up|down|status``: a whole driver-on-a-laptop cluster, for demos and tests.

``up`` starts the sandbox API server, the simulated nodes and control plane and (unless
``--no-driver``) the driver's kubelet plugins, controller and webhook; prints the kubeconfig
path; and runs in the foreground until ``hami-dra sandbox down`` (from another shell) or Ctrl-C.
A state directory holds the kubeconfig, ``sandbox.pid``, ``state.json`` and component logs.
Development tool only: never part of a production deployment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from dra_driver.cli import UsageError
from hami_dra_dev.pidfile import running_pid, terminate

PID_FILE = "sandbox.pid"
STATE_FILE = "state.json"


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"hami-dra-sandbox-{os.getuid()}"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="run a local sandbox cluster with the driver (development and demos only)",
        description="A strict in-process Kubernetes API server with simulated nodes, for trying the driver.",
    )
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION")
    sub.required = True
    up = sub.add_parser("up", help="start the sandbox and run until 'down' or Ctrl-C")
    up.add_argument("--nodes", type=int, default=1, help="number of simulated nodes (default 1)")
    up.add_argument("--profile", default="t4", help="simulated GPU profile per node (default t4)")
    up.add_argument("--gpus", type=int, default=4, help="simulated GPUs per node (default 4)")
    up.add_argument(
        "--kube-version", default="1.36", help="Kubernetes version to report and validate against"
    )
    up.add_argument(
        "--no-driver", action="store_true", help="only the cluster: no plugins, controller, webhook"
    )
    up.add_argument("--state-dir", type=Path, default=None, help=f"default: {default_state_dir()}")
    up.set_defaults(handler=run_up)
    down = sub.add_parser("down", help="stop a running sandbox")
    down.add_argument("--state-dir", type=Path, default=None, help=f"default: {default_state_dir()}")
    down.set_defaults(handler=run_down)
    status = sub.add_parser("status", help="print the running sandbox's state as JSON")
    status.add_argument("--state-dir", type=Path, default=None, help=f"default: {default_state_dir()}")
    status.set_defaults(handler=run_status)


def _running_pid(state_dir: Path) -> int | None:
    return running_pid(state_dir / PID_FILE)


def run_up(args: argparse.Namespace) -> int:
    from hami_dra_dev.certs import CertError
    from hami_dra_dev.sandbox.cluster import SandboxCluster
    from hami_dra_dev.sandbox.driver import DriverOptions, kubelet_factory, start_driver
    from hami_dra_dev.sandbox.server import SandboxServer

    if args.nodes < 1 or args.nodes > 64:
        raise UsageError("--nodes must be between 1 and 64")
    if args.gpus < 1 or args.gpus > 16:
        raise UsageError("--gpus must be between 1 and 16")
    if not args.no_driver:
        from dra_driver.devices.simulated import PROFILES

        if args.profile not in PROFILES:
            raise UsageError(f"unknown --profile {args.profile!r}; choose one of: {', '.join(PROFILES)}")
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    pid = _running_pid(state_dir)
    if pid is not None:
        raise UsageError(
            f"a sandbox is already running from {state_dir} (pid {pid}); run 'hami-dra sandbox down'"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server = SandboxServer.start(state_dir=state_dir, kube_version=args.kube_version)
    except CertError as err:
        raise UsageError(str(err)) from err
    except ValueError as err:
        raise UsageError(f"cannot start the sandbox: {err}") from err
    cluster = None
    try:
        (state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
        factory = None if args.no_driver else kubelet_factory()
        cluster = SandboxCluster(server, args.nodes, kubelet_factory=factory).start()
        if not args.no_driver:
            start_driver(cluster, DriverOptions(profile=args.profile, gpus=args.gpus))
        state = {
            "pid": os.getpid(),
            "url": server.url,
            "kubeconfig": str(server.kubeconfig_path),
            "nodes": cluster.node_names,
            "driver": not args.no_driver,
            "logs": str(state_dir / "logs"),
        }
        (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        print(f"sandbox API server: {server.url}")
        print(f"kubeconfig: {server.kubeconfig_path}")
        print(f"try: kubectl --kubeconfig {server.kubeconfig_path} get resourceslices")
        print(f"  or: export KUBECONFIG={server.kubeconfig_path}")
        print("stop with: hami-dra sandbox down (or Ctrl-C)", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()
        for name in (PID_FILE, STATE_FILE):
            with contextlib.suppress(FileNotFoundError):
                (state_dir / name).unlink()
    return 0


def run_down(args: argparse.Namespace) -> int:
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    pid = _running_pid(state_dir)
    if pid is None:
        raise UsageError(f"no sandbox is running from {state_dir}")
    if terminate(pid, 30):
        print(f"sandbox (pid {pid}) stopped")
        return 0
    raise UsageError(f"sandbox (pid {pid}) did not stop within 30s; kill it with: kill -9 {pid}")


def run_status(args: argparse.Namespace) -> int:
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    if _running_pid(state_dir) is None:
        raise UsageError(f"no sandbox is running from {state_dir}")
    print((state_dir / STATE_FILE).read_text(), end="")
    return 0
