"""Build mock-NVML profiles (hack/mock-nvml) and fake sysfs trees from :class:`Gpu` lists.

Deriving the NVML profile from the simulated profile lets a test assert that ``--source nvml``
and ``--source simulated`` describe the same hardware identically.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.devices.mig_profiles import mig_model
from dra_driver.devices.model import COMPUTE_MODES, Gpu
from dra_driver.devices.nvml import ARCHITECTURES, BRANDS

REPO = Path(__file__).resolve().parents[2]

_BRAND_CODES = {name: code for code, name in BRANDS.items()}
_ARCH_CODES = {name: code for code, name in ARCHITECTURES.items()}
_COMPUTE_MODE_CODES = {name: code for code, name in COMPUTE_MODES.items()}
#: NVSwitch PCI addresses (not GPUs) that NVSwitch-fabric links point at.
NVSWITCHES = ["00000000:C1:00.0", "00000000:C2:00.0", "00000000:C3:00.0", "00000000:C4:00.0"]


def nvml_bus_id(bus_id: str) -> str:
    """sysfs form ``0000:3b:00.0`` -> NVML form ``00000000:3B:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def profile_from_gpus(
    gpus: Sequence[Gpu], *, driver_version: str, cuda_driver_version: int, nvswitch: bool = True
) -> dict[str, Any]:
    """A mock-NVML profile answering for ``gpus``; NVLink peers become NVSwitch links if ``nvswitch``."""
    devices = []
    by_index = {gpu.index: gpu for gpu in gpus}
    for gpu in sorted(gpus, key=lambda g: g.index):
        device: dict[str, Any] = {
            "uuid": gpu.uuid,
            "name": gpu.product_name,
            # NVML's total includes the driver's reservation; discovery publishes total - reserved.
            "memoryTotal": gpu.memory_bytes + gpu.memory_reserved_bytes,
            "memoryReserved": gpu.memory_reserved_bytes,
        }
        if gpu.compute_mode is not None:
            device["computeMode"] = _COMPUTE_MODE_CODES[gpu.compute_mode]
        if gpu.minor is not None:
            device["minor"] = gpu.minor
        if gpu.brand:
            device["brand"] = _BRAND_CODES[gpu.brand]
        if gpu.architecture:
            device["architecture"] = _ARCH_CODES[gpu.architecture]
        if gpu.cuda_compute_capability:
            major, minor = gpu.cuda_compute_capability.split(".")
            device["ccMajor"], device["ccMinor"] = int(major), int(minor)
        if gpu.pci_bus_id:
            device["busId"] = nvml_bus_id(gpu.pci_bus_id)
        if gpu.numa_node is not None:
            device["numaNode"] = gpu.numa_node
        if gpu.mig_enabled is not None:
            device["migMode"] = int(gpu.mig_enabled)
        if gpu.mig_devices:
            device.update(mig_device_json(gpu))
        elif gpu.mig_enabled and mig_model(gpu.product_name) is not None:
            # MIG mode without instances (a card for MIG on demand): the profiles, nothing created.
            device["migProfiles"] = mig_profiles_json(gpu.product_name)
        if gpu.nvlink_peers:
            if nvswitch:
                links = gpu.nvlink_peers[0][1]
                device["nvlinks"] = [NVSWITCHES[link % len(NVSWITCHES)] for link in range(links)]
            else:
                device["nvlinks"] = [
                    nvml_bus_id(by_index[peer].pci_bus_id or "")
                    for peer, count in gpu.nvlink_peers
                    for _ in range(count)
                ]
        devices.append(device)
    return {"driverVersion": driver_version, "cudaDriverVersion": cuda_driver_version, "devices": devices}


