"""ResourceSlice builder: golden output per profile, API validity, limits, taints, properties."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_validate import assert_valid, resource_slice_problems

from dra_driver.devices.model import MIB, Gpu
from dra_driver.devices.nvlink import nvlink_peers_attribute, parse_nvlink_peers
from dra_driver.devices.simulated import PROFILES, profile_gpus
from dra_driver.resource.slice_builder import (
    MAX_DEVICES_PER_SLICE,
    MAX_TAINTED_DEVICES_PER_SLICE,
    SliceError,
    build_resource_slices,
    policy_taint_key,
    unhealthy_taint_key,
)

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_golden_slice_per_profile(profile: str) -> None:
    slices = build_resource_slices(profile_gpus(profile, node_name="node-1"), node_name="node-1")
    for slice_ in slices:
        assert_valid(slice_)
    golden = GOLDEN / f"{profile}.yaml"
    rendered = yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True)
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"regenerate with UPDATE_GOLDEN=1 if {golden.name} should change"


def test_h100_device_carries_design_attributes_and_capacity() -> None:
    (slice_,) = build_resource_slices(
        profile_gpus("h100-80gb", node_name="node-1", gpus=8), node_name="node-1"
    )
    spec = slice_["spec"]
    assert spec["driver"] == "gpu.hami.io"
    assert spec["nodeName"] == "node-1"
    assert spec["pool"] == {"name": "node-1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    device = spec["devices"][5]
    assert device["allowMultipleAllocations"] is True
    assert set(device["attributes"]) >= {
        "index", "minor", "uuid", "productName", "brand", "architecture", "cudaComputeCapability",
        "driverVersion", "cudaDriverVersion", "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot", "computeMode",
    }  # fmt: skip
    assert device["attributes"]["computeMode"] == {"string": "Default"}
    assert "healthMonitored" not in device["attributes"]  # only the plugin knows
    assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert device["attributes"]["index"] == {"int": 5}
    assert device["capacity"] == {
        "memory": {
            "value": "81043Mi",
            "requestPolicy": {"default": "81043Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
        },
        "slots": {
            "value": "10",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "10", "step": "1"}},
        },
    }
    assert "taints" not in device


def test_owner_reference_only_when_node_uid_known() -> None:
    gpus = profile_gpus("t4", node_name="n1", gpus=1)
    assert "ownerReferences" not in build_resource_slices(gpus, node_name="n1")[0]["metadata"]
    (slice_,) = build_resource_slices(
        gpus, node_name="n1", node_uid="7d3b1c2a-0000-4000-8000-000000000001", generation=7
    )
    assert slice_["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "n1",
            "uid": "7d3b1c2a-0000-4000-8000-000000000001",
            "controller": True,
        }
    ]
    assert slice_["spec"]["pool"]["generation"] == 7
    assert_valid(slice_)


def test_empty_node_still_publishes_one_empty_slice() -> None:
    (slice_,) = build_resource_slices([], node_name="cpu-only")
    assert slice_["spec"]["devices"] == []
    assert slice_["spec"]["pool"]["resourceSliceCount"] == 1
    assert_valid(slice_)


def test_large_node_is_split_into_slices_of_one_pool() -> None:
    gpus = profile_gpus("t4", node_name="big", gpus=300)
    slices = build_resource_slices(gpus, node_name="big", generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
    assert len({s["metadata"]["name"] for s in slices}) == 3
    for slice_ in slices:
        assert_valid(slice_)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(300)]


def test_taints_are_off_by_default_and_halve_the_slice_size() -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=MAX_DEVICES_PER_SLICE)
    gpus[3] = dataclasses.replace(gpus[3], healthy=False)
    plain = build_resource_slices(gpus, node_name="n")
    assert len(plain) == 1
    assert all("taints" not in d for d in plain[0]["spec"]["devices"])
    assert plain[0]["spec"]["devices"][3]["attributes"]["healthy"] == {"bool": False}

    tainted = build_resource_slices(gpus, node_name="n", policy_taint=True, taint_unhealthy=True)
    assert [len(s["spec"]["devices"]) for s in tainted] == [MAX_TAINTED_DEVICES_PER_SLICE] * 2
    devices = [d for s in tainted for d in s["spec"]["devices"]]
    assert devices[0]["taints"] == [{"key": "gpu.hami.io/policy-managed", "effect": "NoSchedule"}]
    assert devices[3]["taints"] == [
        {"key": "gpu.hami.io/policy-managed", "effect": "NoSchedule"},
        {"key": "gpu.hami.io/unhealthy", "effect": "NoSchedule"},
    ]
    for slice_ in tainted:
        assert_valid(slice_)

    only_unhealthy = build_resource_slices(gpus[:8], node_name="n", taint_unhealthy=True)[0]["spec"][
        "devices"
    ]
    assert [("taints" in d) for d in only_unhealthy] == [False, False, False, True] + [False] * 4


def test_taint_keys_follow_the_driver_name() -> None:
    assert policy_taint_key() == "gpu.hami.io/policy-managed"
    assert unhealthy_taint_key("gpu.example.com") == "gpu.example.com/unhealthy"
    (slice_,) = build_resource_slices(
        profile_gpus("t4", node_name="n", gpus=1),
        node_name="n",
        driver_name="gpu.example.com",
        policy_taint=True,
    )
    assert slice_["spec"]["devices"][0]["taints"][0]["key"] == "gpu.example.com/policy-managed"
    assert_valid(slice_)


def test_memory_is_published_in_whole_mib_and_single_slot_cards_validate() -> None:
    gpu = Gpu(
        index=0, uuid="GPU-x", product_name="Odd", memory_bytes=16 * 1024 * MIB + 12345, slots=1, cores=1
    )
    (slice_,) = build_resource_slices([gpu], node_name="n")
    assert_valid(slice_)
    capacity = slice_["spec"]["devices"][0]["capacity"]
    assert capacity["memory"]["value"] == "16Gi"
    assert capacity["slots"]["requestPolicy"] == {"default": "1", "validRange": {"min": "1", "max": "1"}}
    assert capacity["cores"]["requestPolicy"]["validRange"] == {"min": "0", "max": "1", "step": "1"}


def test_unparseable_versions_are_omitted_and_long_strings_truncated() -> None:
    gpu = Gpu(
        index=0,
        uuid="GPU-y",
        product_name="X" * 80,
        memory_bytes=1024 * MIB,
        driver_version="r550 beta",
        cuda_driver_version="12",
    )
    (slice_,) = build_resource_slices([gpu], node_name="n")
    assert_valid(slice_)
    attributes = slice_["spec"]["devices"][0]["attributes"]
    assert "driverVersion" not in attributes
    assert attributes["cudaDriverVersion"] == {"version": "12.0.0"}
    assert attributes["productName"] == {"string": "X" * 64}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_name": "Node_1"}, "node name 'Node_1' is not a valid DNS subdomain"),
        ({"node_name": "n", "driver_name": "gpu"}, None),
        ({"node_name": "n", "driver_name": "GPU.io"}, "driver name 'GPU.io'"),
        ({"node_name": "n", "generation": -1}, "generation must be >= 0"),
        ({"node_name": "n", "pool_name": "a//b"}, "pool name ''"),
    ],
)
def test_bad_names_are_rejected_clearly(kwargs: dict, message: str | None) -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=1)
    if message is None:
        assert_valid(build_resource_slices(gpus, **kwargs)[0])
        return
    with pytest.raises(SliceError, match=message.replace("(", r"\(")):
        build_resource_slices(gpus, **kwargs)


def test_duplicate_indexes_or_uuids_are_rejected() -> None:
    (a,) = profile_gpus("t4", node_name="n", gpus=1)
    with pytest.raises(SliceError, match="two GPUs have index 0"):
        build_resource_slices([a, dataclasses.replace(a, uuid="GPU-other")], node_name="n")
    with pytest.raises(SliceError, match="two GPUs have UUID"):
        build_resource_slices([a, dataclasses.replace(a, index=1)], node_name="n")


def test_nvlink_peer_encoding_round_trips_and_stays_short() -> None:
    peers = ((1, 18), (2, 18), (3, 18), (5, 4), (7, 18))
    assert nvlink_peers_attribute(peers) == "18:1-3,7;4:5"
    assert parse_nvlink_peers("18:1-3,7;4:5") == peers
    sixteen = tuple((peer, 18) for peer in range(1, 16))
    assert nvlink_peers_attribute(sixteen) == "18:1-15"


_gpu = st.builds(
    Gpu,
    index=st.integers(0, 400),
    uuid=st.uuids().map(lambda u: f"GPU-{u}"),
    product_name=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=90),
    memory_bytes=st.integers(2 * MIB, 2**44),
    minor=st.none() | st.integers(0, 1000),
    numa_node=st.none() | st.integers(0, 7),
    driver_version=st.none() | st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,3}){0,2}\Z"),
    healthy=st.booleans(),
    cores=st.integers(1, 100),
    slots=st.integers(1, 64),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(_gpu, max_size=300, unique_by=(lambda g: g.index, lambda g: g.uuid)),
    policy_taint=st.booleans(),
    taint_unhealthy=st.booleans(),
)
def test_any_device_set_yields_valid_slices_with_exactly_the_input_devices(
    gpus: list[Gpu], policy_taint: bool, taint_unhealthy: bool
) -> None:
    slices = build_resource_slices(
        gpus, node_name="node-1", policy_taint=policy_taint, taint_unhealthy=taint_unhealthy
    )
    published = [device for s in slices for device in s["spec"]["devices"]]
    assert sorted(d["name"] for d in published) == sorted(g.name for g in gpus)
    by_name = {g.name: g for g in gpus}
    for device in published:
        gpu = by_name[device["name"]]
        assert device["attributes"]["uuid"]["string"] == gpu.uuid
        assert device["attributes"]["index"]["int"] == gpu.index
        assert device["attributes"]["healthy"]["bool"] == gpu.healthy
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    for slice_ in slices:
        # Schema validation is slow for big slices; the property check runs the API rules on every
        # example and the strict schemas of both versions on a sample.
        assert resource_slice_problems(slice_) == []
    assert_valid(slices[0])


def test_examples_in_this_repo_are_valid() -> None:
    from dra_driver.devices.simulated import DevicesFileSource

    examples = sorted((Path(__file__).resolve().parents[2] / "examples" / "devices").glob("*.*"))
    assert examples, "examples/devices/ is empty"
    for path in examples:
        gpus = DevicesFileSource(path, node_name="node-1").discover()
        assert gpus
        for slice_ in build_resource_slices(
            gpus, node_name="node-1", policy_taint=True, taint_unhealthy=True
        ):
            assert_valid(slice_)


def test_the_builder_and_its_users_do_not_import_the_kubelet_plugin() -> None:
    """The slice builder lives in the typed model, so ``devices`` and the fake nodes stay below the
    plugin: a fresh interpreter importing them loads no ``dra_driver.kubeletplugin`` module."""
    program = (
        "import sys\n"
        "import dra_driver.resource.slice_builder, dra_driver.devices.command\n"
        "import hami_dra_dev.cluster.fakenodes\n"
        "print(sorted(m for m in sys.modules if m.startswith('dra_driver.kubeletplugin')))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
