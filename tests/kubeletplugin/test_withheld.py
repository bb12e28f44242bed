"""GPUs the node must not publish (``dra_driver/kubeletplugin/withheld.py``) and the plugin's use of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.withheld import (
    DEVICE_PLUGIN,
    NO_CDI_SPEC,
    cdi_withheld,
    device_plugin_gpus,
    device_plugin_withheld,
)
from tests.kubeletplugin.conftest import Dirs, plugin_options
from tests.kubeletplugin.helpers import gpu
from tests.kubeletplugin.toolkit_specs import common_edits, host_root_with_libraries, write_toolkit_spec


@pytest.mark.parametrize(
    ("allocatable", "count"),
    [
        (None, 0),
        ({}, 0),
        ({"cpu": "4"}, 0),
        ({"nvidia.com/gpu": "0"}, 0),
        ({"nvidia.com/gpu": "8"}, 8),
        ({"nvidia.com/gpu": "not-a-number"}, 0),
    ],
)
def test_the_device_plugins_gpus_are_read_from_allocatable(
    allocatable: dict[str, str] | None, count: int
) -> None:
    assert device_plugin_gpus(allocatable) == count


def test_a_device_plugin_withholds_every_gpu_and_says_how_to_migrate() -> None:
    assert device_plugin_withheld([gpu(0), gpu(1)], 0) == {}
    withheld = device_plugin_withheld([gpu(0), gpu(1)], 2)
    assert set(withheld) == {"gpu-0", "gpu-1"} and withheld["gpu-0"].reason == DEVICE_PLUGIN
    assert "nvidia.com/gpu.deploy.device-plugin=false" in withheld["gpu-0"].message


def test_no_spec_withholds_every_gpu_with_what_was_read() -> None:
    withheld = cdi_withheld([gpu(0)], None, ["/etc/cdi/nvidia.yaml: not valid YAML"])
    assert withheld["gpu-0"].reason == NO_CDI_SPEC
    assert (
        "not valid YAML" in withheld["gpu-0"].message
        and "nvidia-ctk cdi generate" in withheld["gpu-0"].message
    )


def nvml_plugin(dirs: Dirs, tmp_path: Path, api_client: Any, **overrides: Any) -> KubeletPlugin:
    write_toolkit_spec(tmp_path / "registry", "host", ["x", "y"], [0, 1])
    options = plugin_options(
        dirs,
        simulated=False,
        cdi_registry_dirs=(tmp_path / "registry",),
        host_root=host_root_with_libraries(tmp_path / "host"),
        **overrides,
    )
    return KubeletPlugin(options, profile_gpus("a100-80gb", node_name="node-1", gpus=2), api_client)


def test_the_plugin_withholds_gpus_while_the_node_advertises_the_device_plugins(
    dirs: Dirs, tmp_path: Path, api_client: Any
) -> None:
    plugin = nvml_plugin(dirs, tmp_path, api_client)
    node: dict[str, Any] = {"metadata": {"uid": "u"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    plugin._read_node = lambda: node  # type: ignore[method-assign]
    assert plugin.check_withheld() and plugin._current_gpus() == []
    assert plugin.metrics.withheld_gpus(DEVICE_PLUGIN)._value.get() == 2
    assert not plugin.check_withheld(), "nothing changed, nothing reported"
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # the admin moved the node over
    assert plugin.check_withheld() and [g.name for g in plugin._current_gpus()] == ["gpu-0", "gpu-1"]
    assert plugin.metrics.withheld_gpus(DEVICE_PLUGIN)._value.get() == 0


def test_the_admin_may_let_both_run_on_different_gpus(dirs: Dirs, tmp_path: Path, api_client: Any) -> None:
    plugin = nvml_plugin(dirs, tmp_path, api_client, allow_device_plugin=True)
    plugin._read_node = lambda: {"status": {"allocatable": {"nvidia.com/gpu": "2"}}}  # type: ignore[method-assign]
    plugin.check_withheld()
    assert [g.name for g in plugin._current_gpus()] == ["gpu-0", "gpu-1"]


def test_a_mig_device_whose_capabilities_nobody_provides_is_withheld_by_its_own_name(tmp_path: Path) -> None:
    from dataclasses import replace

    import yaml

    from dra_driver.kubeletplugin.control_nodes import HostView
    from dra_driver.kubeletplugin.toolkit import parse_spec, toolkit_edits

    raw = {
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
        ],
        "containerEdits": common_edits(),
    }
    host = host_root_with_libraries(tmp_path / "host")
    edits = toolkit_edits(parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw)), HostView(host))
    mig = replace(gpu(1), name="gpu-1-mig-13-0", uuid="MIG-x", slots=1, mig_caps=(255, 256))
    withheld = cdi_withheld([gpu(0), mig], edits, [])
    assert list(withheld) == ["gpu-1-mig-13-0"]
    assert withheld["gpu-1-mig-13-0"].reason == NO_CDI_SPEC
    assert "nvidia-cap255" in withheld["gpu-1-mig-13-0"].message