def fake_sysfs(root: Path, gpus: Sequence[Gpu], numa: dict[int, str] | None = None) -> Path:
    """A ``/sys`` tree with ``bus/pci/devices/<busid>`` links into ``devices/<pcie root>/...``.

    ``numa`` overrides the content of ``numa_node`` per GPU index (e.g. ``"-1"``); by default the
    GPU's own NUMA node (or ``-1``) is written.
    """
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        if not gpu.pci_bus_id:
            continue
        parent = gpu.pcie_root or f"pci{gpu.pci_bus_id[:7]}"
        device_dir = root / "devices" / parent / f"{gpu.pci_bus_id[:8]}01.0" / gpu.pci_bus_id
        device_dir.mkdir(parents=True, exist_ok=True)
        text = (numa or {}).get(gpu.index, str(gpu.numa_node if gpu.numa_node is not None else -1))
        (device_dir / "numa_node").write_text(text + "\n")
        link = links / gpu.pci_bus_id
        if not link.exists():
            link.symlink_to(device_dir)
    return root


def nvml_env(
    lib_dir: Path, profile_path: Path, events_path: Path | None = None, mig_state: Path | None = None
) -> dict[str, str]:
    """Environment for a subprocess that loads the mock from ``lib_dir`` with ``profile_path``.

    ``events_path`` is the file the mock's ``nvmlEventSetWait`` reads injected events from;
    ``mig_state`` the file its MIG instances outlive the process in (``MOCK_NVML_MIG_STATE``).
    """
    env = dict(os.environ)
    paths = [str(lib_dir), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    env["MOCK_NVML_PROFILE"] = str(profile_path)
    env["PYTHONPATH"] = str(REPO)
    env.pop("MOCK_NVML_EVENTS", None)
    env.pop("MOCK_NVML_MIG_STATE", None)
    if events_path is not None:
        env["MOCK_NVML_EVENTS"] = str(events_path)
    if mig_state is not None:
        env["MOCK_NVML_MIG_STATE"] = str(mig_state)
    return env


def mig_profiles_json(product_name: str) -> list[dict[str, Any]]:
    """The ``migProfiles`` of a mock device: NVML's numbers from :mod:`dra_driver.devices.mig_profiles`."""
    model = mig_model(product_name)
    if model is None:
        raise KeyError(f"no MIG profile table for {product_name!r}")
    return [
        {
            "profile": profile.nvml_index,
            "id": profile.profile_id,
            "name": profile.name,
            "sliceCount": profile.slices,
            "instanceCount": profile.instance_count,
            "multiprocessorCount": profile.multiprocessors,
            "memorySizeMB": profile.memory_mib,
            "copyEngineCount": profile.copy_engines,
            "decoderCount": profile.decoders,
            "encoderCount": profile.encoders,
            "jpegCount": profile.jpegs,
            "ofaCount": profile.ofas,
            "placements": list(profile.placements),
            "placementSize": profile.placement_size,
        }
        for profile in model.profiles
    ]


def with_mig(
    device: dict[str, Any], instances: Sequence[tuple[str, int]] = (), *, enabled: bool = True
) -> dict[str, Any]:
    """``device`` (a mock profile's device) in MIG mode with GPU instances ``(profile name, start)``."""
    model = mig_model(device["name"])
    assert model is not None, device["name"]
    return {
        **device,
        "migMode": int(enabled),
        "migProfiles": mig_profiles_json(device["name"]),
        "gpuInstances": [
            {"profileId": model.by_name(name).profile_id, "start": start} for name, start in instances
        ],
    }


def mig_device_json(gpu: Gpu) -> dict[str, Any]:
    """The MIG part of a mock device answering for ``gpu``'s MIG devices (whole-GPU-instance compute
    instances, with the very UUIDs ``gpu`` has, so both sources describe the same hardware)."""
    model = mig_model(gpu.product_name)
    assert model is not None, gpu.product_name
    instances = []
    for mig in gpu.mig_devices:
        profile = model.by_name(mig.profile)
        assert mig.slices == mig.gpu_instance_slices, "sub-instance compute instances are not derived"
        instances.append(
            {
                "profileId": profile.profile_id,
                "start": mig.placement_start,
                "computeInstances": [{"profileId": _whole_ci_profile(mig.slices), "uuid": mig.uuid}],
            }
        )
    return {
        "migMode": 1,
        "migProfiles": mig_profiles_json(gpu.product_name),
        "gpuInstances": instances,
    }


def _whole_ci_profile(slices: int) -> int:
    """NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE's id for a compute instance of ``slices`` slices."""
    return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices]
