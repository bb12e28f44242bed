"""Start and stop everything the demo runs: sandbox, lab node (kubelet + plugin), webhook, controller.

    with DemoStack.start() as stack:
        stack.api_client, stack.node.cdi_dir, stack.controller.recorder, stack.kubeconfig

Everything lives in the sandbox's temp dir (kubeconfig, node dirs, sockets, CDI specs) or in the
webhook's own temp dir; :meth:`DemoStack.stop` stops components in reverse order of start and
removes both dirs, also when start-up failed half way.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from dra_driver.controller.controller import api_connections
from dra_driver.kube.config import load_api_client
from hami_dra_dev.demo import manifests
from hami_dra_dev.demo.controller import DemoController
from hami_dra_dev.demo.node import LabNode
from hami_dra_dev.demo.webhook import DemoWebhook
from hami_dra_dev.sandbox.cluster import NodeContext, SandboxCluster
from hami_dra_dev.sandbox.server import SandboxServer


class DemoStack:
    """The running demo cluster. Use :meth:`start`; attributes are set once start-up succeeded."""

    def __init__(self, *, profile: str = manifests.PROFILE, gpus: int = manifests.GPU_COUNT) -> None:
        self.profile = profile
        self.gpus = gpus
        self.server: SandboxServer | None = None
        self.cluster: SandboxCluster | None = None
        self.webhook: DemoWebhook | None = None
        self.controller: DemoController | None = None
        self.api_client: Any = None
        self.lab_nodes: dict[str, LabNode] = {}

    @classmethod
    def start(cls, **kwargs: Any) -> DemoStack:
        stack = cls(**kwargs)
        try:
            stack._start()
        except BaseException:
            stack.stop()
            raise
        return stack

    def _lab_node(self, ctx: NodeContext) -> LabNode:
        node = LabNode(ctx, manifests.DRIVER, self.profile, self.gpus)
        self.lab_nodes[ctx.name] = node
        return node

    def _start(self) -> None:
        self.server = SandboxServer.start()
        self.api_client = self.server.api_client()
        # Assigned before start() so that stop() cleans up a node that failed half way.
        self.cluster = SandboxCluster(
            self.server, [manifests.NODE], kubelet_factory=self._lab_node, resync=0.2
        )
        self.cluster.start()
        self.webhook = DemoWebhook(self.server.api_client(), manifests.DRIVER)
        self.webhook.register()
        # The controller's client is sized as `hami-dra controller` sizes it: one connection per
        # informer's watch, writer and helper thread (else urllib3 warns on stderr, "Connection pool
        # is full", between the demo's tables).
        self.controller = DemoController(
            load_api_client(str(self.server.kubeconfig_path), connections=api_connections()), manifests.DRIVER
        )

    @property
    def node(self) -> LabNode:
        return self.lab_nodes[manifests.NODE]

    @property
    def kubeconfig(self) -> Path:
        assert self.server is not None
        return self.server.kubeconfig_path

    def stop(self) -> None:
        """Stop in reverse order; each step runs even if an earlier one failed."""
        cluster = self.cluster
        steps = [
            self.controller.stop if self.controller else None,
            self.webhook.stop if self.webhook else None,
            cluster.stop if cluster else None,
            self.api_client.close if self.api_client else None,
            self.server.stop if self.server else None,
        ]
        self.controller = self.webhook = self.cluster = self.api_client = None
        errors: list[BaseException] = []
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception as err:  # keep stopping the rest; report the first failure
                errors.append(err)
        self.server = None
        if errors:
            raise errors[0]

    def __enter__(self) -> DemoStack:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
