"""The Gpu model, version and PCI normalization, simulated profiles and devices files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kube_validate import assert_valid, resource_slice_problems

from dra_driver.devices import DeviceSource, DeviceSourceError, Gpu, open_source
from dra_driver.devices.model import (
    MIB,
    DeviceModelError,
    cuda_version_from_int,
    normalize_pci_bus_id,
    semver,
)
from dra_driver.devices.nvml import NvmlSource
from dra_driver.devices.simulated import (
    PROFILES,
    DevicesFileSource,
    SimulatedSource,
    even_numa_node,
    parse_devices,
    profile_gpus,
    simulated_uuid,
)
from dra_driver.resource.slice_builder import build_resource_slices


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("535.104.05", "535.104.5"),
        ("12.2", "12.2.0"),
        ("9.0", "9.0.0"),
        ("550.54.15", "550.54.15"),
        ("12", "12.0.0"),
        ("v1.02.003", "1.2.3"),
        ("470.57.02", "470.57.2"),
        ("r550 beta", None),
        ("", None),
        ("1.2.3.4", None),
    ],
)
def test_semver_is_strict(raw: str, expected: str | None) -> None:
    assert semver(raw) == expected


def test_cuda_version_from_nvml_integer() -> None:
    assert cuda_version_from_int(12020) == "12.2"
    assert cuda_version_from_int(11040) == "11.4"
    assert cuda_version_from_int(12080) == "12.8"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:3B:00.0", "0000:3b:00.0"), ("0000:af:00.1", "0000:af:00.1"), ("3b:00.0", "0000:3b:00.0")],
)
def test_pci_bus_ids_are_normalized_like_sysfs(raw: str, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


def test_bad_pci_bus_id_says_what_is_expected() -> None:
    with pytest.raises(DeviceModelError, match=r"expected the form 0000:3b:00.0"):
        normalize_pci_bus_id("GPU0")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"index": -1}, "index must be a non-negative integer"),
        ({"uuid": ""}, "uuid must not be empty"),
        ({"memory_bytes": MIB}, "memory must be at least 2Mi"),
        ({"cores": 0}, "cores must be within 1..100"),
        ({"slots": 0}, "slots must be at least 1"),
        ({"numa_node": -1}, "NUMA node must be >= 0"),
        ({"pci_bus_id": "00000000:3B:00.0"}, "is not normalized"),
        ({"nvlink_peers": ((2, 1), (1, 1))}, "must be sorted"),
        ({"nvlink_peers": ((0, 1),)}, "not include itself"),
        ({"nvlink_peers": ((1, 0),)}, "NVLink counts must be positive"),
    ],
)
def test_gpu_rejects_inconsistent_descriptions(changes: dict, message: str) -> None:
    fields = {"index": 0, "uuid": "GPU-1", "product_name": "Tesla T4", "memory_bytes": 15360 * MIB}
    with pytest.raises(DeviceModelError, match=message):
        Gpu(**(fields | changes))


def test_profiles_have_real_sizes_and_even_numa_split() -> None:
    h100 = profile_gpus("h100-80gb", node_name="node-1", gpus=8)
    assert [g.numa_node for g in h100] == [0, 0, 0, 0, 1, 1, 1, 1]
    # nvidia-smi's total minus the driver's reserved memory, as NVIDIA publishes it.
    assert h100[0].memory_bytes == (81559 - 516) * MIB and h100[0].memory_reserved_bytes == 516 * MIB
    assert (h100[0].architecture, h100[0].cuda_compute_capability) == ("Hopper", "9.0")
    assert h100[0].pair_scores == {peer: 1800 for peer in range(1, 8)}
    t4 = profile_gpus("t4", node_name="node-1")
    assert len(t4) == PROFILES["t4"].default_gpus
    assert t4[0].memory_bytes == (15360 - 393) * MIB and t4[0].nvlink_peers == ()
    assert profile_gpus("h200", node_name="x", gpus=1)[0].memory_bytes == (143771 - 700) * MIB
    assert profile_gpus("a100-80gb", node_name="x", gpus=1)[0].product_name == "NVIDIA A100-SXM4-80GB"
    assert [even_numa_node(i, 3, 2) for i in range(3)] == [0, 0, 1]
    assert [even_numa_node(i, 1, 2) for i in range(1)] == [0]


def test_simulated_uuids_are_deterministic_per_node_and_index() -> None:
    first = [g.uuid for g in profile_gpus("t4", node_name="node-1", gpus=4)]
    again = [g.uuid for g in SimulatedSource("t4", node_name="node-1", gpus=4).discover()]
    other = [g.uuid for g in profile_gpus("t4", node_name="node-2", gpus=4)]
    assert first == again
    assert len(set(first)) == 4
    assert not set(first) & set(other)
    assert first[0] == simulated_uuid("node-1", 0) and first[0].startswith("GPU-")


def test_profile_and_count_errors() -> None:
    with pytest.raises(DeviceSourceError, match="unknown profile 'v100'; choose one of: t4, a100-80gb"):
        profile_gpus("v100", node_name="n")
    with pytest.raises(DeviceSourceError, match=r"--gpus must be within 0..1024"):
        profile_gpus("t4", node_name="n", gpus=-1)


def test_open_source_picks_exactly_what_was_asked(tmp_path: Path) -> None:
    assert isinstance(open_source("simulated", node_name="n", profile="t4"), SimulatedSource)
    devices = tmp_path / "d.yaml"
    devices.write_text("gpus: [{profile: t4}]\n")
    source = open_source("simulated", node_name="n", devices_file=devices)
    assert isinstance(source, DevicesFileSource) and isinstance(source, DeviceSource)
    assert isinstance(open_source("nvml", node_name="n"), NvmlSource)
    with pytest.raises(DeviceSourceError, match="only apply to --source simulated"):
        open_source("nvml", node_name="n", profile="t4")
    with pytest.raises(DeviceSourceError, match="needs --profile NAME"):
        open_source("simulated", node_name="n")
    with pytest.raises(DeviceSourceError, match="not both"):
        open_source("simulated", node_name="n", profile="t4", devices_file=devices)
    with pytest.raises(DeviceSourceError, match="unknown device source 'fake'"):
        open_source("fake", node_name="n")


def test_devices_file_shapes(tmp_path: Path) -> None:
    as_list = parse_devices([{"productName": "Tesla T4", "memory": "15360Mi"}], node_name="n")
    assert as_list[0].index == 0 and as_list[0].memory_bytes == 15360 * MIB
    assert as_list[0].uuid == simulated_uuid("n", 0) and as_list[0].numa_node is None
    scenario = {
        "nodes": [
            {"name": "a", "gpus": [{"index": 0, "productName": "Tesla T4", "memory": "15Gi"}]},
            {"name": "b", "gpus": [{"index": 1, "productName": "Tesla T4", "memory": "15360Mi", "numaNode": 1,
                                    "allocations": [{"memory": "1000Mi"}], "cores": 50, "slots": 4}]},
        ]
    }  # fmt: skip
    (gpu,) = parse_devices(scenario, node_name="b")
    assert (gpu.index, gpu.numa_node, gpu.cores, gpu.slots) == (1, 1, 50, 4)
    path = tmp_path / "devices.json"
    path.write_text(
        json.dumps({"gpus": [{"index": 2, "profile": "h100-80gb", "numaNode": 1, "nvlinkPeers": {"3": 18}}]})
    )
    (h100,) = DevicesFileSource(path, node_name="n").discover()
    assert h100.product_name == "NVIDIA H100 80GB HBM3" and h100.nvlink_peers == ((3, 18),)
    assert h100.numa_node == 1 and h100.minor == 2


def test_devices_file_gpu_in_mig_mode_without_mig_devices_publishes_nothing_like_on_a_real_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(
        "gpus:\n"
        "- {index: 0, profile: a100-80gb, nvlinkPeers: {1: 12, 2: 12}}\n"
        "- {index: 1, profile: a100-80gb, migEnabled: true, nvlinkPeers: {0: 12, 2: 12}}\n"
        "- {index: 2, profile: a100-80gb, nvlinkPeers: {0: 12, 1: 12}}\n"
    )
    gpus = DevicesFileSource(path, node_name="n").discover()
    assert [(gpu.name, gpu.nvlink_peers) for gpu in gpus if not gpu.mig_enabled] == [
        ("gpu-0", ((2, 12),)),
        ("gpu-2", ((0, 12),)),
    ]
    assert gpus[1].mig_enabled and gpus[1].mig_devices == ()
    assert "index 1" in caplog.text and "is in MIG mode but has no MIG devices" in caplog.text
    (slice_,) = build_resource_slices(gpus, node_name="n")
    assert [device["name"] for device in slice_["spec"]["devices"]] == ["gpu-0", "gpu-2"]


def test_a_gpu_named_by_minor_needs_its_minor_number() -> None:
    gpu = Gpu(index=1, uuid="GPU-1", product_name="T4", memory_bytes=16 * MIB, minor=3, name_by_minor=True)
    assert gpu.name == "gpu-3"
    assert Gpu(index=1, uuid="GPU-1", product_name="T4", memory_bytes=16 * MIB, minor=3).name == "gpu-1"
    with pytest.raises(DeviceModelError, match="named by minor number, but the minor number is unknown"):
        Gpu(index=1, uuid="GPU-1", product_name="T4", memory_bytes=16 * MIB, name_by_minor=True)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpu": []}, r"unknown top-level key\(s\) gpu; expected gpus"),
        ({"gpus": {"index": 0}}, "gpus: expected a list of GPUs"),
        ([{"index": 0}], r"gpus\[0\]: give productName and memory, or a profile"),
        ([{"profile": "t4", "memory": "16GB"}], r"gpus\[0\].memory: '16GB' is not a quantity"),
        ([{"profile": "t4", "numaNode": -1}], r"gpus\[0\].numaNode: expected an integer >= 0"),
        ([{"profile": "t4", "healthy": "yes"}], r"gpus\[0\].healthy: expected true or false"),
        ([{"profile": "t4", "colour": "red"}], r"gpus\[0\]: unknown key\(s\) colour"),
        ([{"profile": "k80"}], r"gpus\[0\].profile: unknown profile 'k80'"),
        ([{"profile": "t4"}, {"index": 0, "profile": "t4"}], r"gpus\[1\].index: 0 already used by gpus\[0\]"),
        ([{"profile": "t4", "pciBusID": "zz"}], r"gpus\[0\].pciBusID: 'zz' is not a PCI address"),
        ([{"profile": "t4", "nvlinkPeers": {0: 2}}], r"nvlinkPeers: peer 0 must be another GPU's index"),
        ([{"profile": "t4", "memory": "1Mi"}], r"gpus\[0\]: gpu-0: memory must be at least 2Mi"),
        ({"nodes": [{"name": "a", "gpus": []}]}, "no node named 'n' \\(nodes: a\\); pass --node-name"),
        ("just text", "gpus: expected a list of GPUs"),
    ],
)
def test_devices_file_errors_name_the_file_and_the_path(data: object, message: str) -> None:
    with pytest.raises(DeviceSourceError, match=f"^f.yaml: .*{message}"):
        parse_devices(data, node_name="n", origin="f.yaml")


def test_unreadable_or_malformed_devices_file(tmp_path: Path) -> None:
    with pytest.raises(DeviceSourceError, match=r"cannot read devices file .*missing.yaml"):
        DevicesFileSource(tmp_path / "missing.yaml", node_name="n").discover()
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(DeviceSourceError, match=r"bad.yaml: not valid YAML/JSON"):
        DevicesFileSource(bad, node_name="n").discover()


def test_kube_validate_helper_catches_what_the_api_server_rejects() -> None:
    """The shared validator must be able to fail, or every test that relies on it proves nothing."""
    (good,) = build_resource_slices(profile_gpus("t4", node_name="n", gpus=2), node_name="n")
    assert_valid(good)
    device = good["spec"]["devices"][0]

    def broken(mutate) -> dict:
        import copy

        slice_ = copy.deepcopy(good)
        mutate(slice_["spec"]["devices"][0], slice_)
        return slice_

    cases = {
        "not semver": lambda d, s: d["attributes"].update(driverVersion={"version": "535.104.05"}),
        "exactly one value": lambda d, s: d["attributes"].update(index={"int": 1, "string": "1"}),
        "not a qualified name": lambda d, s: d["attributes"].update({"bad-name": {"int": 1}}),
        "not min + n*step": lambda d, s: d["capacity"]["memory"]["requestPolicy"].update(default="1500000"),
        "allowMultipleAllocations must be true": lambda d, s: d.pop("allowMultipleAllocations"),
        "duplicate": lambda d, s: s["spec"]["devices"].append(dict(d)),
        "at most 128": lambda d, s: s["spec"]["devices"].extend(dict(d, name=f"x-{i}") for i in range(128)),
        "unsupported": lambda d, s: d.update(taints=[{"key": "a/b", "effect": "Sometimes"}]),
    }
    for expected, mutate in cases.items():
        problems = resource_slice_problems(broken(mutate))
        assert any(expected in p for p in problems), (expected, problems)
    with pytest.raises(AssertionError, match=r"invalid for Kubernetes 1.34"):
        assert_valid(broken(lambda d, s: d.update(color="blue")))
    with pytest.raises(AssertionError, match=r"ships no schema for Kubernetes 1.99"):
        assert_valid(good, versions=("1.99",))
    assert device["name"] == "gpu-0"


def test_devices_file_carries_compute_mode_and_reserved_memory() -> None:
    exclusive, default, custom = parse_devices(
        [
            {"profile": "h100-80gb", "computeMode": "Exclusive_Process"},
            {"profile": "h100-80gb"},
            {
                "productName": "Tesla T4",
                "memory": "14967Mi",
                "memoryReserved": "393Mi",
                "computeMode": "Prohibited",
            },
        ],
        node_name="n",
    )
    assert (exclusive.compute_mode, exclusive.whole_only) == ("Exclusive_Process", True)
    assert (default.compute_mode, default.whole_only) == ("Default", False)
    assert exclusive.memory_bytes == default.memory_bytes == (81559 - 516) * MIB
    assert (custom.memory_bytes, custom.memory_reserved_bytes) == (14967 * MIB, 393 * MIB)
    assert custom.whole_only
    (slice_,) = build_resource_slices([exclusive, default, custom], node_name="n")
    assert_valid(slice_)
    slots = [device["capacity"]["slots"]["value"] for device in slice_["spec"]["devices"]]
    assert slots == ["1", "10", "1"], "a card that cannot share takes one tenant"


def test_devices_file_refuses_an_unknown_compute_mode() -> None:
    with pytest.raises(
        DeviceSourceError, match=r"f.yaml: gpus\[0\].computeMode: 'Exclusive' is not a compute mode"
    ):
        parse_devices([{"profile": "t4", "computeMode": "Exclusive"}], node_name="n", origin="f.yaml")
    with pytest.raises(DeviceModelError, match="compute mode must be one of Default, Exclusive_Thread"):
        Gpu(index=0, uuid="GPU-1", product_name="T4", memory_bytes=MIB * 16, compute_mode="exclusive")
