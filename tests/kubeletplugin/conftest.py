"""Fixtures: a sandbox API server, the plugin in-process with simulated GPUs, and kubelet's client.

kubelet's client is compiled from the upstream protos when ``../shared`` is beside the repository
(an independent copy of the wire contract), else from the project's own ``api/kubelet`` protos, so
the behaviour tests run in every clone; ``test_protos.py`` proves the two contracts equal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginOptions
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from hami_dra_dev.sandbox.server import SandboxServer
from tests.kubeletplugin.helpers import DRIVER
from tests.kubeletplugin.upstream import REPO_ROOT, UPSTREAM_KUBELET

UPSTREAM_KUBELET_PROTO = UPSTREAM_KUBELET / "pkg" / "apis" / "dra" / "v1" / "api.proto"

NODE = "node-1"


@pytest.fixture(scope="session")
def protocol() -> KubeletProtocol:
    """kubelet's message classes: upstream's protos where present, else ours (same contract)."""
    if UPSTREAM_KUBELET_PROTO.is_file():
        return KubeletProtocol.compile(UPSTREAM_KUBELET)
    return KubeletProtocol.own(REPO_ROOT)


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    server = SandboxServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_client(sandbox: SandboxServer) -> Any:
    client = sandbox.api_client()
    from kubernetes import client as k8s

    k8s.CoreV1Api(client).create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return client


@dataclass
class Dirs:
    root: Path
    plugin: Path
    registry: Path
    cdi: Path
    boot_id: Path
    health: Path


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    return Dirs(
        tmp_path, tmp_path / "plugin", tmp_path / "registry", tmp_path / "cdi", boot, tmp_path / "health.yaml"
    )


def plugin_options(dirs: Dirs, **overrides: Any) -> PluginOptions:
    values: dict[str, Any] = {
        "node_name": NODE,
        "driver_name": DRIVER,
        "plugin_dir": dirs.plugin,
        "registry_dir": dirs.registry,
        "cdi_dir": dirs.cdi,
        "simulated": True,
        "boot_id_file": dirs.boot_id,
        "health_file": dirs.health,
        "publish": False,
        "cleanup_seconds": 3600.0,
    }
    values.update(overrides)
    return PluginOptions(**values)


@contextmanager
def running_plugin(dirs: Dirs, api_client: Any, **overrides: Any) -> Iterator[KubeletPlugin]:
    """The plugin on four simulated T4s with ``plugin_options(dirs, **overrides)``, stopped on exit."""
    running = KubeletPlugin(
        plugin_options(dirs, **overrides), profile_gpus("t4", node_name=NODE, gpus=4), api_client
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def registered_kubelet(plugin: KubeletPlugin, protocol: KubeletProtocol) -> Iterator[PluginClient]:
    """kubelet's client, registered with ``plugin``."""
    client = PluginClient(protocol, plugin.servers.registration_socket)
    client.register()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def plugin(dirs: Dirs, api_client: Any) -> Iterator[KubeletPlugin]:
    with running_plugin(dirs, api_client) as running:
        yield running


@pytest.fixture
def kubelet(plugin: KubeletPlugin, protocol: KubeletProtocol) -> Iterator[PluginClient]:
    with registered_kubelet(plugin, protocol) as client:
        yield client


def create_claim(api_client: Any, claim: dict[str, Any], reserved_for: str | None = None) -> dict[str, Any]:
    """Create a ResourceClaim and write its allocation through the status subresource (UID kept)."""
    from kubernetes import client as k8s

    api = k8s.ResourceV1Api(api_client)
    body = {k: v for k, v in claim.items() if k != "status"}
    body["metadata"] = {k: v for k, v in claim["metadata"].items() if k != "uid"}
    created = json.loads(
        api.create_namespaced_resource_claim(body["metadata"]["namespace"], body, _preload_content=False).data
    )
    status = dict(claim.get("status") or {})
    if reserved_for:
        status["reservedFor"] = [
            {"resource": "pods", "name": reserved_for, "uid": "00000000-0000-0000-0000-00000000000a"}
        ]
    created["status"] = status
    updated: dict[str, Any] = json.loads(
        api.replace_namespaced_resource_claim_status(
            created["metadata"]["name"], created["metadata"]["namespace"], created, _preload_content=False
        ).data
    )
    return updated


def ref(claim: dict[str, Any]) -> dict[str, str]:
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
