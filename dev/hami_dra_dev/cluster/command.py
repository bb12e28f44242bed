"""``hami-dra cluster build|up|down|status``: a real single-node Kubernetes cluster on this machine.

``up`` builds what is missing (``hack/cluster/build.sh``), starts the cluster and (unless
``--no-driver``) the driver, prints ``kubeconfig: <path>`` and runs in the foreground until
``hami-dra cluster down`` or Ctrl-C, then stops everything it started. Development tool only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from dra_driver.cli import CHILD_ENTRY, UsageError
from hami_dra_dev.pidfile import alive, running_pid, terminate


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="run a real single-node Kubernetes cluster with the driver (development and tests only)",
        description="Upstream kube-apiserver, controller-manager, scheduler, kubelet, etcd and containerd, "
        "built once from their Go modules, run as local processes.",
    )
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True
    from hami_dra_dev.cluster.layout import default_state_dir

    def state_dir_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", type=Path, default=None, help=f"default: {default_state_dir()}")

    def version_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--kubernetes-version",
            default=os.environ.get("KUBERNETES_VERSION") or None,
            help="upstream version, e.g. 1.34.4 (env KUBERNETES_VERSION; default: hack/cluster/versions.env)",
        )

    build = sub.add_parser("build", help="build the upstream binaries into the cache (once per version)")
    version_option(build)
    build.set_defaults(handler=run_build)
    up = sub.add_parser("up", help="start the cluster and run until 'down' or Ctrl-C")
    version_option(up)
    up.add_argument("--profile", default="t4", help="simulated GPU profile (default t4)")
    up.add_argument("--gpus", type=int, default=4, help="simulated GPUs (default 4)")
    up.add_argument(
        "--no-driver", action="store_true", help="only the cluster: no plugin, controller, webhook"
    )
    up.add_argument(
        "--supervise",
        action="store_true",
        help="restart a component that exits, as a node's systemd would (default: stop the cluster)",
    )
    up.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    state_dir_option(up)
    up.set_defaults(handler=run_up)
    down = sub.add_parser("down", help="stop a running cluster")
    state_dir_option(down)
    down.set_defaults(handler=run_down)
    lab = sub.add_parser(
        "lab", help="run the worked example's lab on the cluster and check it (exit 1 on a mismatch)"
    )
    lab.add_argument("--up", action="store_true", help="start a cluster for the lab when none runs")
    version_option(lab)
    state_dir_option(lab)
    lab.set_defaults(handler=run_lab)
    status = sub.add_parser("status", help="one line per component: name, pid, ready")
    state_dir_option(status)
    status.set_defaults(handler=run_status)


def _state_dir(args: argparse.Namespace) -> Path:
    from hami_dra_dev.cluster.layout import default_state_dir

    return Path(args.state_dir or default_state_dir()).resolve()


def _running_pid(state_dir: Path) -> int | None:
    from hami_dra_dev.cluster.layout import Layout

    return running_pid(Layout(state_dir).pid_file)


def run_build(args: argparse.Namespace) -> int:
    from hami_dra_dev.cluster.binaries import MissingBinaries, build, nvidia_toolkit_bin

    try:
        toolchain = build(args.kubernetes_version)
    except (MissingBinaries, KeyError) as err:
        raise UsageError(str(err)) from None
    for component, directory in toolchain.dirs.items():
        print(f"{component}: {directory}")
    print(f"nvidia-container-toolkit: {nvidia_toolkit_bin()}")
    return 0


def _component_entries(components: list[Any]) -> list[dict[str, Any]]:
    """Name, pid and readiness probe of each running component, as `cluster status` reads them."""
    return [
        {"name": p.name, "pid": p.pid, "probe": p.probe.as_dict() if p.probe else None} for p in components
    ]


def _write_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically (rename), so `cluster status` and the fault tests never read a half-written file
    while the supervisor records a restarted component's pid."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(partial, path)


def run_up(args: argparse.Namespace) -> int:
    from hami_dra_dev.cluster.binaries import MissingBinaries, build, require_toolchain
    from hami_dra_dev.cluster.driver import DriverOptions, start_driver
    from hami_dra_dev.cluster.images import ImageError
    from hami_dra_dev.cluster.layout import Layout
    from hami_dra_dev.cluster.localcluster import LocalCluster, PreflightError
    from hami_dra_dev.cluster.pki import PkiError
    from hami_dra_dev.cluster.processes import ComponentFailed, HostProcess

    if not 1 <= args.gpus <= 16:
        raise UsageError("--gpus must be between 1 and 16")
    if not args.no_driver:
        from dra_driver.devices.simulated import PROFILES

        if args.profile not in PROFILES:
            raise UsageError(f"unknown --profile {args.profile!r}; choose one of: {', '.join(PROFILES)}")
    layout = Layout(_state_dir(args))
    pid = _running_pid(layout.root)
    if pid is not None:
        raise UsageError(
            f"a cluster is already running from {layout.root} (pid {pid}); run 'hami-dra cluster down'"
        )
    try:
        toolchain = (
            require_toolchain(args.kubernetes_version) if args.no_build else build(args.kubernetes_version)
        )
    except (MissingBinaries, KeyError) as err:
        raise UsageError(str(err)) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = LocalCluster(layout, toolchain, on_progress=lambda m: print(m, flush=True))
    driver: list[HostProcess] = []
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.pid_file.write_text(f"{os.getpid()}\n")
    try:
        try:
            cluster.start()
            if not args.no_driver:
                assert cluster.pki is not None
                options = DriverOptions(profile=args.profile, gpus=args.gpus)
                driver = start_driver(layout, cluster.pki, cluster.api_client(), options)
                print(f"driver ready: {', '.join(f'{p.name} (pid {p.pid})' for p in driver)}", flush=True)
        except (PreflightError, ComponentFailed, ImageError, PkiError) as err:
            raise UsageError(str(err)) from None
        components = [*cluster.components, *driver]
        state = {
            "pid": os.getpid(),
            "kubernetes_version": toolchain.kubernetes_version,
            "kubeconfig": str(layout.admin_kubeconfig),
            "server": layout.server_url,
            "driver": not args.no_driver,
            "logs": str(layout.logs),
            "components": _component_entries(components),
        }
        _write_state(layout.state_file, state)
        print(f"kubeconfig: {layout.admin_kubeconfig}")
        print(f"try: kubectl --kubeconfig {layout.admin_kubeconfig} get resourceslices")
        print(f"  (kubectl: {toolchain.path('kubectl')})")
        print("stop with: hami-dra cluster down (or Ctrl-C)", flush=True)
        while not stop.wait(0.5):
            dead = [p for p in components if not p.alive()]
            if dead and args.supervise:
                # As systemd (Restart=always) does for a node's daemons; the fault tests rely on it.
                for process in dead:
                    print(f"{process.name} exited (status {process.process.returncode}); restarting",
                          file=sys.stderr, flush=True)  # fmt: skip
                    process.restart()
                state["components"] = _component_entries(components)
                _write_state(layout.state_file, state)
            elif dead:
                print(f"{dead[0].name} exited (status {dead[0].process.returncode}); see {dead[0].log_path}",
                      file=sys.stderr, flush=True)  # fmt: skip
                return 1
    finally:
        for process in reversed(driver):
            process.stop()
        problems = cluster.stop()
        for problem in problems:
            print(f"cluster down: {problem}", file=sys.stderr)
        for path in (layout.state_file, layout.pid_file):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return 0


def run_down(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    pid = _running_pid(state_dir)
    if pid is None:
        raise UsageError(f"no cluster is running from {state_dir}")
    if terminate(pid, 90):
        print(f"cluster (pid {pid}) stopped")
        return 0
    raise UsageError(f"cluster (pid {pid}) did not stop within 90s; kill it with: kill -9 {pid}")


def run_status(args: argparse.Namespace) -> int:
    from hami_dra_dev.cluster.layout import Layout
    from hami_dra_dev.cluster.processes import Probe

    layout = Layout(_state_dir(args))
    if _running_pid(layout.root) is None:
        raise UsageError(f"no cluster is running from {layout.root}")
    try:
        state = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"the cluster in {layout.root} is still starting (no {layout.state_file.name} yet)"
        ) from None
    all_ready = True
    for component in state["components"]:
        is_alive = alive(int(component["pid"]))
        probe = component.get("probe")
        ready = is_alive and (probe is None or Probe(**probe).ok())
        all_ready = all_ready and ready
        word = "ready" if ready else "not ready" if is_alive else "exited"
        print(f"{component['name']:<24} pid {component['pid']:<8} {word}")
    return 0 if all_ready else 1


def _start_in_background(args: argparse.Namespace, state_dir: Path) -> subprocess.Popen[str]:
    """``hami-dra cluster up`` as a child, returned once it printed its kubeconfig line."""
    command = [sys.executable, "-c", CHILD_ENTRY, "cluster", "up", "--state-dir", str(state_dir)]
    if args.kubernetes_version:
        command += ["--kubernetes-version", args.kubernetes_version]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        if line.startswith("kubeconfig: "):
            # Keep reading, so the cluster never blocks on a full pipe while the lab runs.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process
    process.wait()
    raise UsageError(f"hami-dra cluster up failed (exit status {process.returncode}; its output is above)")


def run_lab(args: argparse.Namespace) -> int:
    from hami_dra_dev.cluster.binaries import MissingBinaries, require_toolchain
    from hami_dra_dev.cluster.lab import Lab
    from hami_dra_dev.cluster.layout import Layout
    from hami_dra_dev.demo import render

    layout = Layout(_state_dir(args))
    started: subprocess.Popen[str] | None = None
    if _running_pid(layout.root) is None:
        if not args.up:
            raise UsageError(
                f"no cluster is running from {layout.root}; start one with 'hami-dra cluster up' or pass --up"
            )
        started = _start_in_background(args, layout.root)
    try:
        state = json.loads(layout.state_file.read_text())
        if not state.get("driver"):
            raise UsageError("the cluster runs without the driver (--no-driver); the lab needs it")
        try:
            toolchain = require_toolchain(state["kubernetes_version"])
        except MissingBinaries as err:
            raise UsageError(str(err)) from None
        console = render.make_console()
        checks = Lab(layout, toolchain.path("kubectl"), console).run()
        console.print(render.checks_table(checks.items))
        return 0 if checks.passed else 1
    finally:
        if started is not None:
            started.send_signal(signal.SIGTERM)
            started.wait(120)
