"""Control device nodes in every claim's spec (``dra_driver/kubeletplugin/control_nodes.py``, issue 33).

The host is a directory standing in for the host's ``/`` with real character device nodes in its
``dev/`` (``mknod`` needs root, as the mock driver roots of tests/nvidia_layouts.py do).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.control_nodes import HostView, complete, dev_root
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.toolkit import ToolkitRegistry
from dra_driver.kubeletplugin.withheld import NO_CONTROL_NODES, cdi_withheld
from tests.kubeletplugin.conftest import Dirs, plugin_options
from tests.kubeletplugin.helpers import claim, gpu, result, validate_cdi
from tests.kubeletplugin.test_preparer_units import FakeClaims, make, prepared_spec
from tests.kubeletplugin.toolkit_specs import host_root_with_libraries, toolkit_spec

UVM_MAJOR = 511
VIDEO = 44


def char_node(path: Path, major: int, minor: int, mode: int, gid: int = 0) -> None:
    if os.geteuid() != 0:
        pytest.skip("device nodes need root (mknod)")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, mode)
    os.chown(path, 0, gid)


def spec_without_uvm(registry: Path, layout: str = "host") -> None:
    """The toolkit's spec as generated before nvidia-uvm was loaded: nvidiactl only."""
    spec = toolkit_spec(layout, ["GPU-00000000", "GPU-00000001"], [0, 1])
    for edits in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]:
        if "deviceNodes" in edits:
            edits["deviceNodes"] = [n for n in edits["deviceNodes"] if n["path"] != "/dev/nvidia-uvm"]
    registry.mkdir(parents=True, exist_ok=True)
    name = "management.nvidia.com-gpu.yaml" if layout == "operator" else "nvidia.yaml"
    (registry / name).write_text(yaml.safe_dump(spec))


def test_the_dev_root_is_read_from_the_specs_own_nodes() -> None:
    assert dev_root([{"path": "/dev/nvidiactl"}]) == ""
    assert dev_root([{"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}]) == (
        "/run/nvidia/driver"
    )


def test_the_host_is_seen_below_its_root_or_through_the_driver_root_mount() -> None:
    assert HostView(Path("/host")).seen_at("/dev/nvidia-uvm") == Path("/host/dev/nvidia-uvm")
    view = HostView(None, PurePosixPath("/run/nvidia/driver"), Path("/driver-root"))
    assert view.seen_at("/run/nvidia/driver/dev/nvidia-uvm") == Path("/driver-root/dev/nvidia-uvm")
    assert view.seen_at("/dev/nvidia-uvm") is None, "outside the driver root: not visible"
    assert view.seen_at("relative") is None
    assert HostView(None).seen_at("/dev/nvidiactl") is None


def test_a_control_node_the_spec_lacks_is_added_as_the_host_has_it(tmp_path: Path) -> None:
    host = tmp_path / "host"
    char_node(host / "dev" / "nvidia-uvm", UVM_MAJOR, 0, 0o666)
    char_node(host / "dev" / "nvidia-uvm-tools", UVM_MAJOR, 1, 0o660, gid=VIDEO)
    present = {"deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia0"}]}
    completed = complete([present], HostView(host))
    assert completed.problem is None
    assert completed.edits == {
        "deviceNodes": [
            {
                "path": "/dev/nvidia-uvm",
                "major": UVM_MAJOR,
                "minor": 0,
                "fileMode": 0o666,
                "permissions": "rwm",
            },
            {
                "path": "/dev/nvidia-uvm-tools",
                "major": UVM_MAJOR,
                "minor": 1,
                "fileMode": 0o660,
                "permissions": "rwm",
                "gid": VIDEO,
            },
        ],
        "additionalGids": [VIDEO],
    }


