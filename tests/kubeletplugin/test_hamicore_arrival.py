"""HAMi-core that arrives, changes or goes while the plugin runs (``KubeletPlugin.check_hami_core``).

The chart installs the library from its own DaemonSet, so the plugin starts without it wherever
HAMi's image is slow or unreachable: it must publish at once with ``isolation: none`` (the
DeviceClasses then give the GPUs out whole) and switch the node to shares when the library
arrives, without a restart; a library that goes or turns out too old switches it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.contract import HAMI_CORE_VERSION_ATTRIBUTE, ISOLATION_ATTRIBUTE
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from tests.kubeletplugin.conftest import NODE, Dirs, plugin_options
from tests.kubeletplugin.helpers import stand_in_library
from tests.kubeletplugin.test_publisher import slices
from tests.waiting import wait_for


def _published(api_client: Any) -> set[tuple[str | None, str | None]]:
    """(isolation, hamiCoreVersion) of every published GPU."""

    def value(device: dict[str, Any], name: str) -> str | None:
        attribute = (device.get("attributes") or {}).get(name) or {}
        return next(iter(attribute.values()), None)

    return {
        (value(d, ISOLATION_ATTRIBUTE), value(d, HAMI_CORE_VERSION_ATTRIBUTE))
        for s in slices(api_client)
        for d in s["spec"].get("devices") or ()
    }


def _unenforced(plugin: KubeletPlugin) -> float | None:
    value: float | None = plugin.metrics.registry.get_sample_value(
        "hami_dra_kubelet_plugin_unenforced_gpus", {"node": NODE}
    )
    return value


def _real_gpu_plugin(dirs: Dirs, api_client: Any, library: Path, recheck: float) -> KubeletPlugin:
    """Real GPUs as far as isolation goes (not simulated), without the toolkit's spec check."""
    options = plugin_options(
        dirs, simulated=False, nvidia_cdi_kind=None, hami_core_lib=library, publish=True,
        recheck_seconds=recheck, allow_device_plugin=True,
    )  # fmt: skip
    return KubeletPlugin(options, profile_gpus("t4", node_name=NODE, gpus=2), api_client)


@pytest.fixture
def library(tmp_path: Path) -> Path:
    directory = tmp_path / "vgpu"
    directory.mkdir()
    return directory / "libvgpu.so"


@pytest.fixture
def waiting_plugin(dirs: Dirs, api_client: Any, library: Path) -> Iterator[KubeletPlugin]:
    plugin = _real_gpu_plugin(dirs, api_client, library, recheck=0.05)
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


def test_publishes_whole_gpus_without_the_library_and_shares_once_it_arrives(
    waiting_plugin: KubeletPlugin, api_client: Any, library: Path
) -> None:
    wait_for(lambda: _published(api_client) == {("none", None)}, 30, "isolation none without a library")
    assert waiting_plugin.preparer.config.hami.library is None
    assert _unenforced(waiting_plugin) == 2

    stand_in_library(library, "v2.10.0")
    wait_for(lambda: _published(api_client) == {("hami-core", "2.10.0")}, 30, "isolation hami-core")
    assert waiting_plugin.preparer.config.hami.library == library, "new claims' specs preload it"
    assert waiting_plugin.preparer.config.hami.preload_file.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert _unenforced(waiting_plugin) == 0

    library.with_name("libvgpu.so.version").write_text("v2.8.0\n")  # an older library replaced it
    wait_for(lambda: _published(api_client) == {("none", None)}, 30, "the refused library given up")
    assert waiting_plugin.preparer.config.hami.library is None


def test_a_new_finding_is_applied_only_when_the_next_check_agrees(
    dirs: Dirs, api_client: Any, library: Path
) -> None:
    """The installer renames the library, then writes its version: a check in between must not
    publish what it saw (an unversioned library) unless it is still so one check later."""
    plugin = _real_gpu_plugin(dirs, api_client, library, recheck=3600)
    assert plugin.hami_core.isolation == "none"
    stand_in_library(library, None)
    assert plugin.check_hami_core() is False, "seen once: not yet applied"
    stand_in_library(library, "v2.9.0")
    assert plugin.check_hami_core() is False, "a different finding starts over"
    assert plugin.hami_core.isolation == "none" and {g.isolation for g in plugin.gpus} == {"none"}
    assert plugin.check_hami_core() is True
    assert (plugin.hami_core.isolation, plugin.hami_core.version) == ("hami-core", "2.9.0")
    assert {(g.isolation, g.hami_core_version) for g in plugin.gpus} == {("hami-core", "2.9.0")}
    assert plugin.check_hami_core() is False, "nothing changed since"


def test_without_a_configured_library_nothing_is_checked(dirs: Dirs, api_client: Any) -> None:
    options = plugin_options(dirs, simulated=False, nvidia_cdi_kind=None)
    plugin = KubeletPlugin(options, profile_gpus("t4", node_name=NODE, gpus=1), api_client)
    assert plugin.check_hami_core() is False and plugin.check_hami_core() is False
    assert plugin.hami_core.isolation == "none"
