"""The control plane alone: etcd and kube-apiserver as unprivileged processes, for integration tests.

    with ControlPlane.start(Path(tempfile.mkdtemp())) as plane:
        client = plane.api_client()      # admin (system:masters), over TLS on 127.0.0.1
        ...

The same binaries, certificates, flags, feature gates and runtime-config as the full local cluster
(:mod:`hami_dra_dev.cluster.localcluster`, through :mod:`configs`), so what the tests see is what the
real cluster serves; what differs is only what needs root or fixed ports: kube-apiserver listens on
the loopback, and every port is one the kernel handed out at start (another cluster, e.g. a CI run's,
may hold the usual ones). No kubelet or containerd: nothing runs a pod.

By default neither kube-controller-manager nor kube-scheduler runs either: nothing binds pods,
creates claims from templates or deletes namespaces. ``controllers=True`` starts both, with the
identities and flags of the full cluster, for tests of our controller against the real scheduler
and claim controller (nodes are then Node objects kept Ready by ``fakenodes.FakeNodes``).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from hami_dra_dev.cluster import configs
from hami_dra_dev.cluster.binaries import (
    MissingBinaries,
    Toolchain,
    build_command,
    cache_dir,
    expected_toolchain,
)
from hami_dra_dev.cluster.layout import Layout, Ports
from hami_dra_dev.cluster.pki import ClusterPki
from hami_dra_dev.cluster.processes import ComponentFailed, HostProcess, Probe

#: The programs this control plane runs (a subset of binaries.REQUIRED).
PROGRAMS = ("etcd", "kube-apiserver")
#: What ``controllers=True`` adds.
CONTROLLER_PROGRAMS = ("kube-controller-manager", "kube-scheduler")
LOOPBACK = "127.0.0.1"
#: Attempts at a start whose ports another process took between our choice and the bind.
_PORT_ATTEMPTS = 3


def control_plane_toolchain(kubernetes_version: str | None = None, *, controllers: bool = False) -> Toolchain:
    """The built toolchain, or :class:`MissingBinaries` naming the build command; unlike
    ``require_toolchain`` only etcd and kube-apiserver must exist (no node components), and
    kube-controller-manager and kube-scheduler with ``controllers``."""
    tools = expected_toolchain(kubernetes_version)
    programs = PROGRAMS + (CONTROLLER_PROGRAMS if controllers else ())
    missing = [str(tools.path(p)) for p in programs if not os.access(tools.path(p), os.X_OK)]
    if missing:
        raise MissingBinaries(f"not built: {', '.join(missing)}; run: {build_command(kubernetes_version)}")
    return tools


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the kernel picks (bind to port 0), released for the components to
    take: a small race with other programs, which :meth:`ControlPlane.start` retries."""
    sockets = [socket.create_server((LOOPBACK, 0)) for _ in range(count)]
    try:
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def default_pki_dir() -> Path:
    """Where test runs keep the control plane's certificates: making them (seven RSA keys) is a
    third of a start on a small machine, and they stay valid across runs (ClusterPki re-issues one
    whose request changed)."""
    return cache_dir() / "control-plane" / "pki"