def test_under_a_driver_root_the_added_node_names_its_host_path(tmp_path: Path) -> None:
    char_node(tmp_path / "mounted" / "dev" / "nvidia-uvm", UVM_MAJOR, 0, 0o666)
    present = {
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"},
        ]
    }
    view = HostView(None, PurePosixPath("/run/nvidia/driver"), tmp_path / "mounted")
    (node,) = complete([present], view).edits["deviceNodes"]
    assert node["path"] == "/dev/nvidia-uvm" and node["hostPath"] == "/run/nvidia/driver/dev/nvidia-uvm"


def test_a_required_node_missing_everywhere_or_unseen_is_a_problem_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "host" / "dev").mkdir(parents=True)
    present = {"deviceNodes": [{"path": "/dev/nvidiactl"}]}
    problem = complete([present], HostView(tmp_path / "host")).problem
    assert problem is not None
    assert "no /dev/nvidia-uvm" in problem and "missing on the node too" in problem
    assert "nvidia-modprobe -u -c=0" in problem and "regenerate the toolkit's spec" in problem
    unseen = complete([present], HostView(None)).problem
    assert unseen is not None and "/dev/nvidia-uvm not visible to the plugin" in unseen
    # Optional nodes (uvm-tools, modeset) never make a problem; a complete spec needs nothing.
    full = {"deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]}
    assert complete([full], HostView(tmp_path / "host")) == complete([full], HostView(None))
    assert complete([full], HostView(None)).edits == {} and complete([full], HostView(None)).problem is None


def test_a_claim_spec_gets_the_uvm_node_created_after_the_spec_and_is_valid_cdi(tmp_path: Path) -> None:
    spec_without_uvm(tmp_path / "registry")
    host = host_root_with_libraries(tmp_path / "host")
    toolkit = ToolkitRegistry((tmp_path / "registry",), host=HostView(host))
    obj = claim("late-uvm", [result("gpu-0", share=False), result("gpu-1", share=False)])
    preparer = make(tmp_path, FakeClaims(obj), simulated=False, toolkit=toolkit)
    preparer.start()
    (host / "dev").mkdir()
    answer, spec = prepared_spec(preparer, obj)
    assert spec == {} and "no /dev/nvidia-uvm" in answer.error and "nvidia-modprobe" in answer.error
    char_node(host / "dev" / "nvidia-uvm", UVM_MAJOR, 0, 0o660, gid=VIDEO)  # nvidia-uvm loaded now
    answer, spec = prepared_spec(preparer, obj)
    assert not answer.error
    nodes = spec["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm"], "added once for two GPUs"
    assert nodes[1]["major"] == UVM_MAJOR and spec["containerEdits"]["additionalGids"] == [VIDEO]
    assert spec["cdiVersion"] == "0.7.0", "additionalGids needs 0.7.0"
    validate_cdi(spec)


def test_the_node_withholds_gpus_without_uvm_and_publishes_them_once_it_exists(
    dirs: Dirs, tmp_path: Path, api_client: Any
) -> None:
    spec_without_uvm(tmp_path / "registry", "operator")
    host = host_root_with_libraries(tmp_path / "host")
    (host / "dev").mkdir()
    options = plugin_options(
        dirs, simulated=False, cdi_registry_dirs=(tmp_path / "registry",), host_root=host
    )
    plugin = KubeletPlugin(options, profile_gpus("a100-80gb", node_name="node-1", gpus=2), api_client)
    plugin._read_node = lambda: {"metadata": {"uid": "u"}, "status": {}}  # type: ignore[method-assign]
    assert plugin.check_withheld() and plugin._current_gpus() == []
    assert {w.reason for w in plugin.withheld.values()} == {NO_CONTROL_NODES}
    assert plugin.metrics.withheld_gpus(NO_CONTROL_NODES)._value.get() == 2
    char_node(host / "dev" / "nvidia-uvm", UVM_MAJOR, 0, 0o666)
    assert plugin.check_withheld() and [g.name for g in plugin._current_gpus()] == ["gpu-0", "gpu-1"]


def test_no_spec_at_all_is_still_reported_as_a_missing_spec_not_as_missing_nodes() -> None:
    withheld = cdi_withheld([gpu(0)], None, [])
    assert withheld["gpu-0"].reason != NO_CONTROL_NODES
