"""``hack/gpu-check.sh`` end to end against the mock NVML, a fake ``nvidia-smi`` and stand-ins.

The check is meant for machines with real GPUs; here it runs against ``hack/mock-nvml`` (two H200
cards plus one in MIG mode, minor numbers 0, 3 and 2) with an ``nvidia-smi`` on ``PATH`` that
prints what the profile implies, device nodes as plain files below ``--dev-root``, a toolkit CDI
spec whose host paths exist, and the stand-ins of ``hack/gpu-check-standin`` for libcuda and
HAMi-core (the libcuda one needs the dev root's nodes, the HAMi-core one enforces the share's
limits, or fails to in the way a fault compiled into it says). A correct machine passes; each
injected fault must fail the run with a line that names it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mock_profiles import mig_profiles_json, nvml_env

from tests.nvidia_layouts import DeviceFiles, generate_spec, mock_driver_root, require_toolkit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "gpu-check.sh"
STANDIN = REPO / "hack" / "gpu-check-standin"
#: The HAMi-core stand-in's compiled-in faults (libvgpu.c), by the name the tests use.
FAULTS = {
    "memory-limit": "FAULT_MEMORY_LIMIT",
    "core-limit": "FAULT_CORE_LIMIT",
    "shared-region": "FAULT_SHARED_REGION",
    "pid-namespace": "FAULT_PID_NAMESPACE",
}

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
    for device in devices:
        if device["migMode"]:  # no instances yet: its profiles, for step j to create one
            device["migProfiles"] = mig_profiles_json(device["name"])
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


def toolkit_registry(root: Path, without: str = "") -> Path:
    """A host-layout toolkit spec (index and UUID names) whose library, program and hook exist on
    the host; ``without`` leaves out one of what CUDA in a container needs (a node's path, or
    ``libcuda``, ``nvidia-smi``, ``update-ldcache``)."""
    library = root / "driver" / f"libcuda.so.{DRIVER}"
    smi = root / "driver" / "nvidia-smi"
    hook = root / "driver" / "nvidia-cdi-hook"
    library.parent.mkdir(parents=True)
    library.write_text("")
    for program in (hook, smi):
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    mounts = [
        {"hostPath": str(library), "containerPath": f"/usr/lib/x86_64-linux-gnu/{library.name}"},
        {"hostPath": str(smi), "containerPath": "/usr/bin/nvidia-smi"},
    ]
    hooks = [
        {"hookName": "createContainer", "path": str(hook), "args": ["nvidia-cdi-hook", "create-symlinks"]},
        {
            "hookName": "createContainer",
            "path": str(hook),
            "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
        },
    ]
    nodes = [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    nodes = [n for n in nodes if n["path"] != without]
    mounts = [m for m in mounts if not without or without not in m["hostPath"]]
    hooks = [h for h in hooks if without not in h["args"]]
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
            "deviceNodes": nodes,
            "mounts": mounts,
            "hooks": hooks,
        },
    }
    registry = root / "cdi"
    registry.mkdir()
    (registry / "nvidia.json").write_text(json.dumps(spec))
    return registry


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stand-ins built with gcc: ``libcuda`` (a dir holding libcuda.so.1), ``libvgpu`` (a
    HAMi-core that enforces) and one libvgpu per fault of FAULTS."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build hack/gpu-check-standin; run `bash hack/install.d/gcc.sh`")
    out = tmp_path_factory.mktemp("gpu-check-standin")
    flags = ["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"]
    libcuda = out / "cuda"
    libcuda.mkdir()
    builds = [(libcuda / "libcuda.so.1", STANDIN / "libcuda.c", ["-Wl,-soname,libcuda.so.1"])]
    builds.append((out / "libvgpu.so", STANDIN / "libvgpu.c", []))
    builds += [
        (out / f"libvgpu-{name}.so", STANDIN / "libvgpu.c", [f"-D{macro}"]) for name, macro in FAULTS.items()
    ]
    for target, source, extra in builds:
        subprocess.run([gcc, *flags, *extra, "-o", str(target), str(source), "-ldl"], check=True)
    return {"libcuda": libcuda, "libvgpu": out / "libvgpu.so", **{n: out / f"libvgpu-{n}.so" for n in FAULTS}}


def run_check(
    mock_nvml: dict[str, Path],
    tmp_path: Path,
    smi: list[str],
    registry: Path,
    *,
    libcuda: Path | None = None,
    hami_core: Path | None = None,
    dev_nodes: tuple[str, ...] = ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"),
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> tuple[int, str]:
    """The check as ``make gpu-check`` runs it, with the stand-in libcuda's dir on the loader's path
    when given (else no libcuda loads, as on this machine) and HAMi-core when given; no podman."""
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile()))
    fake_nvidia_smi(tmp_path / "bin", smi)
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for node in dev_nodes:
        (dev / node).write_text("")
    full = nvml_env(mock_nvml["current"], profile_path)
    for name in ("HAMI_CORE_LIB", "NVIDIA_DRIVER_ROOT", "NVIDIA_CTK", "GPU_CHECK_TIMEOUT", "STANDIN_DEV"):
        full.pop(name, None)
    if libcuda is not None:
        full["LD_LIBRARY_PATH"] = f"{libcuda}:{full['LD_LIBRARY_PATH']}"
    if hami_core is not None:
        full["HAMI_CORE_LIB"] = str(hami_core)
    full.update(
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{full['PATH']}",
        GPU_CHECK_PYTHON=sys.executable,
        NODE_NAME="node-1",
        STANDIN_DEV=str(dev),
        GPU_CHECK_SPIN_S="0.5",
        GPU_CHECK_PODMAN="none",
    )
    full.update(env or {})
    command = ["bash", str(SCRIPT), "--dev-root", str(dev), "--cdi-registry", str(registry), *args]
    proc = subprocess.run(command, env=full, capture_output=True, text=True, timeout=180, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def fail_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.lstrip().startswith("FAIL  ")]


def failed_steps(out: str) -> set[str]:
    """The steps the SUMMARY lists failures of (``  FAIL e: ...``)."""
    summary = [line for line in out.splitlines() if line.startswith("  FAIL ") and line[7] != " "]
    return {line.split()[1].rstrip(":") for line in summary}


def test_gpu_check_passes_against_the_mock(
    mock_nvml: dict[str, Path], standins: dict[str, Path], tmp_path: Path
) -> None:
    code, out = run_check(
        mock_nvml,
        tmp_path,
        smi_rows(UUIDS),
        toolkit_registry(tmp_path),
        libcuda=standins["libcuda"],
        hami_core=standins["libvgpu"],
    )
    assert code == 0, out
    assert not fail_lines(out), out
    ours = TOTAL_MIB - RESERVED_MIB
    gpu0, gpu3 = f"gpu-0 ({UUIDS[0]})", f"gpu-3 ({UUIDS[1]})"
    rules = "ResourceSlice API rules (names, <=128 devices, qualified names, values, policies)"
    # The stand-in HAMi-core charges a 600 MiB context: 4096 - 600 = 3496 MiB, 13 chunks of 256.
    stopped = (
        "allocation stopped at 3328 MiB (13 x 256 MiB) against limit 4096 MiB - context 600 MiB = 3496 MiB"
    )
    oom = "then cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"
    expected = [
        # a. discovery and slices
        "PASS  NVML discovery: 3 GPU(s)",
        f"PASS  {rules} for 1 slice(s), 2 device(s) without taints (Kubernetes < 1.36): 0 problem(s)",
        f"PASS  {rules} for 1 slice(s), 2 device(s) with device taints (1.36+): 0 problem(s)",
        "PASS  strict schemas of Kubernetes 1.34, 1.37 for 1 slice(s), 2 device(s) with device taints",
        # b. nvidia-smi: the MIG card absent (as a card; it has no MIG devices), memory = total -
        # reserved, names by minor
        "PASS  published GPUs = nvidia-smi's GPUs without MIG: 2 published, 3 in nvidia-smi, 1 with MIG",
        f"PASS  MIG-enabled {UUIDS[2]} (index 2) is absent from the slice as a card and present as its 0 MIG "
        "device(s) (none)",
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
        # d. CDI specs, composed with the toolkit's, with what CUDA in a container needs
        f"PASS  toolkit spec {tmp_path / 'cdi' / 'nvidia.json'} (kind nvidia.com/gpu) defines gpu-0",
        "PASS  whole card: no HAMi-core env or mounts (none)",
        "PASS  whole spec gives the container /dev/nvidia0 (3 device node(s), 2 mount(s), 2 hook(s))",
        "PASS  whole claim unprepared, spec removed",
        "PASS  share env: CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_DEVICE_MEMORY_LIMIT_0=4096m, "
        "CUDA_DEVICE_SM_LIMIT_0=30",
        f"PASS  share device env HAMI_DRA_GPU_0_UUID={UUIDS[0]}",
        "PASS  ld.so.preload mounted and names /usr/local/vgpu/libvgpu.so",
        "PASS  share spec gives the container /dev/nvidia0 (3 device node(s), 6 mount(s), 2 hook(s))",
        "PASS  share spec's host side exists",
        # e. CUDA and the memory limit, with the context HAMi-core charges
        "PASS  CUDA probe without HAMi-core on Stand-in GPU: cuDeviceTotalMem 16384 MiB, cuMemGetInfo free "
        "16384 MiB of 16384 MiB, 4 x 256 MiB allocated",
        "PASS  cuDeviceTotalMem with HAMi-core reads 4096 MiB (limit 4096 MiB; real 16384 MiB)",
        "PASS  HAMi-core reports 600 MiB in use before the first allocation (the CUDA context it charges "
        "to the share), of 4096 MiB",
        f"PASS  {stopped}, {oom}",
        # f. cores limit
        "PASS  share claim's environment sets CUDA_DEVICE_SM_LIMIT_0=30",
        "PASS  kernel loop without a cores limit (HAMi-core preloaded): ",
        "PASS  cores limit 30 %: kernel loop ",
        # g. two processes
        "PASS  the second process sees the first's memory: 2736 MiB in use before it allocates; the first "
        "holds 2136 MiB (6 x 256 MiB + context 600 MiB)",
        "PASS  the two together allocated 2816 MiB (6 + 5 x 256 MiB) against limit 4096 MiB - their "
        f"contexts 1200 MiB = 2896 MiB, {oom}",
        # h. PID namespace
        "PASS  probe runs as PID 1 of a new PID namespace",
        f"PASS  in the PID namespace: {stopped}, {oom}",
        "PASS  in the PID namespace: cores limit 30 %: kernel loop ",
        # i. no container runtime here: said, and the share unprepared all the same
        "SKIP  container: no container runtime (podman not found; GPU_CHECK_PODMAN names one)",
        "PASS  share claim unprepared, spec removed",
    ]
    # j. the MIG card is not changed without the flag
    expected.append(
        f"SKIP  MIG instance create/destroy on gpu-2 ({UUIDS[2]}): pass --allow-mig-changes to let the check"
    )
    missing = [line for line in expected if line not in out]
    assert not missing, "\n".join(["missing:", *missing, "output:", out])
    for step in "abcdefghij":
        assert f"[{step}] done in " in out
    assert "SUMMARY: " in out and ", 0 failed, " in out


def test_with_allow_mig_changes_one_instance_is_created_published_and_destroyed(
    mock_nvml: dict[str, Path], tmp_path: Path
) -> None:
    code, out = run_check(
        mock_nvml, tmp_path, smi_rows(UUIDS), toolkit_registry(tmp_path), args=("--allow-mig-changes",)
    )
    assert code == 0, out
    expected = [
        # The smallest H200 profile with room: 1g.18gb, at slice 0 (GPU instance 7).
        "PASS  created 1g.18gb (GPU instance 7) and its compute instance on gpu-2",
        "PASS  discovery publishes the new instance: gpu-2-mig-7-0 1g.18gb (expected gpu-2-mig-7-0 1g.18gb)",
        "PASS  destroyed it: discovery is back to 0 MIG device(s) on gpu-2",
    ]
    missing = [line for line in expected if line not in out]
    assert not missing, "\n".join(["missing:", *missing, "output:", out])


@pytest.mark.parametrize(
    ("fault", "line", "steps"),
    [
        ("memory-limit", "allocation stopped at 6144 MiB (24 x 256 MiB) against limit 4096 MiB - context "
         "600 MiB = 3496 MiB, and never stopped: the memory limit is NOT enforced", {"e", "g", "h"}),
        ("core-limit", "the cores limit is NOT enforced", {"f", "h"}),
        ("shared-region", "the second process sees the first's memory: 600 MiB in use before it "
         "allocates; the first holds 2136 MiB (6 x 256 MiB + context 600 MiB); the processes do NOT share "
         "the limit", {"g"}),
        ("pid-namespace", "in the PID namespace: cores limit 30 %: ", {"h"}),
    ],
)  # fmt: skip
def test_a_limit_not_enforced_fails_its_steps(
    mock_nvml: dict[str, Path],
    standins: dict[str, Path],
    tmp_path: Path,
    fault: str,
    line: str,
    steps: set[str],
) -> None:
    code, out = run_check(
        mock_nvml,
        tmp_path,
        smi_rows(UUIDS),
        toolkit_registry(tmp_path),
        libcuda=standins["libcuda"],
        hami_core=standins[fault],
    )
    assert code == 1, out
    assert [f for f in fail_lines(out) if line in f], out
    assert failed_steps(out) == steps, out
    if fault == "pid-namespace":
        assert "SET_TASK_PID FAILED, so it limits no cores" in out


@pytest.mark.parametrize("without", ["/dev/nvidiactl", "/dev/nvidia-uvm"])
def test_a_spec_and_host_without_a_control_node_fail_at_prepare(
    mock_nvml: dict[str, Path], tmp_path: Path, without: str
) -> None:
    """The plugin adds a control node the spec lacks from the host (kubeletplugin/control_nodes.py);
    where the host has no such device node either, both claims are refused at prepare, naming the fix."""
    code, out = run_check(mock_nvml, tmp_path, smi_rows(UUIDS), toolkit_registry(tmp_path, without))
    assert code == 1, out
    for label in ("whole", "share"):
        assert [
            line
            for line in fail_lines(out)
            if f"{label} claim" in line
            and f"the toolkit's spec has no {without}, which CUDA needs" in line
            and "nvidia-modprobe -u -c=0" in line
        ], out
    assert failed_steps(out) == {"d"}, out
    assert len(fail_lines(out)) == 2, out


@pytest.mark.parametrize(
    ("without", "line"),
    [
        ("libcuda", "mount of libcuda.so: MISSING (the CUDA driver library"),
        ("nvidia-smi", "mount of nvidia-smi: MISSING (the driver's nvidia-smi"),
        ("update-ldcache", "createContainer hook update-ldcache: MISSING (without it the loader cannot find "
         "the mounted libcuda.so.1"),
    ],
)  # fmt: skip
def test_a_spec_without_what_cuda_needs_fails(
    mock_nvml: dict[str, Path], tmp_path: Path, without: str, line: str
) -> None:
    code, out = run_check(mock_nvml, tmp_path, smi_rows(UUIDS), toolkit_registry(tmp_path, without))
    assert code == 1, out
    for label in ("whole", "share"):
        assert f"FAIL  {label} spec gives the container {line}" in out, out
    assert failed_steps(out) == {"d"}, out
    assert len(fail_lines(out)) == 2, out


def test_a_host_without_nvidia_uvm_fails(mock_nvml: dict[str, Path], tmp_path: Path) -> None:
    nodes = ("nvidia0", "nvidia3", "nvidiactl")
    # A "podman" that cannot run anything: the container step must say so, not fail the spec.
    env = {"GPU_CHECK_PODMAN": "false"}
    registry = toolkit_registry(tmp_path)
    code, out = run_check(mock_nvml, tmp_path, smi_rows(UUIDS), registry, dev_nodes=nodes, env=env)
    assert code == 1, out
    dev = tmp_path / "dev"
    assert (
        f"FAIL  share spec's host side exists (device nodes, mount sources, hook programs); missing: "
        f"{dev / 'nvidia-uvm'}; load nvidia-uvm first (nvidia-modprobe -u -c=0)"
    ) in out, out
    assert failed_steps(out) == {"d"}, out
    if os.geteuid() == 0:
        assert "SKIP  container: false cannot run the host's root as a container here (exit 1: " in out, out
    else:
        assert "SKIP  container: podman reads CDI specs from /var/run/cdi only as root" in out, out
    assert "PASS  share claim unprepared, spec removed" in out, out


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
    assert "FAIL b: published GPUs = nvidia-smi's GPUs without MIG" in out
    # Without a toolkit spec the plugin would withhold the GPUs; the claims get device nodes only,
    # which is no container CUDA can run in: each missing part is a FAIL of step d.
    assert "SKIP  NVIDIA Container Toolkit CDI spec: none in" in out
    assert "PASS  share spec's host side exists" in out
    assert "FAIL  share spec gives the container mount of libcuda.so: MISSING" in out
    assert failed_steps(out) == {"b", "d"}, out
    # No libcuda loads here (none is on the loader's path): step e says so, f-h follow it.
    if "SKIP  CUDA probe: libcuda.so.1 does not load" in out:
        assert "SKIP  HAMi-core cores limit: needs the working libcuda.so.1 of step e" in out


def test_a_driver_root_other_than_slash_gets_a_spec_of_the_hosts_nodes(
    mock_nvml: dict[str, Path], standins: dict[str, Path], tmp_path: Path
) -> None:
    """The GPU Operator's layout: the driver's files under a driver root, the device nodes in the
    host's /dev. The real nvidia-ctk must be told both, or it finds no nodes and the check fails."""
    toolkit = require_toolkit()
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile()))
    driver = mock_driver_root(tmp_path / "driver-root", profile_path)
    (driver.root / "dev").rename(tmp_path / "dev")  # the nodes live in the "host's" /dev only
    shutil.copyfile(standins["libcuda"] / "libcuda.so.1", driver.libcuda)  # step e loads it from the root
    empty = tmp_path / "no-spec"
    empty.mkdir()
    env = {"NVIDIA_DRIVER_ROOT": str(driver.root), "NVIDIA_CTK": str(toolkit / "nvidia-ctk")}
    code, out = run_check(mock_nvml, tmp_path, smi_rows(UUIDS), empty, dev_nodes=(), env=env)
    assert code == 0, out
    generated = f"PASS  no toolkit spec registered; generated one with {toolkit / 'nvidia-ctk'} cdi generate"
    assert generated in out, out
    assert f"--driver-root={driver.root} --dev-root={tmp_path} " in out, out
    assert "(kind nvidia.com/gpu) defines gpu-0 (/dev/nvidia0): yes" in out, out
    for need in ("device node /dev/nvidia-uvm: /dev/nvidia-uvm", "createContainer hook update-ldcache: "):
        assert f"PASS  share spec gives the container {need}" in out, out


