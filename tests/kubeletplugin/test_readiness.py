"""The plugin is ready (``/readyz`` 200, ``hami_dra_kubelet_plugin_ready`` 1) once kubelet has
registered it and its ResourceSlices are published: before that no pod can get this node's GPUs."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.server import SocketError
from tests.kubeletplugin.conftest import (
    NODE,
    Dirs,
    KubeletProtocol,
    plugin_options,
    registered_kubelet,
    running_plugin,
)
from tests.waiting import wait_for


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_ready_after_registration_and_publishing(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with running_plugin(dirs, api_client, publish=True, metrics_port=port) as plugin:
        gauge = plugin.metrics.registry.get_sample_value
        assert _get(port, "/healthz") == (200, "ok")
        status, why = _get(port, "/readyz")
        assert status == 503 and "not registered" in why
        assert gauge("hami_dra_kubelet_plugin_ready", {"node": NODE}) == 0
        with registered_kubelet(plugin, protocol):
            wait_for(lambda: _get(port, "/readyz") == (200, "ok"), 30, "the plugin ready")
            assert gauge("hami_dra_kubelet_plugin_ready", {"node": NODE}) == 1
            status, body = _get(port, "/metrics")
            assert status == 200 and f'hami_dra_kubelet_plugin_ready{{node="{NODE}"}} 1.0' in body


def test_metrics_listen_on_the_host_of_the_bind_address(dirs: Dirs, api_client: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with running_plugin(dirs, api_client, metrics_port=port, metrics_host="127.0.0.1") as plugin:
        assert plugin._metrics_server is not None and plugin._metrics_server.host == "127.0.0.1"
        assert _get(port, "/healthz") == (200, "ok")


def test_a_metrics_host_it_cannot_listen_on_names_the_flag(dirs: Dirs, api_client: Any) -> None:
    options = plugin_options(dirs, metrics_port=9400, metrics_host="192.0.2.1")  # TEST-NET-1: not ours
    plugin = KubeletPlugin(options, profile_gpus("t4", node_name=NODE, gpus=4), api_client)
    try:
        with pytest.raises(SocketError, match=r"--metrics-bind-address: cannot listen on 192\.0\.2\.1:9400"):
            plugin.start()
    finally:
        plugin.stop()
