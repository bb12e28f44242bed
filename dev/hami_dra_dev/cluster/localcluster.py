"""Start and stop one real single-node cluster: the control plane, containerd, one kubelet.

    cluster = LocalCluster(layout, toolchain)
    cluster.start()          # returns once the node is Ready
    ...
    cluster.stop()           # stops everything it started, unmounts, removes the bridge

Components start in dependency order, each waited for before the next: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, containerd (then the local images), the kubelet,
kube-proxy.
``stop`` goes in reverse, also after a start that failed half way.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hami_dra_dev.cluster import cleanup, configs, images
from hami_dra_dev.cluster.binaries import Toolchain
from hami_dra_dev.cluster.layout import CDI_DIRS, NODE_NAME, Layout
from hami_dra_dev.cluster.pki import ClusterPki, KeyPair
from hami_dra_dev.cluster.processes import ComponentFailed, HostProcess, Probe

log = logging.getLogger(__name__)


class PreflightError(RuntimeError):
    """Something the machine lacks; the message says what to install or change."""


def find_runc() -> Path:
    for candidate in (shutil.which("runc"), "/usr/sbin/runc", "/usr/bin/runc"):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise PreflightError("runc not found; install Debian's runc (hack/install.d/podman.sh)")


def preflight() -> Path:
    if os.geteuid() != 0:
        raise PreflightError("the local cluster runs a kubelet and containerd, which need root")
    if shutil.which("ip") is None:
        raise PreflightError("the ip command is missing; install Debian's iproute2")
    return find_runc()


class LocalCluster:
    def __init__(
        self, layout: Layout, toolchain: Toolchain, *, on_progress: Callable[[str], None] | None = None
    ):
        self.layout = layout
        self.tools = toolchain
        self.components: list[HostProcess] = []
        self._progress = on_progress or (lambda message: log.info("%s", message))
        self.pki: ClusterPki | None = None
        self.admin: KeyPair | None = None

    # --- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        runc = preflight()
        problems = cleanup.clean(self.layout, self.tools.path("crictl"))
        if problems:
            raise PreflightError(f"a previous cluster in {self.layout.root} left: {'; '.join(problems)}")
        self.layout.root.mkdir(parents=True, exist_ok=True)
        # Every `up` is a fresh cluster (identities in pki/ and the built images are kept).
        for stale in self.layout.fresh_each_start:
            shutil.rmtree(stale, ignore_errors=True)
        for directory in CDI_DIRS:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._start(runc)
        except BaseException:
            self.stop()
            raise

    def _start(self, runc: Path) -> None:
        layout, tools = self.layout, self.tools
        started = time.monotonic()
        pki = self.pki = ClusterPki(layout.pki)
        admin = self.admin = pki.issue("admin", "kubernetes-admin", organization="system:masters")
        configs.kubeconfig(layout.admin_kubeconfig, layout, pki, admin, "admin")
        kcm = self._identity("controller-manager", "system:kube-controller-manager")
        scheduler = self._identity("scheduler", "system:kube-scheduler")
        kubelet = self._identity("kubelet", f"system:node:{NODE_NAME}", "system:nodes")
        # The identity the default RBAC policy binds to system:node-proxier.
        proxy = self._identity("kube-proxy", "system:kube-proxy")
        p = layout.ports
        # kube-apiserver serves on the node address, so it must exist before etcd even starts.
        try:
            cleanup.add_node_address()
        except OSError as err:
            raise PreflightError(str(err)) from err
        self._run(
            "etcd", configs.etcd_args(tools, layout), Probe(f"http://127.0.0.1:{p.etcd_client}/health"), 60
        )
        self._run(
            "kube-apiserver",
            configs.apiserver_args(tools, layout, pki),
            Probe(f"{layout.server_url}/readyz", str(admin.cert), str(admin.key)),
            120,
        )
        self._run(
            "kube-controller-manager",
            configs.controller_manager_args(tools, layout, pki, kcm),
            Probe(f"https://127.0.0.1:{p.controller_manager}/healthz"),
            60,
        )
        self._run(
            "kube-scheduler",
            configs.scheduler_args(tools, layout, scheduler),
            Probe(f"https://127.0.0.1:{p.scheduler}/healthz"),
            60,
        )
        configs.containerd_config(tools, layout, runc)
        configs.cni_config(layout)
        path = f"{tools.dirs['containerd']}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        containerd = HostProcess(
            "containerd",
            [str(tools.path("containerd")), "--config", str(layout.containerd_config)],
            layout.logs,
            env={**os.environ, "PATH": path},
            ready=layout.containerd_socket.exists,
        )
        self.components.append(containerd)
        containerd.wait_ready(60)
        self._progress("containerd ready; importing images (pause, busybox, the driver's if built)")
        images.import_images(tools.path("ctr"), layout.containerd_socket, layout.images)
        configs.kubelet_config(layout, pki)
        self._run(
            "kubelet",
            configs.kubelet_args(tools, layout, kubelet),
            Probe(f"http://127.0.0.1:{p.kubelet_healthz}/healthz"),
            120,
            env={**os.environ, "PATH": path},
        )
        self._wait_node_ready(120)
        # After the node exists: kube-proxy reads its Node object for the node's addresses.
        configs.kube_proxy_config(layout, proxy)
        self._run(
            "kube-proxy",
            configs.kube_proxy_args(tools, layout),
            Probe(f"http://127.0.0.1:{p.kube_proxy_healthz}/healthz"),
            60,
        )
        self._wait_default_service_account(60)
        self._progress(f"node {NODE_NAME} Ready ({time.monotonic() - started:.1f}s after start)")

    def _identity(self, name: str, user: str, group: str | None = None) -> Path:
        """A kubeconfig with a client certificate for ``user`` (in ``group``), as kubeadm issues them."""
        assert self.pki is not None
        pair = self.pki.issue(name, user, organization=group)
        return configs.kubeconfig(self.layout.kubeconfig(name), self.layout, self.pki, pair, user)

    def _run(
        self, name: str, args: list[str], probe: Probe, timeout: float, env: dict[str, str] | None = None
    ) -> HostProcess:
        process = HostProcess(name, args, self.layout.logs, probe=probe, env=env)
        self.components.append(process)
        process.wait_ready(timeout)
        self._progress(f"{name} ready (pid {process.pid})")
        return process

    def api_client(self) -> Any:
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        return new_client(str(self.layout.admin_kubeconfig))

    def _wait_node_ready(self, timeout: float) -> None:
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        last = "not registered yet"
        while time.monotonic() < deadline:
            for process in self.components:
                if not process.alive():
                    raise ComponentFailed(
                        f"{process.name} exited while waiting for the node; see {process.log_path}"
                    )
            try:
                node = core.read_node(NODE_NAME)
                ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
                if ready and ready[0].status == "True":
                    return
                last = f"Ready={ready[0].status}: {ready[0].message}" if ready else "no Ready condition yet"
            except Exception as err:
                last = str(err).splitlines()[0]
            time.sleep(0.5)
        raise ComponentFailed(
            f"node {NODE_NAME} not Ready within {timeout:.0f}s ({last}); see {self.layout.logs}"
        )

    def _wait_default_service_account(self, timeout: float) -> None:
        """kube-controller-manager creates ``default/default`` shortly after start; pods need it."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except Exception:
                time.sleep(0.2)
        raise ComponentFailed(
            f"no default/default ServiceAccount within {timeout:.0f}s; see the controller-manager log"
        )

    # --- stop ----------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop in reverse order; pods are removed while containerd still runs. Returns problems."""
        by_name = {p.name: p for p in self.components}
        kubelet = by_name.get("kubelet")
        if kubelet is not None:
            kubelet.stop()
        if "containerd" in by_name:
            cleanup.remove_pods(self.tools.path("crictl"), self.layout)
        for process in reversed(self.components):
            process.stop()
        self.components.clear()
        cleanup.remove_service_rules(self.tools.path("kube-proxy"))
        return cleanup.clean(self.layout, None)