def test_a_container_runs_through_the_composed_spec(
    mock_nvml: dict[str, Path], standins: dict[str, Path], tmp_path: Path
) -> None:
    """podman applies the share claim's spec (composed with the real nvidia-ctk's) to a container:
    the stand-in libcuda finds its nodes in the container's /dev, HAMi-core is preloaded by the
    spec's /etc/ld.so.preload, and the limits hold inside."""
    toolkit = require_toolkit()
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"missing {missing}: run hack/install.d/podman.sh")
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile()))
    # Without nvidia-drm: podman 4.3 reads specs up to cdiVersion 0.5.0, DRM nodes' groups need 0.7.0.
    driver = mock_driver_root(tmp_path / "driver-root", profile_path, DeviceFiles(drm=False))
    shutil.copyfile(standins["libcuda"] / "libcuda.so.1", driver.libcuda)
    spec = generate_spec("host", driver, tmp_path / "cdi", toolkit)
    assert spec is not None
    dev = driver.root / "dev"
    env = {"NVIDIA_DRIVER_ROOT": str(driver.root), "GPU_CHECK_PODMAN": "", "STANDIN_DEV": str(dev)}
    code, out = run_check(
        mock_nvml,
        tmp_path,
        smi_rows(UUIDS),
        spec.parent,
        hami_core=standins["libvgpu"],
        dev_nodes=(),
        env=env,
        args=("--dev-root", str(dev)),
    )
    assert code == 0, out
    expected = [
        "(podman, root overlaid from the host) ran: exit 0",
        "PASS  in the container the probe is PID 1",
        f"PASS  nvidia-smi -L in the container: exit 0: GPU 0: NVIDIA H200 (UUID: {UUIDS[0]})",
        "PASS  CUDA in the container on Stand-in GPU: cuDeviceTotalMem 4096 MiB",
        f"PASS  in the container libcuda is the spec's mount: /usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}",
        "PASS  in the container cuDeviceTotalMem reads 4096 MiB (limit 4096 MiB): HAMi-core preloaded "
        "through the spec's /etc/ld.so.preload",
        "PASS  in the container: allocation stopped at 3328 MiB (13 x 256 MiB) against limit 4096 MiB - "
        "context 600 MiB = 3496 MiB, then cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)",
        "PASS  in the container: cores limit 30 %: kernel loop ",
        "PASS  share claim unprepared, spec removed",
    ]
    absent = [line for line in expected if line not in out]
    assert not absent, "\n".join(["missing:", *absent, "output:", out])


def test_no_usable_python_is_said_plainly() -> None:
    env = {**os.environ, "GPU_CHECK_PYTHON": "/nonexistent/python3"}
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 2
    assert "no Python 3.11 or newer" in proc.stderr
