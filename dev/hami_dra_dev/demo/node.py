"""The lab node: the sandbox's kubelet simulator driving the REAL kubelet plugin with simulated GPUs.

The plugin runs in-process exactly as ``hami-dra kubelet-plugin --source simulated --profile t4
--gpus 4`` would (same ``KubeletPlugin`` and options), with its plugin, registry and CDI
directories inside the sandbox's node directory, so nothing is written outside a temp dir.
kubelet's side is built from the plugin's own compiled protos: the demo needs no protoc and no
copy of the upstream sources (the tests use an independently compiled client instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin import protos
from dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginOptions
from hami_dra_dev.kubelet import KubeletProtocol, KubeletSimulator
from hami_dra_dev.sandbox.cluster import NodeContext


def kubelet_protocol() -> KubeletProtocol:
    """kubelet's message classes from the descriptors already compiled into ``kubeletplugin.gen``."""
    file_set = descriptor_pb2.FileDescriptorSet()
    for module in (protos.registration_v1, protos.dra_v1, protos.dra_v1beta1, protos.health_v1alpha1):
        module.DESCRIPTOR.CopyToProto(file_set.file.add())
    return KubeletProtocol(file_set.SerializeToString())


class LabNode:
    """One node's kubelet simulator plus the kubelet plugin; ``stop()`` stops both, plugin first."""

    def __init__(self, ctx: NodeContext, driver: str, profile: str, gpus: int) -> None:
        self.ctx = ctx
        self.driver = driver
        self._clients: list[Any] = []
        boot_id = ctx.root / "boot_id"
        boot_id.write_text("hami-dra-demo\n")
        self.kubelet = KubeletSimulator(
            ctx.name, ctx.registry_dir, self._client(), kubelet_protocol(), interval=0.05
        )
        self.kubelet.start()  # wipes the node's slices first, as kubelet does at start-up
        options = PluginOptions(
            node_name=ctx.name,
            driver_name=driver,
            plugin_dir=ctx.plugins_dir / driver,
            registry_dir=ctx.registry_dir,
            cdi_dir=ctx.cdi_dir,
            simulated=True,
            boot_id_file=boot_id,
            cleanup_seconds=3600.0,
        )
        self.plugin = KubeletPlugin(
            options, profile_gpus(profile, node_name=ctx.name, gpus=gpus), self._client()
        )
        try:
            self.plugin.start()
        except BaseException:
            self.kubelet.stop()
            self._close_clients()
            raise

    def _client(self) -> Any:
        client = self.ctx.server.api_client()
        self._clients.append(client)
        return client

    @property
    def cdi_dir(self) -> Path:
        return self.ctx.cdi_dir

    def registered(self) -> bool:
        return self.driver in self.kubelet.plugins

    def stop(self) -> None:
        try:
            self.plugin.stop()
        finally:
            self.kubelet.stop()
            self._close_clients()

    def _close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