@contextmanager
def _pki_lock(directory: Path) -> Iterator[ClusterPki]:
    """The PKI in ``directory``, held exclusively: runs side by side share it (a CI run and a
    developer's), and must not both write a half-made key."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield ClusterPki(directory)


class ControlPlane:
    """etcd and kube-apiserver under ``root`` (data, logs, kubeconfig; certificates in ``pki_dir``),
    stopped by :meth:`stop` or on leaving the ``with`` block; the children also die with this process."""

    def __init__(
        self, root: Path, tools: Toolchain, pki_dir: Path | None = None, *, controllers: bool = False
    ) -> None:
        etcd_client, etcd_peer, apiserver, controller_manager, scheduler = free_ports(5)
        ports = Ports(
            etcd_client=etcd_client,
            etcd_peer=etcd_peer,
            apiserver=apiserver,
            controller_manager=controller_manager,
            scheduler=scheduler,
        )
        self.controllers = controllers
        self.root = root
        self.layout = Layout(root, ports, apiserver_address=LOOPBACK)
        self.pki_dir = pki_dir or self.layout.pki
        self.tools = tools
        self.components: list[HostProcess] = []
        self.started_in = 0.0

    @classmethod
    def start(
        cls,
        root: Path,
        tools: Toolchain | None = None,
        *,
        pki_dir: Path | None = None,
        timeout: float = 120.0,
        controllers: bool = False,
    ) -> ControlPlane:
        """A running control plane; a start that lost a port race is tried again on new ports.
        ``pki_dir``: certificates to reuse (default: new ones under ``root``); ``controllers``:
        kube-controller-manager and kube-scheduler too."""
        tools = tools or control_plane_toolchain(controllers=controllers)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            plane = cls(root / f"attempt-{attempt}", tools, pki_dir, controllers=controllers)
            try:
                plane._start(timeout)
                return plane
            except ComponentFailed as err:
                plane.stop()
                if "address already in use" not in str(err) or attempt == _PORT_ATTEMPTS:
                    raise
            except BaseException:
                plane.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, timeout: float) -> None:
        started = time.monotonic()
        layout, tools = self.layout, self.tools
        layout.root.mkdir(parents=True, exist_ok=True)
        with _pki_lock(self.pki_dir) as pki:
            admin = pki.issue("admin", "kubernetes-admin", organization="system:masters")
            configs.kubeconfig(layout.admin_kubeconfig, layout, pki, admin, "admin")
            apiserver_args = configs.apiserver_args(tools, layout, pki)
            if self.controllers:
                # The identities the default RBAC policy binds, as kubeadm issues them.
                kcm = pki.issue("controller-manager", "system:kube-controller-manager")
                kcm_config = configs.kubeconfig(
                    layout.kubeconfig("controller-manager"),
                    layout,
                    pki,
                    kcm,
                    "system:kube-controller-manager",
                )
                scheduler = pki.issue("scheduler", "system:kube-scheduler")
                scheduler_config = configs.kubeconfig(
                    layout.kubeconfig("scheduler"), layout, pki, scheduler, "system:kube-scheduler"
                )
                kcm_args = configs.controller_manager_args(tools, layout, pki, kcm_config)
                scheduler_args = configs.scheduler_args(tools, layout, scheduler_config)
        self._run(
            "etcd",
            configs.etcd_args(tools, layout),
            Probe(f"http://{LOOPBACK}:{layout.ports.etcd_client}/health"),
            timeout,
        )
        self._run(
            "kube-apiserver",
            apiserver_args,
            Probe(f"{layout.server_url}/readyz", str(admin.cert), str(admin.key)),
            timeout,
        )
        if self.controllers:
            ports = layout.ports
            self._run(
                "kube-controller-manager",
                kcm_args,
                Probe(f"https://{LOOPBACK}:{ports.controller_manager}/healthz"),
                timeout,
            )
            self._run(
                "kube-scheduler",
                scheduler_args,
                Probe(f"https://{LOOPBACK}:{ports.scheduler}/healthz"),
                timeout,
            )
            self._wait_default_service_account(timeout)
        self.started_in = time.monotonic() - started

    def _wait_default_service_account(self, timeout: float) -> None:
        """kube-controller-manager creates ``default/default`` shortly after start; pods need it
        (the ServiceAccount admission plugin refuses a pod whose account does not exist)."""
        from kubernetes import client

        api_client = self.api_client()
        try:
            core: Any = client.CoreV1Api(api_client)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    core.read_namespaced_service_account("default", "default")
                    return
                except client.exceptions.ApiException:
                    time.sleep(0.2)
        finally:
            api_client.close()
        raise ComponentFailed(
            f"no default/default ServiceAccount within {timeout:.0f}s; see {self.layout.logs}"
        )

    def _run(self, name: str, args: list[str], probe: Probe, timeout: float) -> None:
        process = HostProcess(name, args, self.layout.logs, probe=probe)
        self.components.append(process)
        process.wait_ready(timeout)

    @property
    def kubeconfig_path(self) -> Path:
        """An admin kubeconfig (client certificate in system:masters) for clients and kubectl."""
        return self.layout.admin_kubeconfig

    @property
    def server_url(self) -> str:
        return self.layout.server_url

    def user_kubeconfig(self, user: str, group: str | None = None) -> Path:
        """A kubeconfig for ``user`` (in ``group``) with a client certificate of the cluster's CA:
        an identity RBAC knows by name, for tests of what a tenant may and may not read. Issued
        under ``root`` (a copy of the CA signs it), so a shared ``pki_dir`` does not collect them."""
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", user)
        users = self.root / "users"
        if not (users / "ca.key").exists():
            users.mkdir(parents=True, exist_ok=True)
            with _pki_lock(self.pki_dir) as shared:
                shutil.copy2(shared.ca.cert, users / "ca.crt")
                shutil.copy2(shared.ca.key, users / "ca.key")
        pki = ClusterPki(users)
        pair = pki.issue(name, user, organization=group)
        return configs.kubeconfig(self.layout.kubeconfig(f"user-{name}"), self.layout, pki, pair, user)

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the admin; the caller closes it."""
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        return new_client(str(self.kubeconfig_path))

    def stop(self) -> None:
        """Stop the components in the reverse order of their start (etcd last); idempotent."""
        for process in reversed(self.components):
            process.stop()
        self.components.clear()

    def remove(self) -> None:
        """Kill (no graceful shutdown: nothing is kept), then delete the state directory (data, logs)."""
        for process in self.components:
            if process.alive():
                process.process.kill()
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.remove()
