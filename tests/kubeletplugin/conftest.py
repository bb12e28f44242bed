"""Fixtures: the node's room on the real API server, the plugin in-process with simulated GPUs, and
kubelet's client.

The plugin's tests run on the shared kube-apiserver (tests/apiserver_fixtures.py) as node
``node-1`` of driver ``gpu.hami.io`` with their claims and pods in ``default``: the names the
plugin's own builders and messages use. That room is theirs while one of them runs: emptied before
and after each (``clear_node_room``), so each test finds the fresh, empty node a new server gave.
API faults (``faults``) are injected on the test's client (tests/client_faults.py), which the
plugin and the kubelet simulator under test use.

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
from dra_driver.kube.api import NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginOptions
from hami_dra_dev.cluster.controlplane import ControlPlane
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from tests.client_faults import ClientFaults
from tests.kubeletplugin.helpers import DRIVER
from tests.kubeletplugin.upstream import REPO_ROOT, UPSTREAM_KUBELET

UPSTREAM_KUBELET_PROTO = UPSTREAM_KUBELET / "pkg" / "apis" / "dra" / "v1" / "api.proto"

NODE = "node-1"
NAMESPACE = "default"


@pytest.fixture(scope="session")
def protocol() -> KubeletProtocol:
    """kubelet's message classes: upstream's protos where present, else ours (same contract)."""
    if UPSTREAM_KUBELET_PROTO.is_file():
        return KubeletProtocol.compile(UPSTREAM_KUBELET)
    return KubeletProtocol.own(REPO_ROOT)


def clear_node_room(kube: Kube) -> None:
    """Remove what a test of the node left on the shared server: the pods bound to ``node-1``, the
    claims of ``default``, the events about the node, its ResourceSlices (every driver's), the
    Node. Pods go at once: no kubelet confirms their end."""
    namespace = f"/api/v1/namespaces/{NAMESPACE}"
    on_node = {"fieldSelector": f"spec.nodeName={NODE}"}
    kube.request("DELETE", PODS.path(NAMESPACE), {"gracePeriodSeconds": 0}, query=on_node)
    kube.request("DELETE", RESOURCE_CLAIMS.path(NAMESPACE))
    about_node = {"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={NODE}"}
    kube.request("DELETE", f"{namespace}/events", query=about_node)
    kube.request("DELETE", RESOURCE_SLICES.path(None), query=on_node)
    try:
        kube.delete(NODES, None, NODE)
    except KubeError as err:
        if not err.not_found:
            raise


@pytest.fixture
def node_room(apiserver: ControlPlane) -> Iterator[ControlPlane]:
    """The node's room on the shared server, empty but for the Node object (its bare form, as
    a kubelet creates it) and ``default``'s ServiceAccount (pods need it; no
    kube-controller-manager runs to make it)."""
    client = apiserver.api_client()
    kube = Kube(client)
    try:
        clear_node_room(kube)
        try:
            account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
            kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", account)
        except KubeError as err:
            if not err.conflict:
                raise
        kube.create(NODES, None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield apiserver
        clear_node_room(kube)
    finally:
        client.close()


@pytest.fixture
def api_client(node_room: ControlPlane) -> Iterator[Any]:
    """The client the test, its plugin and its kubelet use (``faults`` attach to it)."""
    client = node_room.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def faults(api_client: Any) -> ClientFaults:
    """API faults on ``api_client``'s requests: the test's, its plugin's and its kubelet's."""
    faults = ClientFaults()
    faults.attach_client(api_client)
    return faults


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
