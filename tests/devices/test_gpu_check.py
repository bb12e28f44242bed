"""``hack/gpu-check.sh`` end to end against the mock NVML and a fake ``nvidia-smi``.

The check is meant for machines with real GPUs; here it runs against ``hack/mock-nvml`` (two H200
cards plus one in MIG mode, minor numbers 0, 3 and 2) with an ``nvidia-smi`` on ``PATH`` that
prints what the profile implies, device nodes as plain files below ``--dev-root``, and a toolkit
CDI spec whose host paths exist. What it cannot reach here (libcuda, HAMi-core) must be a SKIP
that says so, and a disagreement with ``nvidia-smi`` must fail the run.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mock_profiles import nvml_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "gpu-check.sh"

MIB = 2**20
TOTAL_MIB, RESERVED_MIB = 143771, 520  # an H200, as nvidia-smi shows it
UUIDS = [
    "GPU-11111111-2222-3333-4444-555555555555",
    "GPU-66666666-7777-8888-9999-000000000000",
    "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
]
MINORS = [0, 3, 2]
BUSES = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3B:00.0"]
MIG = [0, 0, 1]
DRIVER = "580.95.05"
FIELDS = [
    "index", "uuid", "name", "memory.total", "memory.reserved", "pci.bus_id", "driver_version",
    "compute_cap", "mig.mode.current",
]  # fmt: skip


def profile() -> dict[str, Any]:
    devices = [
        {
            "uuid": uuid,
            "name": "NVIDIA H200",
            "memoryTotal": TOTAL_MIB * MIB,
            "memoryReserved": RESERVED_MIB * MIB,
            "minor": minor,
            "brand": 14,
            "architecture": 9,
            "ccMajor": 9,
            "ccMinor": 0,
            "busId": bus,
            "numaNode": index % 2,
            "migMode": mig,
        }
        for index, (uuid, minor, bus, mig) in enumerate(zip(UUIDS, MINORS, BUSES, MIG, strict=True))
    ]
    return {"driverVersion": DRIVER, "cudaDriverVersion": 13000, "devices": devices}


def smi_rows(uuids: list[str]) -> list[str]:
    return [
        f"{index}, {uuid}, NVIDIA H200, {TOTAL_MIB}, {RESERVED_MIB}, {bus}, {DRIVER}, 9.0, "
        f"{'Enabled' if mig else 'Disabled'}"
        for index, (uuid, bus, mig) in enumerate(zip(uuids, BUSES, MIG, strict=True))
    ]


def fake_nvidia_smi(bin_dir: Path, rows: list[str]) -> None:
    """Answers ``--help-query-gpu`` with the field names and ``--query-gpu`` with ``rows``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "rows.csv").write_text("\n".join(rows) + "\n")
    (bin_dir / "help.txt").write_text("".join(f'"{field}"\nsome words.\n\n' for field in FIELDS))
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --help-query-gpu ]; then cat "{bin_dir}/help.txt"; else cat "{bin_dir}/rows.csv"; fi\n'
    )
    script.chmod(0o755)


def toolkit_registry(root: Path) -> Path:
    """A host-layout toolkit spec (index and UUID names) whose library and hook exist on the host."""
    library = root / "driver" / f"libcuda.so.{DRIVER}"
    hook = root / "driver" / "nvidia-cdi-hook"
    library.parent.mkdir(parents=True)
    library.write_text("")
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    devices = [
        {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]}}
        for index, (uuid, minor) in enumerate(zip(UUIDS[:2], MINORS[:2], strict=True))
        for name in (str(index), uuid)
    ]
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
            "mounts": [
                {"hostPath": str(library), "containerPath": f"/usr/lib/x86_64-linux-gnu/{library.name}"}
            ],
            "hooks": [{"hookName": "createContainer", "path": str(hook), "args": ["nvidia-cdi-hook"]}],
        },
    }
    registry = root / "cdi"
    registry.mkdir()
    (registry / "nvidia.json").write_text(json.dumps(spec))
    return registry


