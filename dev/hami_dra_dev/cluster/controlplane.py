"""The control plane alone: etcd and kube-apiserver as unprivileged processes, for integration tests.

    with ControlPlane.start(Path(tempfile.mkdtemp())) as plane:
        client = plane.api_client()      # admin (system:masters), over TLS on 127.0.0.1
        ...

The same binaries, certificates, flags, feature gates and runtime-config as the full local cluster
(:mod:`hami_dra_dev.cluster.localcluster`, through :mod:`configs`), so what the tests see is what the
real cluster serves; what differs is only what needs root or fixed ports: kube-apiserver listens on
the loopback, and every port is one the kernel handed out at start (another cluster, e.g. a CI run's,
may hold the usual ones). No kubelet, containerd, controller-manager or scheduler: nothing binds
pods, creates claims from templates or deletes namespaces.
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
LOOPBACK = "127.0.0.1"
#: Attempts at a start whose ports another process took between our choice and the bind.
_PORT_ATTEMPTS = 3


def control_plane_toolchain(kubernetes_version: str | None = None) -> Toolchain:
    """The built toolchain, or :class:`MissingBinaries` naming the build command; unlike
    ``require_toolchain`` only etcd and kube-apiserver must exist (no node components)."""
    tools = expected_toolchain(kubernetes_version)
    missing = [str(tools.path(p)) for p in PROGRAMS if not os.access(tools.path(p), os.X_OK)]
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

    def __init__(self, root: Path, tools: Toolchain, pki_dir: Path | None = None) -> None:
        etcd_client, etcd_peer, apiserver = free_ports(3)
        ports = Ports(etcd_client=etcd_client, etcd_peer=etcd_peer, apiserver=apiserver)
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
    ) -> ControlPlane:
        """A running control plane; a start that lost a port race is tried again on new ports.
        ``pki_dir``: certificates to reuse (default: new ones under ``root``)."""
        tools = tools or control_plane_toolchain()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            plane = cls(root / f"attempt-{attempt}", tools, pki_dir)
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
        self.started_in = time.monotonic() - started

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
        """Stop kube-apiserver, then etcd; idempotent."""
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
