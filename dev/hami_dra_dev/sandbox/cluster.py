"""``SandboxCluster``: the API server plus simulated nodes and control-plane parts.

    with SandboxServer.start() as server, SandboxCluster(server, nodes=2) as cluster:
        ...  # Node objects exist, template claims get created, allocated pods get scheduled

What runs: one Node object per node (Ready, schedulable), the resourceclaim controller
(:mod:`claimcontroller`) and the scheduler/binder (:mod:`scheduler`). Per node, an optional
``kubelet_factory(NodeContext)`` starts a kubelet simulator (``hami_dra_dev.kubelet``,
which registers plugins over their real sockets and prepares claims); ``NodeContext`` gives it
the node's name, the server and private plugin/registry/CDI directories. Like a real
kube-scheduler, the scheduler allocates unallocated claims of ungated pods itself (plain first fit,
:mod:`firstfit`, honouring device taints) unless ``first_fit=False`` or another ``allocator`` is
given. Anything else started beside the cluster (kubelet plugins, the controller, the webhook) is handed to
:meth:`SandboxCluster.add_component` so that :meth:`stop` stops it too.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from hami_dra_dev.sandbox.claimcontroller import ClaimController
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.firstfit import FirstFitAllocator
from hami_dra_dev.sandbox.resources import require
from hami_dra_dev.sandbox.scheduler import Allocator, Scheduler
from hami_dra_dev.sandbox.server import SandboxServer

NODES = require("", "v1", "nodes")


class Stoppable(Protocol):
    def stop(self) -> None: ...


@dataclass(frozen=True)
class NodeContext:
    """What a per-node component needs: the node, the API server, and the node's directories."""

    name: str
    server: SandboxServer
    root: Path

    @property
    def plugins_dir(self) -> Path:
        """``/var/lib/kubelet/plugins`` of this node (the driver's socket dir goes below it)."""
        return self.root / "var/lib/kubelet/plugins"

    @property
    def registry_dir(self) -> Path:
        """``/var/lib/kubelet/plugins_registry`` of this node (registration sockets)."""
        return self.root / "var/lib/kubelet/plugins_registry"

    @property
    def cdi_dir(self) -> Path:
        """``/var/run/cdi`` of this node (transient CDI specs)."""
        return self.root / "var/run/cdi"


KubeletFactory = Callable[[NodeContext], Stoppable]


def node_object(
    name: str, labels: dict[str, str] | None = None, kube_version: str = "1.36"
) -> dict[str, Any]:
    """A Ready, schedulable Node as a kubelet would register it."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "sandbox node is ready",
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "sandbox",
                "osImage": "hami-dra sandbox",
                "containerRuntimeVersion": "sandbox://0",
                "kubeletVersion": f"v{kube_version}.0-sandbox",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


class SandboxCluster:
    """See module docstring. ``nodes`` is a count (``node-1`` ...) or explicit names."""

    def __init__(
        self,
        server: SandboxServer,
        nodes: int | list[str] = 1,
        *,
        kubelet_factory: KubeletFactory | None = None,
        allocator: Allocator | None = None,
        first_fit: bool = True,
        resync: float = 1.0,
    ) -> None:
        self.server = server
        self.node_names = [f"node-{i + 1}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        self.kubelet_factory = kubelet_factory
        self.claim_controller = ClaimController(server.api, resync)
        if allocator is None and first_fit:
            allocator = FirstFitAllocator(server.api)
        self.scheduler = Scheduler(server.api, allocator, resync)
        self.kubelets: dict[str, Stoppable] = {}
        self._components: list[Stoppable] = []
        # Unix socket paths are limited to 108 bytes, so node roots live in a short temp dir;
        # <state dir>/nodes links to it so people can find the sockets and CDI specs.
        self.nodes_root = Path(tempfile.mkdtemp(prefix="hdra-", dir=_short_temp_dir()))
        link = self.server.state_dir / "nodes"
        if link.is_symlink() or not link.exists():
            link.unlink(missing_ok=True)
            link.symlink_to(self.nodes_root, target_is_directory=True)

    def node_context(self, name: str) -> NodeContext:
        root = self.nodes_root / name
        ctx = NodeContext(name, self.server, root)
        for d in (ctx.plugins_dir, ctx.registry_dir, ctx.cdi_dir):
            d.mkdir(parents=True, exist_ok=True)
        return ctx

    def start(self) -> SandboxCluster:
        for name in self.node_names:
            self.add_node(name)
        self.claim_controller.start()
        self.scheduler.start()
        return self

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> NodeContext:
        """Register a Node object and start its kubelet (if a factory was given)."""
        try:
            self.server.api.create(NODES, "", node_object(name, labels, self.server.kube_version))
        except ApiError as err:
            if err.code != 409:
                raise
        if name not in self.node_names:
            self.node_names.append(name)
        ctx = self.node_context(name)
        if self.kubelet_factory is not None and name not in self.kubelets:
            self.kubelets[name] = self.kubelet_factory(ctx)
        return ctx

    def add_component(self, component: Stoppable) -> None:
        """Something started beside the cluster (plugin, controller, webhook); :meth:`stop` stops it first."""
        self._components.append(component)

    def kick(self) -> None:
        """Make the simulated control plane run a pass now."""
        self.claim_controller.kick()
        self.scheduler.kick()

    def stop(self) -> None:
        for component in reversed(self._components):
            component.stop()
        self._components.clear()
        for kubelet in self.kubelets.values():
            kubelet.stop()
        self.kubelets.clear()
        self.scheduler.stop()
        self.claim_controller.stop()
        shutil.rmtree(self.nodes_root, ignore_errors=True)

    def __enter__(self) -> SandboxCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


#: Longest root that still leaves room for ``/<node>/plugins/<driver>/dra.sock`` under 108 bytes.
_MAX_ROOT_LENGTH = 48


def _short_temp_dir() -> str | None:
    """``$TMPDIR`` when it is short enough for unix sockets (macOS and pytest's are not), else /tmp."""
    default = tempfile.gettempdir()
    return None if len(default) <= _MAX_ROOT_LENGTH else "/tmp"