def run_check(mock_nvml: dict[str, Path], tmp_path: Path, smi: list[str], registry: Path) -> tuple[int, str]:
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile()))
    fake_nvidia_smi(tmp_path / "bin", smi)
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / node).write_text("")
    env = nvml_env(mock_nvml["current"], profile_path)
    for name in ("HAMI_CORE_LIB", "NVIDIA_DRIVER_ROOT", "NVIDIA_CTK", "GPU_CHECK_TIMEOUT"):
        env.pop(name, None)
    env.update(
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}",
        GPU_CHECK_PYTHON=sys.executable,
        NODE_NAME="node-1",
    )
    command = ["bash", str(SCRIPT), "--dev-root", str(dev), "--cdi-registry", str(registry)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def libcuda_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_gpu_check_passes_against_the_mock(mock_nvml: dict[str, Path], tmp_path: Path) -> None:
    code, out = run_check(mock_nvml, tmp_path, smi_rows(UUIDS), toolkit_registry(tmp_path))
    assert code == 0, out
    assert not [line for line in out.splitlines() if line.lstrip().startswith("FAIL")], out
    ours = TOTAL_MIB - RESERVED_MIB
    gpu0, gpu3 = f"gpu-0 ({UUIDS[0]})", f"gpu-3 ({UUIDS[1]})"
    rules = "ResourceSlice API rules (names, <=128 devices, qualified names, values, policies)"
    expected = [
        # a. discovery and slices
        "PASS  NVML discovery: 2 GPU(s)",
        f"PASS  {rules} for 1 slice(s), 2 device(s) without taints (Kubernetes < 1.36): 0 problem(s)",
        f"PASS  {rules} for 1 slice(s), 2 device(s) with device taints (1.36+): 0 problem(s)",
        "PASS  strict schemas of Kubernetes 1.34, 1.37 for 1 slice(s), 2 device(s) with device taints",
        # b. nvidia-smi: the MIG card absent, memory = total - reserved, names by minor
        "PASS  published GPUs = nvidia-smi's GPUs without MIG: 2 published, 3 in nvidia-smi, 1 with MIG",
        f"PASS  MIG-enabled {UUIDS[2]} (index 2) is absent from the slice",
        f"PASS  {gpu0} memory: ours {ours}Mi (slice {ours}Mi) = nvidia-smi total {TOTAL_MIB} - "
        f"reserved {RESERVED_MIB} = {ours} MiB (+0 MiB)",
        f"PASS  {gpu3} PCI bus id: nvidia-smi 00000000:2A:00.0 -> 0000:2a:00.0; ours 0000:2a:00.0, "
        "slice 0000:2a:00.0",
        f"PASS  {gpu3} driver version: nvidia-smi {DRIVER}; ours {DRIVER}, slice 580.95.5 (semver)",
        f"PASS  {gpu3} compute capability: ours 9.0, nvidia-smi 9.0",
        f"PASS  {gpu3} MIG mode: ours disabled, nvidia-smi Disabled",
        f"PASS  {gpu3} name gpu-3: NVML minor 3, {tmp_path / 'dev' / 'nvidia3'} exists",
        # c. health watcher
        "PASS  health watcher initialised NVML and started",
        f"PASS  {gpu0} registered for NVML events; supported XID+DBE+SBE (mask 0xb)",
        f"PASS  {gpu3} registered for NVML events; supported XID+DBE+SBE (mask 0xb)",
        "PASS  watcher stopped and gave NVML back in",
        # d. CDI specs, composed with the toolkit's
        f"PASS  toolkit spec {tmp_path / 'cdi' / 'nvidia.json'} (kind nvidia.com/gpu) defines gpu-0",
        "PASS  share env: CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_DEVICE_MEMORY_LIMIT_0=4096m, "
        "CUDA_DEVICE_SM_LIMIT_0=30",
        f"PASS  share device env HAMI_DRA_GPU_0_UUID={UUIDS[0]}",
        "PASS  share spec gives the container /dev/nvidia0 (3 device node(s), 2 mount(s), 1 hook(s))",
        "PASS  share spec's host side exists",
        "PASS  whole card: no HAMi-core env or mounts (none)",
        "PASS  whole spec gives the container /dev/nvidia0 (3 device node(s), 1 mount(s), 1 hook(s))",
        "PASS  whole claim unprepared, spec removed",
        "SKIP  preload of libvgpu.so: no HAMi-core library here",
    ]
    if libcuda_loads():  # a machine with a real driver: the plain probe runs
        expected.append("PASS  CUDA probe without HAMi-core")
    else:
        expected += [
            "SKIP  CUDA probe: libcuda.so.1 does not load",
            "SKIP  HAMi-core memory limit: needs libcuda.so.1 (no libvgpu.so",
        ]
    missing = [line for line in expected if line not in out]
    assert not missing, "\n".join(["missing:", *missing, "output:", out])
    for step in "abcde":
        assert f"[{step}] done in " in out
    assert "SUMMARY: " in out and ", 0 failed, " in out


def test_a_disagreement_with_nvidia_smi_fails(mock_nvml: dict[str, Path], tmp_path: Path) -> None:
    other = "GPU-99999999-9999-9999-9999-999999999999"
    empty = tmp_path / "no-toolkit"
    empty.mkdir()
    code, out = run_check(mock_nvml, tmp_path, smi_rows([UUIDS[0], other, UUIDS[2]]), empty)
    assert code == 1, out
    assert (
        "FAIL  published GPUs = nvidia-smi's GPUs without MIG: 2 published, 3 in nvidia-smi, 1 with MIG "
        f"enabled; published but not in nvidia-smi (or in MIG mode): {UUIDS[1]}; in nvidia-smi but not "
        f"published: {other}"
    ) in out, out
    assert f"PASS  gpu-0 ({UUIDS[0]}) index: ours 0, nvidia-smi 0" in out
    # Without a toolkit spec the plugin would withhold the GPUs; the claims get device nodes only.
    assert "SKIP  NVIDIA Container Toolkit CDI spec: none in" in out
    assert "PASS  share spec's host side exists" in out
    assert "FAIL b: published GPUs = nvidia-smi's GPUs without MIG" in out
    assert ", 1 failed, " in out


def test_no_usable_python_is_said_plainly() -> None:
    env = {**os.environ, "GPU_CHECK_PYTHON": "/nonexistent/python3"}
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 2
    assert "no Python 3.11 or newer" in proc.stderr
