"""The toolkit's CDI specs read as what a GPU container needs (``dra_driver/kubeletplugin/toolkit.py``)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from dra_driver.kubeletplugin import cdi
from dra_driver.kubeletplugin.container_edits import EditsConflict
from dra_driver.kubeletplugin.control_nodes import HostView
from dra_driver.kubeletplugin.toolkit import (
    ToolkitRegistry,
    ToolkitSpecError,
    gpu_edits,
    merge_edits,
    parse_spec,
    select,
    shared_cut,
    toolkit_edits,
)
from tests.kubeletplugin.toolkit_specs import host_root_with_libraries, toolkit_spec, write_toolkit_spec

UUIDS = ["GPU-a", "GPU-b"]


def spec_of(layout: str, minors: list[int] | None = None, path: str = "/etc/cdi/nvidia.yaml") -> object:
    return parse_spec(Path(path), yaml.safe_dump(toolkit_spec(layout, UUIDS, minors or [0, 1])))


def test_json_and_yaml_specs_parse_to_the_same_edits() -> None:
    raw = toolkit_spec("host", UUIDS, [0, 1])
    from_json = parse_spec(Path("nvidia.json"), json.dumps(raw))
    from_yaml = parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw))
    assert from_json.devices == from_yaml.devices and from_json.common == from_yaml.common
    assert set(from_json.devices) == {"0", "1", "GPU-a", "GPU-b", "all"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [unclosed", "not valid YAML"),
        ("- a list", "no mapping at the top"),
        ("kind: nvidia.com/gpu\ndevices: [{containerEdits: {}}]", "a device without a name"),
        (
            "kind: nvidia.com/gpu\ncontainerEdits: {rlimits: [{type: RLIMIT_NOFILE}]}",
            "field 'rlimits' is not one the CDI spec defines",
        ),
        ("kind: nvidia.com/gpu\ncontainerEdits: {env: FOO=1}", "containerEdits.env is not a list"),
        ("kind: nvidia.com/gpu\ncontainerEdits: {intelRdt: [x]}", "containerEdits.intelRdt is not a mapping"),
        ("kind: nvidia.com/gpu\ncontainerEdits: {additionalGids: [-1]}", "holds -1, not a uint32"),
        ("kind: nvidia.com/gpu\ncontainerEdits: {additionalGids: [video]}", "holds 'video', not a uint32"),
    ],
)
def test_an_unusable_spec_is_refused_naming_the_file_and_why(text: str, message: str) -> None:
    with pytest.raises(ToolkitSpecError, match=message) as caught:
        parse_spec(Path("/var/run/cdi/nvidia.yaml"), text)
    assert "/var/run/cdi/nvidia.yaml" in str(caught.value)


def test_per_gpu_entries_win_over_the_all_device() -> None:
    edits = gpu_edits(spec_of("host", [3, 7]))  # type: ignore[arg-type]
    assert edits == {
        3: {"deviceNodes": [{"path": "/dev/nvidia3"}]},
        7: {"deviceNodes": [{"path": "/dev/nvidia7"}]},
    }


def test_from_the_all_device_a_gpu_gets_its_node_and_the_control_nodes_never_another_card() -> None:
    raw = toolkit_spec("operator", UUIDS, [0, 1])
    raw["devices"][0]["containerEdits"]["deviceNodes"].append({"path": "/dev/dri/card1"})
    edits = gpu_edits(parse_spec(Path("m.yaml"), yaml.safe_dump(raw)))
    assert edits[1] == {
        "deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    }
    assert {"path": "/dev/nvidia0"} not in edits[1]["deviceNodes"]


def test_the_preferred_kind_wins_and_a_later_registry_dir_overrides_an_earlier_one() -> None:
    operator = spec_of("operator", path="/var/run/cdi/management.yaml")
    etc = spec_of("index-only", path="/etc/cdi/nvidia.yaml")
    run = spec_of("host", path="/var/run/cdi/nvidia.yaml")
    assert select([operator, etc, run]) is run  # type: ignore[list-item]
    assert select([operator]) is operator  # type: ignore[list-item]
    assert select([]) is None


def test_the_registry_skips_our_own_and_other_vendors_specs_and_rereads_a_changed_file(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "cdi"
    registry.mkdir()
    (registry / "k8s.gpu.hami.io-gpu_claim.json").write_text(
        json.dumps({"kind": "nvidia.com/gpu", "devices": "x"})
    )
    (registry / "vendor.yaml").write_text("kind: example.com/fpga\ndevices: [{name: a}]\n")
    (registry / "README").write_text("not a spec")
    toolkit = ToolkitRegistry((registry,), host=HostView(None), ignore_prefix="k8s.gpu.hami.io-")
    assert toolkit.current() == (None, [])
    write_toolkit_spec(registry, "index-only", UUIDS, [0])
    edits, errors = toolkit.current()
    assert edits is not None and errors == [] and set(edits.by_minor) == {0}
    (registry / "nvidia.yaml").write_text("kind: nvidia.com/gpu\ndevices: [{")
    edits, errors = toolkit.current()
    assert edits is None and len(errors) == 1 and "nvidia.yaml: not valid YAML" in errors[0]


def test_a_spec_naming_a_missing_library_marks_its_gpus_stale(tmp_path: Path) -> None:
    write_toolkit_spec(tmp_path / "cdi", "host", UUIDS, [0, 1])
    edits, _ = ToolkitRegistry((tmp_path / "cdi",), host=HostView(tmp_path / "empty-host")).current()
    assert edits is not None and edits.for_minor(0) is None
    assert "libcuda.so.550.54.15, which does not exist" in str(edits.problem(0))
    edits, _ = ToolkitRegistry(
        (tmp_path / "cdi",), host=HostView(host_root_with_libraries(tmp_path / "h"))
    ).current()
    assert edits is not None and edits.for_minor(0) == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    assert edits.problem(2) is not None and "no device with /dev/nvidia2" in str(edits.problem(2))


def test_merged_edits_keep_field_order_and_drop_empty_fields() -> None:
    merged = merge_edits({"env": ["A=1"], "mounts": []}, {"env": ["B=2"], "hooks": [{"path": "/h"}]})
    assert merged == {"env": ["A=1", "B=2"], "hooks": [{"path": "/h"}]}


# ------------------------------------------- every containerEdits field (issue 33)
#: A GPU's device as nvidia-ctk >= 1.19 writes it where nvidia-drm is loaded: its DRM nodes are
#: root:video 0660, so the device asks for the video group (44) too.
DRM_GPU = {
    "deviceNodes": [
        {"path": "/dev/nvidia0", "major": 195, "fileMode": 0o666, "permissions": "rwm"},
        {
            "path": "/dev/dri/card1",
            "major": 226,
            "minor": 1,
            "fileMode": 0o660,
            "permissions": "rwm",
            "gid": 44,
        },
        {"path": "/dev/dri/renderD128", "major": 226, "minor": 128, "fileMode": 0o666, "permissions": "rwm"},
    ],
    "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["x"]}],
    "additionalGids": [44],
}


def test_additional_gids_and_intel_rdt_are_read_and_carried_whole() -> None:
    raw = toolkit_spec("index-only", UUIDS, [0])
    raw["devices"][0]["containerEdits"] = DRM_GPU
    raw["containerEdits"]["intelRdt"] = {"closID": "gpu"}
    raw["containerEdits"]["additionalGids"] = [0, 27, 27]
    spec = parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw))
    assert spec.common["additionalGids"] == [27], "0 is ignored and a group is listed once"
    assert spec.common["intelRdt"] == {"closID": "gpu"}
    assert gpu_edits(spec)[0] == DRM_GPU


def test_the_shared_all_cut_gives_a_tenant_its_gpu_and_the_control_nodes_only() -> None:
    nodes = [
        {"path": "/dev/nvidia0", "fileMode": 0o660, "gid": 1001},
        {"path": "/dev/nvidia1", "fileMode": 0o660, "gid": 1002},
        {"path": "/dev/nvidiactl", "fileMode": 0o666},
        {"path": "/dev/nvidia-uvm", "fileMode": 0o666},
        {"path": "/dev/nvidia-uvm-tools", "fileMode": 0o666},
        {"path": "/dev/nvidia-modeset", "fileMode": 0o660, "gid": 1003},
        {"path": "/dev/nvidia-caps/nvidia-cap1", "fileMode": 0o400},
        {"path": "/dev/nvidia-caps-imex-channels/channel0", "fileMode": 0o660, "gid": 1004},
        {"path": "/dev/dri/card1", "fileMode": 0o660, "gid": 44},
    ]
    all_device = {
        "deviceNodes": nodes,
        "additionalGids": [1001, 1002, 1003, 1004, 44],
        "hooks": [{"hookName": "createContainer", "path": "/h", "args": ["nvidia-cdi-hook", "chmod"]}],
        "env": ["A=1"],
        "intelRdt": {"closID": "x"},
    }
    cut = shared_cut(all_device, 1)
    assert [n["path"] for n in cut["deviceNodes"]] == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    assert cut["additionalGids"] == [1002, 1003], "only the groups the kept nodes need"
    assert cut["env"] == ["A=1"] and cut["intelRdt"] == {"closID": "x"}
    assert "hooks" not in cut, "the chmod of nvidia-caps concerns nodes the cut leaves out"
    # Nodes that do not say their group: the device's groups are kept, or a kept node could not be opened.
    bare = {"deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}], "additionalGids": [44]}
    assert shared_cut(bare, 0) == {"deviceNodes": [{"path": "/dev/nvidia0"}], "additionalGids": [44]}


def test_merged_edits_keep_list_order_merge_groups_as_a_set_and_refuse_two_intel_rdts() -> None:
    merged = merge_edits(
        {"additionalGids": [44], "intelRdt": {"closID": "a"}, "netDevices": [{"hostInterfaceName": "i"}]},
        {"additionalGids": [0, 44, 27], "intelRdt": {"closID": "a"}},
    )
    assert merged == {
        "additionalGids": [44, 27],
        "intelRdt": {"closID": "a"},
        "netDevices": [{"hostInterfaceName": "i"}],
    }
    with pytest.raises(EditsConflict, match="two different intelRdt settings"):
        merge_edits({"intelRdt": {"closID": "a"}}, {"intelRdt": {"closID": "b"}})


def test_a_gpu_whose_intel_rdt_differs_from_the_common_one_is_unusable_naming_both() -> None:
    raw = toolkit_spec("index-only", UUIDS, [0, 1])
    raw["containerEdits"]["intelRdt"] = {"closID": "common"}
    raw["devices"][1]["containerEdits"]["intelRdt"] = {"closID": "gpu1"}
    edits = toolkit_edits(parse_spec(Path("n.yaml"), yaml.safe_dump(raw)), HostView(None))
    assert edits.for_minor(0) is not None and edits.for_minor(1) is None
    assert "'common'" in str(edits.problem(1)) and "'gpu1'" in str(edits.problem(1))


@pytest.mark.parametrize(
    ("edits", "version"),
    [
        ({"additionalGids": [44]}, "0.7.0"),
        ({"intelRdt": {"closID": "gpu"}}, "0.7.0"),
        ({"intelRdt": {"closID": "gpu", "schemata": ["L3:0=ff"]}}, "1.1.0"),
        ({"intelRdt": {"enableMonitoring": True}}, "1.1.0"),
        ({"netDevices": [{"hostInterfaceName": "ib0", "name": "ib0"}]}, "1.1.0"),
    ],
)
def test_a_claim_spec_declares_the_cdi_version_its_carried_fields_need(
    edits: dict[str, object], version: str
) -> None:
    """As specs-go's MinimumRequiredVersion: a lower one is refused by the runtime's CDI library."""
    device = {"name": "claim-gpu-0", "containerEdits": {"env": ["A=1"]}}
    assert cdi.make_spec("k8s.gpu.hami.io/gpu", [device], dict(edits))["cdiVersion"] == version
    at_device = {"name": "claim-gpu-0", "containerEdits": {"env": ["A=1"], **edits}}
    assert cdi.make_spec("k8s.gpu.hami.io/gpu", [at_device], {})["cdiVersion"] == version


def test_a_card_in_mig_mode_is_never_given_a_mig_devices_capabilities_as_its_own() -> None:
    """nvidia-ctk writes no whole-card device for a card in MIG mode, only its MIG devices (the card's
    node and two nvidia-caps nodes each): the card's own edits are its node alone, each MIG device
    is found by its capabilities."""
    caps = [
        {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "major": 237, "minor": m} for m in (147, 148, 255, 256)
    ]
    raw = {
        "cdiVersion": "0.7.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": "1:0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, *caps[:2]]}},
            {"name": "1:1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, *caps[2:]]}},
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }
    spec = parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw))
    assert gpu_edits(spec) == {
        0: {"deviceNodes": [{"path": "/dev/nvidia0"}]},
        1: {"deviceNodes": [{"path": "/dev/nvidia1"}]},
    }
    edits = toolkit_edits(spec)
    assert edits.for_mig(1, (255, 256)) == {"deviceNodes": [{"path": "/dev/nvidia1"}, *caps[2:]]}
    # a MIG device the spec lacks (created after it was generated): the card's node and its caps by path
    assert edits.for_mig(1, (12, 13)) == {
        "deviceNodes": [
            {"path": "/dev/nvidia1"},
            {"path": "/dev/nvidia-caps/nvidia-cap12"},
            {"path": "/dev/nvidia-caps/nvidia-cap13"},
        ]
    }
    assert edits.for_mig(2, (12, 13)) is None


def test_a_mig_device_the_spec_does_not_describe_needs_its_capabilities_on_the_host(tmp_path: Path) -> None:
    raw = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}],
    }
    host = tmp_path / "host"
    (host / "dev" / "nvidia-caps").mkdir(parents=True)
    edits = toolkit_edits(parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw)), HostView(host))
    problem = edits.mig_problem(1, (147, 148))
    assert problem is not None and "/dev/nvidia-caps/nvidia-cap147" in problem
    for cap in (147, 148):  # nvidia-modprobe made them: the runtime reads their numbers there
        (host / "dev" / "nvidia-caps" / f"nvidia-cap{cap}").write_text("")
    assert edits.mig_problem(1, (147, 148)) is None
    assert (
        edits.mig_problem(2, (12, 13)) == "nvidia.yaml (nvidia.com/gpu) defines no device with /dev/nvidia2"
    )


def test_a_capability_created_after_the_spec_is_described_for_the_runtime(tmp_path: Path) -> None:
    """MIG on demand creates instances after the toolkit's spec was generated, and the host need not
    have their capability nodes: one the host has is described from it; one it lacks gets its type,
    major (the host's /proc/devices) and minor, from which the runtime makes it in the container."""
    raw = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}],
    }
    host = tmp_path / "host"
    (host / "dev" / "nvidia-caps").mkdir(parents=True)
    (host / "proc").mkdir()
    (host / "proc" / "devices").write_text("Character devices:\n195 nvidia\n237 nvidia-caps\n")
    try:
        os.mknod(host / "dev/nvidia-caps/nvidia-cap93", stat.S_IFCHR | 0o400, os.makedev(237, 93))
    except PermissionError:
        pytest.skip("making a character device node needs root")
    edits = toolkit_edits(parse_spec(Path("nvidia.yaml"), yaml.safe_dump(raw)), HostView(host))
    nodes = edits.for_mig(1, (93, 94))["deviceNodes"]  # type: ignore[index]
    assert nodes[0] == {"path": "/dev/nvidia1"}
    assert nodes[1]["path"] == "/dev/nvidia-caps/nvidia-cap93"
    assert (nodes[1]["major"], nodes[1]["minor"], nodes[1]["fileMode"]) == (237, 93, 0o400)  # the host's node
    assert nodes[2] == {
        "path": "/dev/nvidia-caps/nvidia-cap94",
        "type": "c",
        "major": 237,
        "minor": 94,
        "fileMode": 0o444,
        "permissions": "rw",
    }
