"""Every path and port of one local cluster, derived from its state directory.

Paths stay short (unix socket paths are limited to 107 bytes) and all live under the state
directory, except what the container runtime reads from fixed places: the CDI spec directories
``/etc/cdi`` and ``/var/run/cdi``, which our kubelet plugin writes as it does on a real node.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "hami-dra-node"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
#: The dynamic (transient) CDI directory our kubelet plugin writes into.
CDI_DIR = CDI_DIRS[1]
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.88.0.0/16"
BRIDGE = "hamidra0"
#: kubelet refuses a loopback node IP, and the machine's own address differs from machine to
#: machine, so the node gets a private address of its own, added to ``lo`` (these kernels have
#: no dummy interface module).
NODE_LINK = "lo"
NODE_IP = "10.87.255.1"
#: Images imported into containerd under the names our examples use.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"hami-dra-cluster-{os.getuid()}"


@dataclass(frozen=True)
class Ports:
    etcd_client: int = 2379
    etcd_peer: int = 2380
    apiserver: int = 6443
    controller_manager: int = 10257
    scheduler: int = 10259
    kubelet: int = 10250
    kubelet_healthz: int = 10248
    kube_proxy_healthz: int = 10256
    kube_proxy_metrics: int = 10249


@dataclass(frozen=True)
class Layout:
    root: Path
    ports: Ports = Ports()
    #: Where kube-apiserver listens: the node address for a full cluster (pods reach it there), the
    #: loopback for the control plane alone (hami_dra_dev.cluster.controlplane: no root, no ``lo`` address).
    apiserver_address: str = NODE_IP

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's ``config_path``: ``<host:port>/hosts.toml`` here says how to reach a registry
        (its CA, plain HTTP); read at each pull, so a registry can be added to a running cluster."""
        return self.root / "containerd" / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def plugins_registry(self) -> Path:
        """Where the real kubelet's plugin watcher looks for registration sockets."""
        return self.kubelet_root / "plugins_registry"

    def plugin_dir(self, driver: str) -> Path:
        return self.kubelet_root / "plugins" / driver

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def driver_dir(self) -> Path:
        return self.root / "driver"

    def kubeconfig(self, user: str) -> Path:
        return self.root / f"{user}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "cluster.pid"

    @property
    def fresh_each_start(self) -> tuple[Path, ...]:
        """State that `cluster up` removes before it starts: data, node state, logs."""
        return (self.etcd_data, self.root / "containerd", self.root / "cni", self.kubelet_root,
                self.logs, self.driver_dir)  # fmt: skip

    @property
    def server_url(self) -> str:
        return f"https://{self.apiserver_address}:{self.ports.apiserver}"
