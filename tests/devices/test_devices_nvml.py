"""The NVML source against hack/mock-nvml, loaded through the real pynvml bindings."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from kube_validate import assert_valid
from mock_profiles import fake_sysfs, nvml_env, profile_from_gpus

from dra_driver.devices.model import MIB, Gpu
from dra_driver.devices.nvml import NVML_NOT_FOUND_HINT
from dra_driver.devices.simulated import profile_gpus
from dra_driver.resource.slice_builder import build_resource_slices


def h100_node() -> list:
    return profile_gpus("h100-80gb", node_name="node-1", gpus=8)


def named_by_minor(gpus: list[Gpu]) -> list[Gpu]:
    """What NVML discovery returns for simulated ``gpus``: the same GPUs, named by minor number,
    isolation not known yet (the kubelet plugin decides it from its HAMi-core library)."""
    return [dataclasses.replace(gpu, name_by_minor=True, isolation="none") for gpu in gpus]


def test_eight_h100_on_two_numa_nodes_match_the_simulated_profile(run_nvml) -> None:
    gpus = h100_node()
    run = run_nvml(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040), sysfs=gpus)
    assert run.error is None
    assert run.gpus == named_by_minor(gpus)
    assert [gpu.name for gpu in run.gpus] == [gpu.name for gpu in gpus]  # minor == index here
    assert [gpu.numa_node for gpu in run.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert run.gpus[0].pair_scores == {peer: 1800 for peer in range(1, 8)}
    assert "WARNING" not in run.stderr
    for slice_ in build_resource_slices(run.gpus, node_name="node-1"):
        assert_valid(slice_)


def test_t4_box_without_nvlink_and_nvidia_style_versions(run_nvml) -> None:
    gpus = profile_gpus("t4", node_name="t4-box", gpus=4)
    run = run_nvml(
        profile_from_gpus(gpus, driver_version="535.104.05", cuda_driver_version=12020), sysfs=gpus
    )
    assert run.gpus == named_by_minor(gpus)
    assert all(gpu.nvlink_peers == () for gpu in run.gpus)
    assert run.gpus[0].driver_version == "535.104.05"
    assert run.gpus[0].cuda_driver_version == "12.2"
    (slice_,) = build_resource_slices(run.gpus, node_name="t4-box")
    assert_valid(slice_)
    attributes = slice_["spec"]["devices"][0]["attributes"]
    assert attributes["driverVersion"] == {"version": "535.104.5"}
    assert attributes["cudaDriverVersion"] == {"version": "12.2.0"}
    assert attributes["cudaComputeCapability"] == {"version": "7.5.0"}
    assert attributes["architecture"] == {"string": "Turing"}
    assert "nvlinkPeers" not in attributes


def test_numa_node_comes_from_sysfs_first_then_nvml(run_nvml, tmp_path: Path) -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=4)
    profile = profile_from_gpus(gpus, driver_version="535.104.05", cuda_driver_version=12020)
    for device, nvml_node in zip(profile["devices"], (5, 0, 1, 6), strict=True):
        device["numaNode"] = nvml_node
    profile["devices"][3]["errors"] = {"nvmlDeviceGetNumaNodeId": 3}  # NVML_ERROR_NOT_SUPPORTED
    # gpu-0: sysfs 0 beats NVML's 5 (on Grace NVML names the GPU memory's node, not the CPUs');
    # gpu-1: sysfs -1 means no affinity, NVML is not asked; gpu-2: no sysfs entry, NVML answers;
    # gpu-3: neither knows.
    sysfs = fake_sysfs(tmp_path / "sysfs", [gpus[0], gpus[1]], numa={0: "0", 1: "-1"})
    run = run_nvml(profile, sysfs=sysfs)
    assert [gpu.numa_node for gpu in run.gpus] == [0, None, 1, None]
    assert "WARNING GPU index 3" in run.stderr and "NUMA node unknown" in run.stderr
    assert "GPU index 1" not in run.stderr  # no NUMA affinity is not a problem worth a warning
    (slice_,) = build_resource_slices(run.gpus, node_name="n")
    assert_valid(slice_)
    devices = slice_["spec"]["devices"]
    assert devices[0]["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert devices[2]["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert "resource.kubernetes.io/numaNode" not in devices[1]["attributes"]
    assert "resource.kubernetes.io/numaNode" not in devices[3]["attributes"]


def test_driver_lacking_newer_calls_omits_attributes_and_logs_once(run_nvml) -> None:
    gpus = h100_node()
    profile = profile_from_gpus(gpus, driver_version="470.57.02", cuda_driver_version=11040)
    run = run_nvml(profile, legacy=True, sysfs=gpus, repeat=2)
    assert run.error is None
    assert len(run.gpus) == 8
    assert all(gpu.architecture is None and gpu.mig_enabled is None for gpu in run.gpus)
    # NUMA from sysfs, as on every driver; the v1 memory total (reserved memory included) is published.
    assert [gpu.numa_node for gpu in run.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [gpu.memory_bytes for gpu in run.gpus] == [g.memory_bytes + g.memory_reserved_bytes for g in gpus]
    assert {gpu.memory_reserved_bytes for gpu in run.gpus} == {0}
    for call in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetArchitecture", "nvmlDeviceGetMigMode"):
        assert run.stderr.count(f"{call} unavailable (Function Not Found)") == 1, run.stderr
    (slice_,) = build_resource_slices(run.gpus, node_name="node-1")
    assert_valid(slice_)
    attributes = slice_["spec"]["devices"][0]["attributes"]
    assert "architecture" not in attributes
    assert attributes["driverVersion"] == {"version": "470.57.2"}


def test_direct_nvlink_pairs_without_nvswitch(run_nvml) -> None:
    base = profile_gpus("a100-80gb", node_name="n", gpus=4)
    pairs = {0: ((1, 4),), 1: ((0, 4),), 2: ((3, 4),), 3: ((2, 4),)}
    gpus = [dataclasses.replace(gpu, nvlink_peers=pairs[gpu.index]) for gpu in base]
    run = run_nvml(
        profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040, nvswitch=False),
        sysfs=gpus,
    )
    assert [gpu.nvlink_peers for gpu in run.gpus] == [pairs[i] for i in range(4)]
    assert run.gpus[2].pair_scores == {3: 400}


def test_gpu_whose_uuid_cannot_be_read_is_skipped_with_an_error(run_nvml) -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=3)
    profile = profile_from_gpus(gpus, driver_version="535.104.05", cuda_driver_version=12020)
    profile["devices"][1]["errors"] = {"nvmlDeviceGetUUID": 15}  # NVML_ERROR_GPU_IS_LOST
    run = run_nvml(profile, sysfs=gpus)
    assert [gpu.index for gpu in run.gpus] == [0, 2]
    assert "GPU index 1 skipped" in run.stderr and "GPU is lost" in run.stderr


def test_legacy_driver_without_nvml_numa_call_omits_numa_when_sysfs_has_none(
    run_nvml, tmp_path: Path
) -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=2)
    run = run_nvml(
        profile_from_gpus(gpus, driver_version="470.57.02", cuda_driver_version=11040),
        legacy=True,
        sysfs=tmp_path / "empty-sys",
    )
    assert [gpu.numa_node for gpu in run.gpus] == [None, None]
    assert run.stderr.count("nvmlDeviceGetNumaNodeId unavailable (Function Not Found)") == 1, run.stderr


def test_published_memory_excludes_the_drivers_reserved_memory(run_nvml) -> None:
    gpus = profile_gpus("h200", node_name="n", gpus=2)
    profile = profile_from_gpus(gpus, driver_version="570.86.15", cuda_driver_version=12080)
    total = profile["devices"][0]["memoryTotal"]
    assert total == 143771 * MIB  # nvidia-smi's H200 total
    profile["devices"][0]["memoryReserved"] = 566 * MIB
    run = run_nvml(profile, sysfs=gpus)
    assert run.gpus[0].memory_bytes == total - 566 * MIB
    assert run.gpus[0].memory_reserved_bytes == 566 * MIB
    # The simulated profile's reservation answers as NVML would: both sources publish the same.
    assert run.gpus[1].memory_bytes == gpus[1].memory_bytes == (143771 - 700) * MIB
    slices = build_resource_slices(run.gpus, node_name="n")
    memory = slices[0]["spec"]["devices"][0]["capacity"]["memory"]
    assert memory["value"] == f"{143771 - 566}Mi"
    assert "WARNING" not in run.stderr


def test_a_gpu_in_mig_mode_without_mig_devices_publishes_nothing_and_says_so(run_nvml) -> None:
    gpus = h100_node()[:4]
    gpus = [dataclasses.replace(g, nvlink_peers=tuple(p for p in g.nvlink_peers if p[0] < 4)) for g in gpus]
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][1]["migMode"] = 1
    profile["devices"][2]["migPendingMode"] = 1  # enabled at the next reset: still whole today
    run = run_nvml(profile, sysfs=gpus)
    assert [gpu.index for gpu in run.gpus] == [0, 1, 2, 3]
    assert run.gpus[1].mig_enabled and run.gpus[1].mig_devices == ()
    assert all(1 not in dict(gpu.nvlink_peers) for gpu in run.gpus if gpu.index != 1)
    assert dict(run.gpus[0].nvlink_peers) == {2: 18, 3: 18}
    warning = next(line for line in run.stderr.splitlines() if "in MIG mode but has no MIG devices" in line)
    assert gpus[1].uuid in warning and "index 1" in warning and "nvidia-smi mig -cgi" in warning
    assert f"GPU index 2 ({gpus[2].uuid}): MIG mode is pending" in run.stderr
    (slice_,) = build_resource_slices(run.gpus, node_name="node-1")
    assert_valid(slice_)
    assert [device["name"] for device in slice_["spec"]["devices"]] == ["gpu-0", "gpu-2", "gpu-3"]


def test_devices_are_named_by_minor_number_and_keep_their_index(run_nvml) -> None:
    gpus = profile_gpus("a100-80gb", node_name="n", gpus=4)
    # GPU index 1 fell off the bus: NVML renumbers the rest, the kernel's minor numbers stay.
    survivors = [
        dataclasses.replace(gpu, index=index, minor=gpu.index, nvlink_peers=())
        for index, gpu in enumerate([gpus[0], gpus[2], gpus[3]])
    ]
    run = run_nvml(profile_from_gpus(survivors, driver_version="550.54.15", cuda_driver_version=12040))
    assert [(gpu.index, gpu.name, gpu.uuid) for gpu in run.gpus] == [
        (0, "gpu-0", gpus[0].uuid),
        (1, "gpu-2", gpus[2].uuid),
        (2, "gpu-3", gpus[3].uuid),
    ]
    (slice_,) = build_resource_slices(run.gpus, node_name="n")
    assert_valid(slice_)
    device = slice_["spec"]["devices"][1]
    assert device["name"] == "gpu-2"
    assert device["attributes"]["index"] == {"int": 1}
    assert device["attributes"]["minor"] == {"int": 2}


def test_without_every_minor_number_devices_are_named_by_index(run_nvml) -> None:
    gpus = profile_gpus("t4", node_name="n", gpus=3)
    profile = profile_from_gpus(gpus, driver_version="535.104.05", cuda_driver_version=12020)
    profile["devices"][2]["errors"] = {"nvmlDeviceGetMinorNumber": 999}
    run = run_nvml(profile, sysfs=gpus)
    assert [gpu.name for gpu in run.gpus] == ["gpu-0", "gpu-1", "gpu-2"]
    assert not any(gpu.name_by_minor for gpu in run.gpus)
    assert "device names fall back to gpu-<index>" in run.stderr


def test_an_nvlink_that_fails_does_not_stop_the_other_links(run_nvml) -> None:
    base = profile_gpus("a100-80gb", node_name="n", gpus=2)
    gpus = [dataclasses.replace(gpu, nvlink_peers=((1 - gpu.index, 4),)) for gpu in base]
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040, nvswitch=False)
    links = profile["devices"][0]["nvlinks"]
    # link 1 errors, link 2 is inactive: the two links after them still count.
    profile["devices"][0]["nvlinks"] = [links[0], 999, None, links[1], links[2], *links[3:]]
    run = run_nvml(profile, sysfs=gpus)
    assert run.gpus[0].nvlink_peers == ((1, 4),)
    assert run.gpus[1].nvlink_peers == ((0, 4),)
    assert run.stderr.count("NVLink link(s) 1 (Unknown Error) could not be read") == 1, run.stderr


def test_nvml_init_failure_is_one_clear_error(run_nvml) -> None:
    run = run_nvml({"initError": 9, "devices": []})
    assert run.error is not None
    assert run.error.startswith(NVML_NOT_FOUND_HINT)
    assert "Driver Not Loaded" in run.error


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # Not `python -m dra_driver.cli`: that runs cli.py as __main__, whose UsageError is a
        # different class from the one subcommands import. The console script calls main() too.
        [
            sys.executable,
            "-c",
            "import sys; from dra_driver.cli import main; sys.exit(main())",
            "discover",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_without_nvidia_library_exits_2_with_one_line(tmp_path: Path) -> None:
    env = nvml_env(tmp_path, tmp_path / "absent.json")  # no libnvidia-ml.so.1 in tmp_path
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    proc = _cli(env, "--source", "nvml", "--node-name", "node-1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert NVML_NOT_FOUND_HINT in lines[0]


def test_cli_nvml_prints_the_same_devices_as_simulated(mock_nvml, tmp_path: Path) -> None:
    gpus = h100_node()
    profile = tmp_path / "h100.json"
    profile.write_text(
        json.dumps(profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040))
    )
    env = nvml_env(mock_nvml["current"], profile)
    nvml = _cli(env, "--source", "nvml", "--node-name", "node-1", "-o", "json")
    simulated = _cli(
        env,
        "--source",
        "simulated",
        "--profile",
        "h100-80gb",
        "--gpus",
        "8",
        "--node-name",
        "node-1",
        "-o",
        "json",
    )
    assert nvml.returncode == 0, nvml.stderr
    assert simulated.returncode == 0, simulated.stderr
    from_nvml, from_profile = json.loads(nvml.stdout), json.loads(simulated.stdout)
    assert_valid(from_nvml)
    # The PCIe root comes from the sysfs of the machine running the test, which has no such GPUs.
    for device in from_nvml["spec"]["devices"] + from_profile["spec"]["devices"]:
        device["attributes"].pop("resource.kubernetes.io/pcieRoot", None)
    # Only the isolation differs: discovery alone cannot know of HAMi-core, simulated GPUs need none.
    assert {d["attributes"].pop("isolation")["string"] for d in from_nvml["spec"]["devices"]} == {"none"}
    assert {d["attributes"].pop("isolation")["string"] for d in from_profile["spec"]["devices"]} == {
        "simulated"
    }
    assert from_nvml == from_profile
    assert len(from_nvml["spec"]["devices"]) == 8


def test_compute_mode_is_read_and_a_card_that_cannot_share_publishes_one_slot(run_nvml) -> None:
    gpus = h100_node()[:4]
    gpus = [dataclasses.replace(g, nvlink_peers=tuple(p for p in g.nvlink_peers if p[0] < 4)) for g in gpus]
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][1]["computeMode"] = 3  # nvmlComputeMode_t EXCLUSIVE_PROCESS
    profile["devices"][2]["computeMode"] = 2  # PROHIBITED
    del profile["devices"][3]["computeMode"]  # the mock's default: DEFAULT
    run = run_nvml(profile, sysfs=gpus)
    modes = [gpu.compute_mode for gpu in run.gpus]
    assert modes == ["Default", "Exclusive_Process", "Prohibited", "Default"]
    assert [gpu.whole_only for gpu in run.gpus] == [False, True, True, False]
    assert f"GPU index 1 ({gpus[1].uuid}): compute mode Exclusive_Process" in run.stderr
    assert "given out whole only (nvidia-smi -c DEFAULT to share it)" in run.stderr
    (slice_,) = build_resource_slices(run.gpus, node_name="node-1")
    assert_valid(slice_)
    devices = slice_["spec"]["devices"]
    assert [d["attributes"]["computeMode"] for d in devices] == [{"string": mode} for mode in modes]
    assert [d["capacity"]["slots"]["value"] for d in devices] == ["10", "1", "1", "10"]


def test_a_driver_failing_the_compute_mode_call_omits_the_attribute(run_nvml) -> None:
    gpus = [dataclasses.replace(h100_node()[0], nvlink_peers=())]
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][0]["errors"] = {"nvmlDeviceGetComputeMode": 999}
    run = run_nvml(profile, sysfs=gpus)
    assert run.gpus[0].compute_mode is None and not run.gpus[0].whole_only
    (slice_,) = build_resource_slices(run.gpus, node_name="node-1")
    assert "computeMode" not in slice_["spec"]["devices"][0]["attributes"]
    assert "nvmlDeviceGetComputeMode unavailable (Unknown Error); the attribute is omitted" in run.stderr
