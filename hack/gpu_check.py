"""A check of this driver against real NVIDIA GPUs, for a person or CI on a GPU machine.

Run through ``hack/gpu-check.sh`` (which picks the Python and puts the repository on the path).
Everything the kubelet plugin does with the hardware is exercised through the plugin's own code,
so a pass means the shipped code works on this machine, not a re-implementation of it:

a. discovery through :class:`dra_driver.devices.nvml.NvmlSource` (``NVIDIA_DRIVER_ROOT`` honoured)
   into the ResourceSlices of :mod:`dra_driver.resource.slice_builder`, checked against the API
   server's rules that can be checked offline (``tests/kube_validate.py``; strict schemas too when
   ``kubernetes_validate`` is installed);
b. every published GPU cross-checked against ``nvidia-smi``, which reads the driver by another
   path: an error in our NVML use shows up as a disagreement;
c. the NVML health watcher the plugin starts (``NvmlHealthWatcher``) initialised and registered on
   every GPU, then stopped;
d. the CDI spec of a prepared claim, written by the plugin's :class:`Preparer` into a temporary
   directory (claims come from a stand-in for the API server), for one whole card and one share,
   composed with the NVIDIA Container Toolkit's spec as the plugin finds it (or as ``nvidia-ctk``,
   when it is here, generates it with the driver root and the dev root), checked to give a
   container what CUDA needs (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``libcuda``, ``nvidia-smi``,
   the ldcache hook) and everything it names checked to exist on the host;
e. a CUDA driver-API probe through ``ctypes``: without HAMi-core it proves ``libcuda`` works; with
   a HAMi-core ``libvgpu.so`` preloaded and the share claim's environment (what
   ``/etc/ld.so.preload`` does inside the container) allocation must stop at the memory limit
   minus the CUDA context HAMi-core reports charged to the share;
f. HAMi-core's cores limit: a kernel loop's throughput with the share's 30 % limit against the same
   loop without a cores limit;
g. two processes sharing one limit (one cache file): the second sees the first's memory and the
   two together stop at the limit;
h. a PID namespace (``unshare``): the probe as PID 1, as in a container, keeps both limits;
i. a container run through the share claim's composed CDI spec with ``podman`` where it is
   installed (and this runs as root: podman reads specs from ``/var/run/cdi``), its root the host's
   under an overlay (nothing to pull) and its ``/dev`` only what the spec gives: ``nvidia-smi``,
   ``cuInit`` with the spec's ``libcuda`` mount, HAMi-core preloaded by the spec's
   ``/etc/ld.so.preload``, and both limits inside it.

Each check prints ``PASS``, ``FAIL`` or ``SKIP`` with its figures; a check whose Python module is
missing is skipped naming the module, not failed, except discovery's ``pynvml``: without it nothing
is checked, and such a run must not end green. The exit status is 1 when anything failed.

What it needs installed, from PyPI only: ``nvidia-ml-py`` (required); ``grpcio``, ``protobuf``,
``PyYAML``, ``prometheus-client`` and ``kubernetes-validate`` (optional: the steps that use them
are skipped, named). The GPU work (allocation loops, the timed kernel loop, whose PTX the driver
compiles) goes through ``ctypes`` against the driver's ``libcuda.so.1``: nothing to install. From
the system, optional: ``nvidia-ctk`` (a spec when none is registered), ``unshare`` (step h),
``podman`` (step i), a HAMi-core ``libvgpu.so`` (steps e-i; without it they are SKIPs that say the
share's limits are not enforced). The whole run takes well under 8 minutes on one GPU
(``GPU_CHECK_TIMEOUT``, default 450 s, stops it).

Options: ``--node-name`` (default ``$NODE_NAME`` or the host name), ``--dev-root`` (where the
``nvidia*`` device nodes are, default ``/dev``), ``--nvidia-driver-root`` (default
``$NVIDIA_DRIVER_ROOT``), ``--cdi-registry`` (default ``/etc/cdi`` and ``/var/run/cdi``);
``--cuda-probe`` is the internal entry point of the probe subprocesses. Env: ``HAMI_CORE_LIB``,
``NVIDIA_CTK``, ``GPU_CHECK_SPIN_S`` (seconds of each timed kernel loop, default 6),
``GPU_CHECK_PODMAN`` (the podman program, ``none`` to skip step i).
Tests run this end to end against ``hack/mock-nvml``, a fake ``nvidia-smi`` and the stand-ins for
libcuda and HAMi-core in ``hack/gpu-check-standin`` (``tests/devices/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import glob
import importlib
import json
import logging
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, cast

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repository's packages must be importable
    sys.path.insert(0, str(REPO))

from dra_driver import DEFAULT_DRIVER_NAME  # noqa: E402  (needs the path above)
from dra_driver.devices.mig import mig_device_name  # noqa: E402
from dra_driver.devices.model import MIB, Gpu, normalize_pci_bus_id, semver  # noqa: E402

#: Python module -> the package that provides it, for the SKIP lines of a missing module.
PACKAGES = {
    "pynvml": "nvidia-ml-py",
    "prometheus_client": "prometheus-client",
    "grpc": "grpcio",
    "google": "protobuf",
    "yaml": "PyYAML",
    "kubernetes_validate": "kubernetes-validate",
    "jsonschema": "jsonschema",
}
#: The fields asked of ``nvidia-smi --query-gpu``; only ``index`` and ``uuid`` are essential,
#: the others are left out of the query when this driver's nvidia-smi does not know them.
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.reserved",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "mig.mode.current",
)
SMI_TIMEOUT_S = 60
#: Step e: size of one allocation, the limit a share claim asks for, and its SM percentage.
CHUNK = 256 * MIB
SHARE_MEMORY = 4096 * MIB
SHARE_CORES = 30
PROBE_TIMEOUT_S = 120
#: Steps f, h, i: seconds of each timed kernel loop; the limited loop's throughput against the
#: unlimited one must fall at or under MAX_CORES_RATIO (a 30 % limit gives about 0.3) and above
#: MIN_CORES_RATIO (a share starved far below its limit is broken too).
SPIN_S = 6.0
MAX_CORES_RATIO = 0.6
MIN_CORES_RATIO = 0.05
#: HAMi-core's words when it cannot find its host PID: it then enforces no cores limit.
TASK_PID_FAILED = "SET_TASK_PID FAILED"
#: Where HAMi installs libvgpu on the host (vgpu-init.sh), after ``$HAMI_CORE_LIB``.
HAMI_CORE_PATHS = ("/usr/local/vgpu/libvgpu.so",)
STOP_WITHIN_S = 5.0

_NOT_AVAILABLE = {"", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]"}
_DNS_LABEL_CHARS = re.compile(r"[^a-z0-9.-]+")


class _SliceRules(Protocol):
    """What this check uses of ``tests/kube_validate.py``, the API rules the tests hold the slices to."""

    KUBERNETES_VERSIONS: tuple[str, ...]

    def resource_slice_problems(self, obj: Mapping[str, Any]) -> list[str]: ...

    def validate_strict(self, obj: Mapping[str, Any], versions: Iterable[str] = ...) -> None: ...


class Report:
    """Counts and prints results; one line per check, indented under its step."""

    def __init__(self) -> None:
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        self.failures: list[str] = []
        self.step_key = ""
        self.log = _LogCollector()

    def result(self, status: str, text: str) -> None:
        self.counts[status] += 1
        if status == "FAIL":
            self.failures.append(f"{self.step_key}: {text}")
        print(f"  {status}  {text}", flush=True)

    def passed(self, text: str) -> None:
        self.result("PASS", text)

    def failed(self, text: str) -> None:
        self.result("FAIL", text)

    def skipped(self, text: str) -> None:
        self.result("SKIP", text)

    def expect(self, ok: bool, text: str) -> bool:
        """PASS or FAIL ``text`` by ``ok``; returns ``ok``."""
        self.result("PASS" if ok else "FAIL", text)
        return ok

    @staticmethod
    def note(text: str) -> None:
        print(f"        {text}", flush=True)

    @contextmanager
    def step(self, key: str, title: str) -> Iterator[None]:
        """One step: a header, its checks, the plugin's warnings logged meanwhile, the time taken.

        A missing module skips the rest of the step; any other exception fails it, so that one
        broken step never hides the results of the others.
        """
        self.step_key = key
        print(f"[{key}] {title}", flush=True)
        start = time.monotonic()
        self.log.records.clear()
        try:
            yield
        except ModuleNotFoundError as err:
            self.skipped(f"rest of step {key}: {missing_module(err)}")
        except Exception as err:
            self.failed(f"step {key} stopped: {type(err).__name__}: {err}")
            for line in traceback.format_exc().rstrip().splitlines()[-6:]:
                self.note(line)
        finally:
            for record in self.log.take():
                self.note(f"log {record.levelname}: {record.getMessage()}")
            print(f"[{key}] done in {time.monotonic() - start:.1f}s", flush=True)


class _LogCollector(logging.Handler):
    """Keeps the plugin's own warnings, printed under the step that caused them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        taken, self.records = self.records, []
        return taken


def missing_module(err: ModuleNotFoundError) -> str:
    """``python module pynvml missing (pip package nvidia-ml-py)``."""
    name = (err.name or "?").split(".")[0]
    package = PACKAGES.get(name)
    return f"python module {name} missing" + (f" (pip package {package})" if package else "")


@dataclass
class Context:
    """What the steps hand on to each other."""

    node_name: str
    dev_root: Path
    driver_root: Path | None
    cdi_registry: list[Path] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    share_env: dict[str, str] | None = None
    share: PreparedShare | None = None
    hami_core_lib: Path | None = None
    libcuda_works: bool = False
    context_bytes: int | None = None
    spin_rate: float | None = None
    spin_iterations: int = 0
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-check-")))
    #: Step j may create and destroy a MIG instance (``--allow-mig-changes``).
    allow_mig_changes: bool = False


@dataclass
class PreparedShare:
    """The share claim step d leaves prepared for the container run of step i, which unprepares it."""

    preparer: Any
    ref: Any
    spec_path: Path
    cdi_ids: list[str]
    limit_mib: int
    libcuda_mounts: list[str]


# -- a. discovery and ResourceSlices ---------------------------------------------------------------


def step_discovery(report: Report, ctx: Context) -> None:
    """NVML through the plugin's source, into the slices the plugin would publish."""
    from dra_driver.devices.source import DeviceSourceError, open_source
    from dra_driver.resource.slice_builder import build_resource_slices

    try:
        import pynvml  # noqa: F401  (the plugin's NVML binding; nothing below works without it)
    except ModuleNotFoundError as err:
        # A FAIL, not a SKIP: a run that discovered nothing must not end green.
        report.failed(f"NVML discovery: {missing_module(err)}; every GPU check depends on it")
        return
    try:
        source = open_source("nvml", node_name=ctx.node_name, driver_root=ctx.driver_root)
        started = time.monotonic()
        gpus = source.discover()
    except DeviceSourceError as err:
        report.failed(f"NVML discovery: {err}")
        return
    library = _loaded_library("libnvidia-ml") or "libnvidia-ml.so.1 through the loader"
    where = f"driver root {ctx.driver_root}" if ctx.driver_root else "no NVIDIA_DRIVER_ROOT"
    if not report.expect(
        bool(gpus),
        f"NVML discovery: {len(gpus)} GPU(s) in {time.monotonic() - started:.2f}s "
        f"({library}; {where}; MIG-mode cards as their MIG devices)",
    ):
        return
    ctx.gpus = gpus
    for gpu in gpus:
        report.note(
            f"{gpu.name}: index {gpu.index}, {gpu.uuid}, {gpu.product_name}, "
            f"{gpu.memory_bytes // MIB}Mi, {gpu.architecture or '?'} {gpu.cuda_compute_capability or '?'}, "
            f"PCI {gpu.pci_bus_id or '?'}, NUMA {gpu.numa_node if gpu.numa_node is not None else '?'}, "
            f"driver {gpu.driver_version or '?'}, CUDA {gpu.cuda_driver_version or '?'}, "
            f"NVLink peers {list(gpu.nvlink_peers) or 'none'}"
        )
    # The publisher asks for device taints only from API servers that keep them (1.36+).
    for label, taints in (
        ("without taints (Kubernetes < 1.36)", False),
        ("with device taints (1.36+)", True),
    ):
        slices = build_resource_slices(
            gpus,
            driver_name=DEFAULT_DRIVER_NAME,
            node_name=ctx.node_name,
            policy_taint=taints,
            taint_unhealthy=taints,
        )
        if not ctx.slices:
            ctx.slices = slices
        devices = sum(len(s["spec"]["devices"]) for s in slices)
        _validate_slices(report, slices, f"{len(slices)} slice(s), {devices} device(s) {label}")


def _validate_slices(report: Report, slices: Sequence[Mapping[str, Any]], what: str) -> None:
    """The rules we re-implement always; the strict schemas when kubernetes_validate is there."""
    try:
        # Imported by name: the test helper is not part of what mypy checks.
        kube_validate = cast(_SliceRules, importlib.import_module("tests.kube_validate"))
    except ImportError:
        report.skipped(f"API rules for {what}: tests/kube_validate.py not found in the repository")
        return
    problems = [p for s in slices for p in kube_validate.resource_slice_problems(s)]
    attributes = max(
        (
            len(d.get("attributes", {})) + len(d.get("capacity", {}))
            for s in slices
            for d in s["spec"]["devices"]
        ),
        default=0,
    )
    report.expect(
        not problems,
        f"ResourceSlice API rules (names, <=128 devices, qualified names, values, policies) for {what}: "
        f"{len(problems)} problem(s), at most {attributes}/32 attributes+capacities per device",
    )
    for problem in problems[:20]:
        report.note(problem)
    try:
        import kubernetes_validate  # noqa: F401  (only whether it is there)
    except ModuleNotFoundError as err:
        report.skipped(f"strict schemas for {what}: {missing_module(err)}")
        return
    versions = kube_validate.KUBERNETES_VERSIONS
    try:
        for slice_ in slices:
            kube_validate.validate_strict(slice_, versions)
    except AssertionError as err:
        report.failed(f"strict schemas {', '.join(versions)} for {what}: {err}")
    else:
        report.passed(f"strict schemas of Kubernetes {', '.join(versions)} for {what}")


def _loaded_library(stem: str) -> str | None:
    """Path of the shared library ``stem*`` mapped into this process (Linux), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/" in path and Path(path).name.startswith(stem):
            return path
    return None


# -- b. nvidia-smi -------------------------------------------------------------------------------


def step_nvidia_smi(report: Report, ctx: Context) -> None:
    """Every published GPU against nvidia-smi; MIG-enabled cards must be absent as whole cards
    and present as their MIG devices."""
    if not ctx.gpus:
        report.skipped("needs the GPUs of step a")
        return
    smi = _find_nvidia_smi(ctx.driver_root)
    if smi is None:
        report.failed("nvidia-smi not found on PATH, /usr/bin or /usr/local/nvidia/bin")
        return
    help_text = _run([smi, "--help-query-gpu"]).stdout
    fields = [f for f in SMI_FIELDS if not help_text or f'"{f}"' in help_text]
    lacking = [f for f in SMI_FIELDS if f not in fields]
    if "uuid" not in fields or "index" not in fields:
        report.failed(f"nvidia-smi {smi} cannot be queried for index and uuid")
        return
    proc = _run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if proc.returncode != 0:
        report.failed(f"{smi} --query-gpu failed ({proc.returncode}): {proc.stderr.strip()[:300]}")
        return
    rows = _parse_smi(proc.stdout, fields)
    report.passed(
        f"{smi}: {len(rows)} GPU(s); fields {', '.join(fields)}"
        + (f"; this driver's nvidia-smi lacks {', '.join(lacking)}" if lacking else "")
    )
    by_uuid = {uuid_: row for row in rows if (uuid_ := row.get("uuid"))}
    published = {gpu.uuid: gpu for gpu in ctx.gpus if not gpu.mig_enabled}
    mig = {u for u, row in by_uuid.items() if (row.get("mig.mode.current") or "").lower() == "enabled"}
    expected = set(by_uuid) - mig
    report.expect(
        set(published) == expected,
        f"published GPUs = nvidia-smi's GPUs without MIG: {len(published)} published, {len(by_uuid)} in "
        f"nvidia-smi, {len(mig)} with MIG enabled"
        + _difference(set(published) - expected, "published but not in nvidia-smi (or in MIG mode)")
        + _difference(expected - set(published), "in nvidia-smi but not published"),
    )
    devices = {d["name"]: d for s in ctx.slices for d in s["spec"]["devices"]}
    slice_uuids = {d.get("attributes", {}).get("uuid", {}).get("string") for d in devices.values()}
    mig_cards = {gpu.uuid: gpu for gpu in ctx.gpus if gpu.mig_enabled}
    for u in sorted(mig):
        card = mig_cards.get(u)
        names = [mig_device_name(card.name, m) for m in card.mig_devices] if card else []
        report.expect(
            u not in slice_uuids and card is not None and all(name in devices for name in names),
            f"MIG-enabled {u} (index {by_uuid[u]['index']}) is absent from the slice as a card and "
            f"present as its {len(names)} MIG device(s) ({', '.join(names) or 'none'})",
        )
    for gpu in ctx.gpus:
        row = by_uuid.get(gpu.uuid)
        if row is None or gpu.mig_enabled:
            continue
        _cross_check(report, ctx, gpu, row, devices.get(gpu.name, {}))


def _difference(items: set[str], what: str) -> str:
    return f"; {what}: {', '.join(sorted(items))}" if items else ""


def _cross_check(
    report: Report, ctx: Context, gpu: Gpu, row: dict[str, str | None], device: dict[str, Any]
) -> None:
    """One GPU, field by field; a field nvidia-smi does not report is skipped, not failed."""
    who = f"{gpu.name} ({gpu.uuid})"
    attributes = device.get("attributes", {})

    def compare(label: str, ours: object, theirs: str | None, detail: str = "") -> None:
        if theirs is None:
            report.skipped(f"{who} {label}: nvidia-smi does not report it (ours {ours})")
        else:
            report.expect(str(ours) == theirs, f"{who} {label}: ours {ours}, nvidia-smi {theirs}{detail}")

    compare("index", gpu.index, row.get("index"))
    compare("product name", gpu.product_name, row.get("name"))
    _check_memory(report, who, gpu, row, device)
    bus = row.get("pci.bus_id")
    if bus is None:
        report.skipped(f"{who} PCI bus id: nvidia-smi does not report it")
    else:
        theirs = normalize_pci_bus_id(bus)
        attribute = attributes.get("resource.kubernetes.io/pciBusID", {}).get("string")
        report.expect(
            gpu.pci_bus_id == theirs == attribute,
            f"{who} PCI bus id: nvidia-smi {bus} -> {theirs}; ours {gpu.pci_bus_id}, slice {attribute}",
        )
    driver = row.get("driver_version")
    if driver is None:
        report.skipped(f"{who} driver version: nvidia-smi does not report it")
    else:
        attribute = attributes.get("driverVersion", {}).get("version")
        report.expect(
            gpu.driver_version == driver and attribute == semver(driver),
            f"{who} driver version: nvidia-smi {driver}; ours {gpu.driver_version}, "
            f"slice {attribute} (semver)",
        )
    compare("compute capability", gpu.cuda_compute_capability, row.get("compute_cap"))
    mig = row.get("mig.mode.current")
    ours = {True: "enabled", False: "disabled", None: "unknown"}[gpu.mig_enabled]
    report.expect(
        not gpu.mig_enabled and (mig or "").lower() != "enabled",
        f"{who} MIG mode: ours {ours}, nvidia-smi {mig or 'not reported'}",
    )
    _check_name(report, ctx, who, gpu)


def _check_memory(
    report: Report, who: str, gpu: Gpu, row: dict[str, str | None], device: dict[str, Any]
) -> None:
    """Ours is NVML's total minus reserved, rounded down to Mi; nvidia-smi prints both in MiB."""
    ours = gpu.memory_bytes // MIB
    capacity = device.get("capacity", {}).get("memory", {}).get("value")
    total, reserved = _int(row.get("memory.total")), _int(row.get("memory.reserved"))
    if total is None:
        report.skipped(f"{who} memory: nvidia-smi does not report memory.total (ours {ours}Mi)")
        return
    if reserved is None:
        report.expect(
            ours <= total and capacity == f"{ours}Mi",
            f"{who} memory: ours {ours}Mi (slice {capacity}) <= nvidia-smi total {total} MiB; this "
            "nvidia-smi has no memory.reserved, so the reservation cannot be checked",
        )
        return
    # nvidia-smi rounds total and reserved to MiB on their own, so the difference may be 1 MiB off.
    difference = ours - (total - reserved)
    report.expect(
        abs(difference) <= 1 and capacity == f"{ours}Mi",
        f"{who} memory: ours {ours}Mi (slice {capacity}) = nvidia-smi total {total} - reserved {reserved} "
        f"= {total - reserved} MiB ({difference:+d} MiB)",
    )


def _check_name(report: Report, ctx: Context, who: str, gpu: Gpu) -> None:
    """The device is named ``gpu-<minor>``; the minor is confirmed by the kernel's view if it has one."""
    if gpu.minor is None:
        report.failed(f"{who} name: NVML gave no minor number, so the GPU is named by its shifting index")
        return
    named = gpu.name == f"gpu-{gpu.minor}"
    proc_info = Path("/proc/driver/nvidia/gpus") / (gpu.pci_bus_id or "?") / "information"
    node = ctx.dev_root / f"nvidia{gpu.minor}"
    kernel = _proc_minor(proc_info)
    if kernel is not None:
        report.expect(
            named and kernel == gpu.minor,
            f"{who} name {gpu.name}: NVML minor {gpu.minor}, {proc_info} says Device Minor {kernel}",
        )
    elif node.exists():
        report.expect(named, f"{who} name {gpu.name}: NVML minor {gpu.minor}, {node} exists")
    else:
        report.expect(
            named,
            f"{who} name {gpu.name}: NVML minor {gpu.minor} (neither {proc_info} nor {node} to confirm it)",
        )


def _proc_minor(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"^Device Minor:\s*(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _find_nvidia_smi(driver_root: Path | None) -> str | None:
    found = shutil.which("nvidia-smi")
    if found:
        return found
    candidates = ["/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"]
    if driver_root is not None:
        candidates.insert(0, str(driver_root / "usr/bin/nvidia-smi"))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def _parse_smi(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    rows = []
    for values in csv.reader(text.splitlines(), skipinitialspace=True):
        if not values:
            continue
        cells = [v.strip() for v in values]
        rows.append({f: (None if v in _NOT_AVAILABLE else v) for f, v in zip(fields, cells, strict=False)})
    return rows


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def _run(
    command: Sequence[str], timeout: float = SMI_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(list(command), 127, "", str(err))


# -- c. health watcher -----------------------------------------------------------------------------


def step_health(report: Report, ctx: Context) -> None:
    """Start the watcher the plugin starts, see every GPU registered, watch briefly, stop it."""
    if not ctx.gpus:
        report.skipped("needs the GPUs of step a")
        return
    import pynvml  # noqa: F401  (a missing module skips the step with its name)

    uuids = {gpu.name: gpu.uuid for gpu in ctx.gpus}
    unhealthy: dict[str, str] = {}
    watcher: Any
    try:
        from dra_driver.kubeletplugin.health import HealthState, NvmlHealthWatcher
    except Exception as err:  # grpc missing, or generated protobuf code newer than the runtime
        from dra_driver.devices.nvml_events import NvmlEventWatcher

        why = missing_module(err) if isinstance(err, ModuleNotFoundError) else f"{type(err).__name__}: {err}"
        report.note(f"{why}: using NvmlEventWatcher, which the plugin's NvmlHealthWatcher wraps")
        watcher = NvmlEventWatcher(uuids, unhealthy.update, wait_ms=250, retry_s=0.25)
        state = None
    else:
        state = HealthState(list(uuids))
        watcher = NvmlHealthWatcher(uuids, state, wait_ms=250, retry_s=0.25)
    started = time.monotonic()
    thread = watcher.start()
    if not report.expect(
        thread is not None,
        f"health watcher initialised NVML and started in {time.monotonic() - started:.2f}s",
    ):
        return
    monitored = set(watcher.monitored)
    masks = _event_masks(uuids)
    for name, gpu_uuid in sorted(uuids.items()):
        report.expect(
            name in monitored,
            f"{name} ({gpu_uuid}) {'registered' if name in monitored else 'NOT registered'} for NVML events; "
            f"supported {masks.get(name, '?')}",
        )
    time.sleep(1.0)
    if state is not None:
        unhealthy = state.unhealthy()
    report.expect(not unhealthy, f"no XID or ECC event in 1s of watching: {unhealthy or 'none'}")
    stopping = time.monotonic()
    watcher.stop()
    thread.join(STOP_WITHIN_S)
    took = time.monotonic() - stopping
    report.expect(
        not thread.is_alive(),
        f"watcher stopped and gave NVML back in {took:.2f}s (limit {STOP_WITHIN_S:.0f}s)",
    )


def _event_masks(uuids: Mapping[str, str]) -> dict[str, str]:
    """``nvmlDeviceGetSupportedEventTypes`` per GPU, as names, through a session of our own."""
    from dra_driver.devices.nvml_session import NvmlSession

    names = {0x8: "XID", 0x2: "DBE", 0x1: "SBE"}
    masks: dict[str, str] = {}
    with NvmlSession() as nvml:
        for name, gpu_uuid in uuids.items():
            try:
                mask = int(nvml.nvmlDeviceGetSupportedEventTypes(nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)))
            except nvml.NVMLError as err:
                masks[name] = f"unknown ({err})"
                continue
            listed = "+".join(label for bit, label in names.items() if mask & bit) or "none"
            masks[name] = f"{listed} (mask {mask:#x})"
    return masks


# -- d. CDI spec of a prepared claim ---------------------------------------------------------------


class _Claims:
    """Stands in for the API server: the plugin reads each claim it prepares from here."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def add(self, namespace: str, name: str, results: list[dict[str, Any]]) -> Any:
        from dra_driver.kubeletplugin.claims import ClaimRef

        uid = str(uuid.uuid4())
        self.claims[uid] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        return ClaimRef(namespace, name, uid)

    def get(self, ref: Any) -> dict[str, Any]:
        return self.claims[ref.uid]

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        return uid in self.claims


def step_cdi(report: Report, ctx: Context) -> None:
    """Prepare a share, then a whole-card claim on the first GPU with the plugin's Preparer."""
    if not ctx.gpus:
        report.skipped("needs the GPUs of step a")
        return
    from dra_driver.kubeletplugin.checkpoint import Checkpoint, read_boot_id
    from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
    from dra_driver.kubeletplugin.inventory import Inventory, node_gpu
    from dra_driver.kubeletplugin.prepare import Preparer, PreparerConfig

    gpu = next((g for g in ctx.gpus if not g.mig_enabled), None)
    if gpu is None:
        report.skipped("every GPU is in MIG mode: no card to prepare whole or as a share")
        return
    plugin_dir, cdi_dir = ctx.work / "plugin", ctx.work / "cdi"
    hami = HamiCoreConfig(plugin_dir / "hami-core", ctx.hami_core_lib)
    if ctx.hami_core_lib is not None:
        hami.ensure_preload_file()  # what the plugin does at start when a library is configured
    claims = _Claims()
    preparer = Preparer(
        PreparerConfig(
            driver=DEFAULT_DRIVER_NAME,
            pool=ctx.node_name,
            cdi_dir=cdi_dir,
            hami=hami,
            simulated=False,
            boot_id=read_boot_id(),
        ),
        Inventory([node_gpu(gpu)]),
        claims,
        Checkpoint(plugin_dir / "checkpoint.json"),
        toolkit=_toolkit_registry(report, ctx, gpu),
    )
    preparer.start()
    memory = min(SHARE_MEMORY, gpu.memory_bytes // 2 // MIB * MIB)
    result = {"driver": DEFAULT_DRIVER_NAME, "pool": ctx.node_name, "device": gpu.name, "request": "gpu"}
    share = claims.add(
        "gpu-check",
        "share",
        [{**result, "shareID": str(uuid.uuid4()),
          "consumedCapacity": {"memory": f"{memory // MIB}Mi", "cores": str(SHARE_CORES), "slots": "1"}}],
    )  # fmt: skip
    whole = claims.add("gpu-check", "whole", [result])
    report.note(f"HAMi-core library: {ctx.hami_core_lib or 'none (the share gets its limits as env only)'}")
    # One after the other: a whole card and a share of it cannot be prepared at the same time. The
    # share stays prepared for the container run of step i, which unprepares it.
    for label, ref in (("whole", whole), ("share", share)):
        answer = preparer.prepare([ref])[ref.uid]
        if not report.expect(
            not answer.error, f"{label} claim {ref.uid} prepared on {gpu.name}: {answer.error or 'ok'}"
        ):
            continue
        ids = [i for d in answer.devices for i in d.cdi_ids]
        path = cdi_dir / preparer.names.spec_file_name(ref.uid)
        spec = json.loads(path.read_text())
        report.note(f"CDI ids {ids}; {path.name}:")
        _print_spec(spec)
        names = {f"{spec.get('kind')}={d.get('name')}" for d in spec.get("devices", [])}
        report.expect(
            bool(ids) and set(ids) <= names,
            f"{label} claim's CDI ids all name devices of its own spec (kind {spec.get('kind')}, "
            f"cdiVersion {spec.get('cdiVersion')})",
        )
        if label == "share":
            _check_share_spec(report, ctx, spec, gpu, memory)
        else:
            _check_whole_spec(report, spec, gpu)
        _check_container_needs(report, spec, label)
        _check_host_side(report, ctx, spec, gpu, label)
        if label == "share":
            libcuda = [
                str(m.get("containerPath"))
                for e in _all_edits(spec)
                for m in e.get("mounts") or []
                if Path(str(m.get("containerPath", ""))).name.startswith("libcuda.so")
            ]
            ctx.share = PreparedShare(preparer, ref, path, ids, memory // MIB, libcuda)
        else:
            _unprepare(report, preparer, ref, path, label)


def _unprepare(report: Report, preparer: Any, ref: Any, path: Path, label: str) -> None:
    error = preparer.unprepare([ref])[ref.uid]
    report.expect(
        not error and not path.exists(),
        f"{label} claim unprepared, spec removed{': ' + error if error else ''}",
    )


def _toolkit_registry(report: Report, ctx: Context, gpu: Gpu) -> Any:
    """The NVIDIA Container Toolkit's spec the plugin composes real GPUs' specs with, as the plugin
    finds it; generated with ``nvidia-ctk`` into the work dir when none is registered and the
    program is there. None (device nodes only) when there is none at all, with a SKIP that says
    the plugin would then withhold the GPUs."""
    from dra_driver.kubeletplugin.toolkit import TOOLKIT_KINDS, ToolkitRegistry

    ours = f"k8s.{DEFAULT_DRIVER_NAME}-"
    registry = ToolkitRegistry(tuple(ctx.cdi_registry), TOOLKIT_KINDS, Path("/"), ignore_prefix=ours)
    edits, errors = registry.current()
    where = ", ".join(str(d) for d in ctx.cdi_registry)
    if edits is None:
        generated = _generate_toolkit_spec(report, ctx)
        if generated is not None:
            registry = ToolkitRegistry((generated,), TOOLKIT_KINDS, Path("/"), ignore_prefix=ours)
            edits, errors = registry.current()
            where = str(generated)
    for error in errors:
        report.note(f"toolkit spec problem: {error}")
    if edits is None:
        report.skipped(
            f"NVIDIA Container Toolkit CDI spec: none in {where}, so the plugin would withhold every GPU "
            "here; the claims below get device nodes only (as with --nvidia-cdi-kind '')"
        )
        return None
    minor = gpu.minor if gpu.minor is not None else gpu.index
    problem = edits.problem(minor)
    report.expect(
        problem is None,
        f"toolkit spec {edits.source} (kind {edits.kind}) defines {gpu.name} (/dev/nvidia{minor}): "
        f"{problem or 'yes'}; {len(edits.by_minor)} GPU(s) defined, {len(edits.stale)} stale",
    )
    return registry


def _generate_toolkit_spec(report: Report, ctx: Context) -> Path | None:
    """``nvidia-ctk cdi generate`` (``$NVIDIA_CTK`` or on PATH) into the work dir, if it is here."""
    ctk = os.environ.get("NVIDIA_CTK") or shutil.which("nvidia-ctk")
    if not ctk:
        return None
    out = ctx.work / "cdi-registry"
    out.mkdir(exist_ok=True)
    command = [ctk, "cdi", "generate", f"--output={out / 'nvidia.yaml'}"]
    if ctx.driver_root is not None:
        command.append(f"--driver-root={ctx.driver_root}")
    # nvidia-ctk looks for the device nodes below <dev root>/dev, and its dev root defaults to the
    # driver root: with a driver root other than / (the GPU Operator's /run/nvidia/driver) the
    # nodes in the host's /dev would not be found. Ours names the dev directory itself.
    command.append(f"--dev-root={ctk_dev_root(ctx.dev_root)}")
    hook = Path(ctk).resolve().parent / "nvidia-cdi-hook"
    if hook.is_file():
        command.append(f"--nvidia-cdi-hook-path={hook}")
    proc = _run(command)
    if not report.expect(
        proc.returncode == 0 and (out / "nvidia.yaml").is_file(),
        f"no toolkit spec registered; generated one with {' '.join(command)}: exit {proc.returncode}",
    ):
        for line in proc.stderr.strip().splitlines()[-5:]:
            report.note(f"nvidia-ctk: {line}")
        return None
    return out


def ctk_dev_root(dev_root: Path) -> Path:
    """nvidia-ctk's ``--dev-root`` (the directory that holds ``dev/``) for our ``--dev-root``
    (the directory that holds the ``nvidia*`` nodes): ``/dev`` gives ``/``."""
    return dev_root.parent if dev_root.name == "dev" else dev_root


def _print_spec(spec: Mapping[str, Any], limit: int = 12) -> None:
    """The spec one edit a line (JSON would take a screen per spec); long lists are cut at ``limit``."""
    Report.note(f"  kind {spec.get('kind')}, cdiVersion {spec.get('cdiVersion')}")
    parts = [(f"device {d.get('name')}", d.get("containerEdits", {})) for d in spec.get("devices", [])]
    for where, edits in [*parts, ("spec-wide", spec.get("containerEdits", {}))]:
        lines = [f"env {item}" for item in edits.get("env") or []]
        lines += [
            f"node {n.get('path')}" + (f" <- {n['hostPath']}" if "hostPath" in n else "")
            for n in edits.get("deviceNodes") or []
        ]
        lines += [f"mount {m.get('containerPath')} <- {m.get('hostPath')}" for m in edits.get("mounts") or []]
        lines += [
            f"hook {h.get('hookName')} {' '.join([str(h.get('path')), *(h.get('args') or [])[1:]])}"
            for h in edits.get("hooks") or []
        ]
        for line in lines[:limit]:
            Report.note(f"  {where}: {line}")
        if len(lines) > limit:
            Report.note(f"  {where}: ... {len(lines) - limit} more")


def _env(edits: Mapping[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in edits.get("env") or [])


def _device_env(spec: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for d in spec.get("devices", []) for k, v in _env(d.get("containerEdits", {})).items()}


def _check_share_spec(report: Report, ctx: Context, spec: Mapping[str, Any], gpu: Gpu, memory: int) -> None:
    """HAMi-core's environment for the share, its cache on a mount, and the preload if any."""
    common = spec.get("containerEdits", {})
    env = _env(common)
    wanted = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{memory // MIB}m",
        "CUDA_DEVICE_SM_LIMIT_0": str(SHARE_CORES),
    }
    wrong = {k: env.get(k) for k, v in wanted.items() if env.get(k) != v}
    report.expect(
        not wrong and "CUDA_VISIBLE_DEVICES" not in env,
        f"share env: {', '.join(f'{k}={v}' for k, v in wanted.items())}; no CUDA_VISIBLE_DEVICES"
        + (f"; wrong: {wrong}" if wrong else ""),
    )
    key = f"HAMI_DRA_GPU_{gpu.index}_UUID"
    report.expect(
        _device_env(spec).get(key) == gpu.uuid, f"share device env {key}={_device_env(spec).get(key)}"
    )
    mounts = common.get("mounts") or []
    cache = env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    cache_mount = next((m for m in mounts if cache.startswith(m["containerPath"] + "/")), None)
    host = Path(cache_mount["hostPath"]) if cache_mount else None
    report.expect(
        host is not None and host.is_dir() and host.stat().st_mode & 0o777 == 0o777,
        f"HAMi-core cache {cache} is on a mount of a host directory every UID can write: "
        f"{host or 'no such mount'}",
    )
    if ctx.hami_core_lib is not None:
        preload = next((m for m in mounts if m["containerPath"] == "/etc/ld.so.preload"), None)
        content = Path(preload["hostPath"]).read_text().strip() if preload else ""
        report.expect(
            content == "/usr/local/vgpu/libvgpu.so", f"ld.so.preload mounted and names {content or 'nothing'}"
        )
    else:
        report.skipped(
            "preload of libvgpu.so: no HAMi-core library here, so the share's limits are not enforced"
        )
    # Step e applies this environment to a process, with a private cache file instead of the mount.
    ctx.share_env = {k: v for k, v in env.items() if k != "CUDA_DEVICE_MEMORY_SHARED_CACHE"}


def _check_whole_spec(report: Report, spec: Mapping[str, Any], gpu: Gpu) -> None:
    common = spec.get("containerEdits", {})
    found = [k for k in _env(common) if k.startswith("CUDA_")] + [
        m["containerPath"]
        for m in common.get("mounts") or []
        if m["containerPath"].startswith("/usr/local/vgpu")
    ]
    report.expect(not found, f"whole card: no HAMi-core env or mounts ({', '.join(found) or 'none'})")
    key = f"HAMI_DRA_GPU_{gpu.index}_UUID"
    report.expect(
        _device_env(spec).get(key) == gpu.uuid, f"whole card device env {key}={_device_env(spec).get(key)}"
    )


def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The spec-wide edits and every device's: what a container given all its devices receives."""
    return [spec.get("containerEdits", {}), *(d.get("containerEdits", {}) for d in spec.get("devices", []))]


#: What CUDA inside a container needs from the spec besides the GPU's own node, each with the fix
#: that names what to do when it is missing. Control nodes are matched by path, the library and
#: the program by the mount's container path, the hook by its arguments.
_CONTAINER_NEEDS: tuple[tuple[str, str, str], ...] = (
    ("node", "/dev/nvidiactl", "the NVIDIA driver's control node; regenerate the toolkit spec"),
    (
        "node",
        "/dev/nvidia-uvm",
        "cuInit fails without it; load nvidia-uvm (nvidia-modprobe -u -c=0) and regenerate the "
        "toolkit spec (toolkit <= 1.20.0 leaves out nodes that did not exist at generation)",
    ),
    ("mount", "libcuda.so", "the CUDA driver library; regenerate the toolkit spec with the driver root"),
    ("mount", "nvidia-smi", "the driver's nvidia-smi; regenerate the toolkit spec with the driver root"),
    (
        "hook",
        "update-ldcache",
        "without it the loader cannot find the mounted libcuda.so.1; regenerate the toolkit spec",
    ),
)


def _check_container_needs(report: Report, spec: Mapping[str, Any], label: str) -> None:
    """The composed spec gives the container what CUDA needs: one line per need, the fix on a FAIL."""
    edits = _all_edits(spec)
    nodes = {str(n.get("path")) for e in edits for n in e.get("deviceNodes") or []}
    mounts = [str(m.get("containerPath", "")) for e in edits for m in e.get("mounts") or []]
    hooks = [" ".join(map(str, h.get("args") or [])) for e in edits for h in e.get("hooks") or []]
    for kind, name, fix in _CONTAINER_NEEDS:
        if kind == "node":
            found = [name] if name in nodes else []
        elif kind == "mount":
            found = [m for m in mounts if Path(m).name.startswith(name)]
        else:
            found = [h for h in hooks if name in h.split()]
        what = {"node": "device node", "mount": "mount of", "hook": "createContainer hook"}[kind]
        report.expect(
            bool(found),
            f"{label} spec gives the container {what} {name}: "
            + (", ".join(found[:2]) if found else f"MISSING ({fix})"),
        )


def _check_host_side(report: Report, ctx: Context, spec: Mapping[str, Any], gpu: Gpu, label: str) -> None:
    """What the runtime needs on the host to apply the spec: a container would not start without it.

    Every device node (``/dev`` read below ``--dev-root``), every mount's host path and every hook
    program must exist, and the GPU's own node must be among the device nodes. A missing
    ``nvidia-uvm*`` fails too: the runtime cannot create a node the host lacks, and CUDA needs it.
    """
    edits = _all_edits(spec)
    nodes = [n for e in edits for n in e.get("deviceNodes") or []]
    mounts = [m for e in edits for m in e.get("mounts") or []]
    hooks = [h for e in edits for h in e.get("hooks") or []]
    minor = gpu.minor if gpu.minor is not None else gpu.index
    report.expect(
        any(n.get("path") == f"/dev/nvidia{minor}" for n in nodes),
        f"{label} spec gives the container /dev/nvidia{minor} ({len(nodes)} device node(s), {len(mounts)} "
        f"mount(s), {len(hooks)} hook(s))",
    )
    missing: list[str] = []
    for node in nodes:
        host = str(node.get("hostPath") or node.get("path", ""))
        seen = ctx.dev_root / host[len("/dev/") :] if host.startswith("/dev/") else Path(host)
        if not seen.exists():
            missing.append(str(seen))
    missing += [str(m["hostPath"]) for m in mounts if not Path(str(m.get("hostPath", ""))).exists()]
    missing += [str(h["path"]) for h in hooks if not os.access(str(h.get("path", "")), os.X_OK)]
    uvm = any(Path(m).name.startswith("nvidia-uvm") for m in missing)
    report.expect(
        not missing,
        f"{label} spec's host side exists (device nodes, mount sources, hook programs)"
        + (f"; missing: {', '.join(missing)}" if missing else "")
        + ("; load nvidia-uvm first (nvidia-modprobe -u -c=0)" if uvm else ""),
    )


# -- e. CUDA and HAMi-core's memory limit ----------------------------------------------------------

#: A kernel that runs ``iterations`` dependent multiply-adds per thread, as PTX: the driver compiles
#: it for whatever GPU it finds, so no CUDA toolkit is needed. The store happens only if the value
#: reaches 0, which it never does; it keeps the compiler from dropping the loop.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(
    .param .u32 spin_iterations,
    .param .u64 spin_out
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<3>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<3>;

    ld.param.u32 %r1, [spin_iterations];
    ld.param.u64 %rd1, [spin_out];
    mov.u32 %r2, 0;
    mov.f32 %f1, 0f3F800000;
SPIN_LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFEF, 0f38D1B717;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra SPIN_LOOP;
    setp.eq.f32 %p2, %f1, 0f00000000;
    @!%p2 bra SPIN_DONE;
    cvta.to.global.u64 %rd2, %rd1;
    st.global.f32 [%rd2], %f1;
SPIN_DONE:
    ret;
}
\x00"""
SPIN_BLOCK = 256
#: Calibration aims a launch of the kernel loop at this many seconds.
SPIN_LAUNCH_S = 0.01


@dataclass(frozen=True)
class ProbePlan:
    """What one probe process does on device 0, in this order: run ``nvidia-smi -L`` (``smi``), the
    timed kernel loop for ``spin_s`` seconds (``iterations`` per thread; 0: calibrate to about
    SPIN_LAUNCH_S a launch), then up to ``chunks`` allocations of 256 MiB; with ``hold`` it prints
    its result and keeps the memory until its stdin closes."""

    chunks: int = 0
    spin_s: float = 0.0
    iterations: int = 0
    hold: bool = False
    smi: bool = False

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> ProbePlan:
        return cls(**json.loads(text))


def step_hami_core(report: Report, ctx: Context) -> None:
    """libcuda through ctypes, then with libvgpu.so preloaded and the share claim's environment."""
    library = _libcuda(ctx.driver_root)
    plain = _probe(library, {}, ProbePlan(chunks=4))
    if "load_error" in plain:
        report.skipped(f"CUDA probe: {library} does not load ({plain['load_error']})")
        report.skipped(f"HAMi-core memory limit: needs libcuda.so.1 ({_hami_core_found(ctx)})")
        return
    ctx.libcuda_works = report.expect(
        "error" not in plain,
        f"CUDA probe without HAMi-core on {plain.get('device', '?')}: "
        f"cuDeviceTotalMem {_mib(plain.get('total'))}, "
        f"cuMemGetInfo free {_mib(plain.get('free'))} of {_mib(plain.get('info_total'))}, "
        f"{plain.get('chunks', 0)} x 256 MiB allocated{_probe_error(plain)}",
    )
    if not ctx.libcuda_works:
        _print_stderr(plain)
        return
    if ctx.gpus and "total" in plain:
        report.note(f"published memory of {ctx.gpus[0].name}: {ctx.gpus[0].memory_bytes // MIB} MiB")
    if ctx.hami_core_lib is None:
        configured = os.environ.get("HAMI_CORE_LIB")
        if configured:
            report.failed(f"HAMi-core memory limit: HAMI_CORE_LIB={configured} is not a file")
        else:
            report.skipped(f"HAMi-core memory limit: {_hami_core_found(ctx)}")
        return
    env = _hami_env(ctx, "memory")
    limit_mib = _limit_mib(env)
    report.note("environment: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    limited = _probe(library, env, ProbePlan(chunks=limit_mib * MIB // CHUNK + 8))
    if _hami_probe_failed(report, ctx, limited, "CUDA probe with HAMi-core"):
        return
    total = int(limited.get("total", 0))
    report.expect(
        total == limit_mib * MIB,
        f"cuDeviceTotalMem with HAMi-core reads {_mib(total)} "
        f"(limit {limit_mib} MiB; real {_mib(plain.get('total'))})",
    )
    report.expect(
        limited.get("info_total") == limit_mib * MIB,
        f"cuMemGetInfo with HAMi-core: free {_mib(limited.get('free'))} of {_mib(limited.get('info_total'))}",
    )
    ctx.context_bytes = _check_memory_limit(report, limited, limit_mib, "")
    _print_stderr(limited, lines=4)


def _check_memory_limit(report: Report, result: Mapping[str, Any], limit_mib: int, where: str) -> int | None:
    """Allocation must stop at the limit minus what HAMi-core reports in use before the first
    allocation (the process's CUDA context, which it charges to the share). Returns that context."""
    free, info_total = result.get("free"), result.get("info_total")
    if not isinstance(free, int) or not isinstance(info_total, int):
        report.failed(f"{where}memory limit: no cuMemGetInfo figures{_probe_error(result)}")
        return None
    limit = limit_mib * MIB
    context = info_total - free
    report.expect(
        0 <= context < limit,
        f"{where}HAMi-core reports {_mib(context)} in use before the first allocation "
        f"(the CUDA context it charges to the share), of {_mib(info_total)}",
    )
    allowed = limit - context
    chunks = int(result.get("chunks", 0))
    allocated = chunks * CHUNK
    stop = str(result.get("stop") or "")
    report.expect(
        allowed - 2 * CHUNK < allocated <= allowed and "OUT_OF_MEMORY" in stop,
        f"{where}allocation stopped at {_mib(allocated)} ({chunks} x 256 MiB) against limit {limit_mib} MiB "
        f"- context {_mib(context)} = {_mib(allowed)}"
        + (f", then {stop}" if stop else ", and never stopped: the memory limit is NOT enforced")
        + (f"; {result['error']}" if result.get("error") else ""),
    )
    return context


def _hami_probe_failed(report: Report, ctx: Context, result: Mapping[str, Any], what: str) -> bool:
    """FAIL (True) when a probe with HAMi-core did not run or the loader did not preload it."""
    if "error" in result or "load_error" in result:
        report.failed(f"{what}: {result.get('error') or result.get('load_error')}")
        _print_stderr(result)
        return True
    if "cannot be preloaded" in result.get("stderr", ""):
        report.failed(f"{what}: {ctx.hami_core_lib} was not preloaded (ld.so refused it)")
        _print_stderr(result)
        return True
    return False


def _hami_env(ctx: Context, name: str) -> dict[str, str]:
    """The share claim's HAMi-core environment (step d), preloading the library, with a cache file
    of its own (``name``): each probe group gets a fresh shared region, as a new container does."""
    assert ctx.hami_core_lib is not None
    env = dict(
        ctx.share_env
        or {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_DEVICE_MEMORY_LIMIT_0": f"{SHARE_MEMORY // MIB}m",
            "CUDA_DEVICE_SM_LIMIT_0": str(SHARE_CORES),
        }
    )
    cache = ctx.work / "hami-core" / name
    cache.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "LD_PRELOAD": str(ctx.hami_core_lib),
            "CUDA_REDIRECT": str(ctx.hami_core_lib),  # libvgpu dlopens itself by this path
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache / "cudevshr.cache"),
        }
    )
    return env


def _limit_mib(env: Mapping[str, str]) -> int:
    return int(env.get("CUDA_DEVICE_MEMORY_LIMIT_0", f"{SHARE_MEMORY // MIB}m").rstrip("m"))


def _hami_ready(report: Report, ctx: Context, what: str) -> bool:
    """Steps f-h need a libcuda that worked in step e and a HAMi-core library; a SKIP says which."""
    if not ctx.libcuda_works:
        report.skipped(f"{what}: needs the working libcuda.so.1 of step e")
    elif ctx.hami_core_lib is None:
        report.skipped(f"{what}: {_hami_core_found(ctx)}, so no share is enforced on this machine")
    return ctx.libcuda_works and ctx.hami_core_lib is not None


def _hami_core_found(ctx: Context) -> str:
    where = ", ".join(["$HAMI_CORE_LIB", *HAMI_CORE_PATHS])
    return f"libvgpu.so at {ctx.hami_core_lib}" if ctx.hami_core_lib else f"no libvgpu.so ({where})"


def find_hami_core() -> Path | None:
    """``$HAMI_CORE_LIB``, else where HAMi's vgpu-init.sh puts it on the host (versioned names too)."""
    configured = os.environ.get("HAMI_CORE_LIB")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    for path in HAMI_CORE_PATHS:
        if Path(path).is_file():
            return Path(path)
        versioned = sorted(glob.glob(path + ".*"))
        if versioned:
            return Path(versioned[-1])
    return None


def _libcuda(driver_root: Path | None) -> str:
    """``libcuda.so.1`` below the driver root when one is given, else the loader's."""
    if driver_root is not None and driver_root != Path("/"):
        from dra_driver.devices.nvml_library import LIBRARY_DIRS, resolve_in_root

        for directory in LIBRARY_DIRS:
            found = resolve_in_root(driver_root, PurePosixPath(directory) / "libcuda.so.1")
            if found is not None:
                return str(found)
    return "libcuda.so.1"


# -- f. HAMi-core's cores limit --------------------------------------------------------------------


def step_cores(report: Report, ctx: Context) -> None:
    """The kernel loop without a cores limit, then with the share's: throughput must fall to it."""
    if not _hami_ready(report, ctx, "HAMi-core cores limit"):
        return
    library = _libcuda(ctx.driver_root)
    limited_env = _hami_env(ctx, "cores-limited")
    sm = limited_env.get("CUDA_DEVICE_SM_LIMIT_0")
    if not report.expect(bool(sm), f"share claim's environment sets CUDA_DEVICE_SM_LIMIT_0={sm}"):
        return
    free_env = {k: v for k, v in _hami_env(ctx, "cores-free").items() if not k.startswith("CUDA_DEVICE_SM_")}
    seconds = spin_seconds()
    free = _probe(library, free_env, ProbePlan(spin_s=seconds))
    if _hami_probe_failed(report, ctx, free, "kernel loop without a cores limit"):
        return
    spin = free.get("spin") or {}
    ctx.spin_rate, ctx.spin_iterations = spin.get("rate"), int(spin.get("iterations") or 0)
    report.expect(
        bool(ctx.spin_rate),
        f"kernel loop without a cores limit (HAMi-core preloaded): {_spin_text(spin)}",
    )
    limited = _probe(library, limited_env, ProbePlan(spin_s=seconds, iterations=ctx.spin_iterations))
    if _hami_probe_failed(report, ctx, limited, "kernel loop with the cores limit"):
        return
    _check_cores(report, ctx, limited, str(sm), "")


def spin_seconds() -> float:
    return float(os.environ.get("GPU_CHECK_SPIN_S") or SPIN_S)


def _spin_text(spin: Mapping[str, Any]) -> str:
    if not spin:
        return "no figure"
    return (
        f"{spin.get('launches')} launches of {spin.get('grid')} x {SPIN_BLOCK} threads x "
        f"{spin.get('iterations')} iterations in {spin.get('seconds')}s = {float(spin.get('rate', 0)):.1f}/s"
    )


def _check_cores(report: Report, ctx: Context, result: Mapping[str, Any], sm: str, where: str) -> None:
    """Throughput under the cores limit against ctx.spin_rate (no limit); HAMi-core must have found
    its host PID, without which it limits nothing."""
    spin = result.get("spin") or {}
    rate = float(spin.get("rate") or 0)
    stderr = str(result.get("stderr", ""))
    if not ctx.spin_rate or not rate:
        report.failed(
            f"{where}cores limit {sm} %: no throughput figure ({_spin_text(spin)}){_probe_error(result)}"
        )
        return
    ratio = rate / ctx.spin_rate
    report.expect(
        MIN_CORES_RATIO <= ratio <= MAX_CORES_RATIO and TASK_PID_FAILED not in stderr,
        f"{where}cores limit {sm} %: kernel loop {rate:.1f} launches/s against {ctx.spin_rate:.1f}/s "
        f"without a limit = {ratio:.0%} (PASS from {MIN_CORES_RATIO:.0%} to {MAX_CORES_RATIO:.0%})"
        + ("; the cores limit is NOT enforced" if ratio > MAX_CORES_RATIO else "")
        + (f"; HAMi-core: {TASK_PID_FAILED}, so it limits no cores" if TASK_PID_FAILED in stderr else ""),
    )


# -- g. two processes sharing one limit ------------------------------------------------------------


def step_two_processes(report: Report, ctx: Context) -> None:
    """One process holds about half the share; a second one in the same region must see it and
    stop where the two together reach the limit."""
    if not _hami_ready(report, ctx, "two processes sharing one limit"):
        return
    library = _libcuda(ctx.driver_root)
    env = _hami_env(ctx, "two-processes")
    limit_mib = _limit_mib(env)
    half = max(1, (limit_mib * MIB - (ctx.context_bytes or 0)) // CHUNK // 2)
    holder, first = _start_holder(library, env, ProbePlan(chunks=half, hold=True))
    try:
        if _hami_probe_failed(report, ctx, first, "first process"):
            return
        second = _probe(library, env, ProbePlan(chunks=limit_mib * MIB // CHUNK + 8))
    finally:
        _stop_holder(holder)
    if _hami_probe_failed(report, ctx, second, "second process"):
        return
    limit = limit_mib * MIB
    first_context = int(first["info_total"]) - int(first["free"])
    first_used = int(first["info_total"]) - int(first["free_after"])
    second_before = int(second["info_total"]) - int(second["free"])
    second_context = second_before - first_used
    sees = 0 <= second_context < limit and first.get("chunks") == half
    report.expect(
        sees,
        f"the second process sees the first's memory: {_mib(second_before)} in use before it allocates; "
        f"the first holds {_mib(first_used)} ({first.get('chunks')} x 256 MiB "
        f"+ context {_mib(first_context)})" + ("" if sees else "; the processes do NOT share the limit"),
    )
    together = (int(first.get("chunks", 0)) + int(second.get("chunks", 0))) * CHUNK
    contexts = first_context + (second_context if sees else first_context)
    allowed = limit - contexts
    stop = str(second.get("stop") or "")
    report.expect(
        allowed - 2 * CHUNK < together <= allowed and "OUT_OF_MEMORY" in stop,
        f"the two together allocated {_mib(together)} "
        f"({first.get('chunks')} + {second.get('chunks')} x 256 MiB) "
        f"against limit {limit_mib} MiB - their contexts {_mib(contexts)} = {_mib(allowed)}"
        + (f", then {stop}" if stop else ", and the second never stopped"),
    )


def _start_holder(
    library: str, env: Mapping[str, str], plan: ProbePlan
) -> tuple[subprocess.Popen[str] | None, dict[str, Any]]:
    """A probe that keeps its allocations: started, its first result line read."""
    command, full = _probe_command(library, env, plan)
    proc = subprocess.Popen(
        command, env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    # The probe prints its line once it holds its memory (or has failed); a hung one is given up.
    ready, _, _ = select.select([proc.stdout], [], [], PROBE_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    try:
        result: dict[str, Any] = json.loads(line) if line.strip() else {}
    except json.JSONDecodeError:
        result = {}
    if not result:
        if not ready:
            proc.kill()
        _stop_holder(proc)
        result = {"error": f"holding probe exited {proc.returncode} without a result"}
        return None, result
    return proc, result


def _stop_holder(proc: subprocess.Popen[str] | None) -> None:
    if proc is None:
        return
    try:
        proc.communicate(timeout=PROBE_TIMEOUT_S)  # closes its stdin: it frees and exits
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


# -- h. a PID namespace ----------------------------------------------------------------------------


def step_pid_namespace(report: Report, ctx: Context) -> None:
    """The probe as PID 1 of a new PID namespace, as in a container: both limits must hold (HAMi-core
    must find its host PID through NVML, without which it enforces no cores limit)."""
    if not _hami_ready(report, ctx, "PID namespace"):
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        report.skipped("PID namespace: no unshare program (util-linux)")
        return
    wrap = [unshare, *([] if os.geteuid() == 0 else ["--user", "--map-root-user"])]
    wrap += ["--pid", "--fork", "--mount-proc"]
    trial = _run([*wrap, "true"])
    if trial.returncode != 0:
        report.skipped(f"PID namespace: {' '.join(wrap)} true failed: {trial.stderr.strip()[:200]}")
        return
    library = _libcuda(ctx.driver_root)
    env = _hami_env(ctx, "pid-namespace")
    limit_mib = _limit_mib(env)
    plan = ProbePlan(
        chunks=limit_mib * MIB // CHUNK + 8, spin_s=spin_seconds(), iterations=ctx.spin_iterations
    )
    result = _probe(library, env, plan, wrap=wrap)
    if _hami_probe_failed(report, ctx, result, "probe in a PID namespace"):
        return
    report.expect(result.get("pid") == 1, f"probe runs as PID {result.get('pid')} of a new PID namespace")
    _check_memory_limit(report, result, limit_mib, "in the PID namespace: ")
    _check_cores(report, ctx, result, env.get("CUDA_DEVICE_SM_LIMIT_0", "?"), "in the PID namespace: ")


# -- i. a container through the composed spec ------------------------------------------------------

CONTAINERS_CONF = '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
#: The CDI directory podman reads that is meant for specs written at run time (the other is /etc/cdi).
PODMAN_CDI_DIR = Path("/var/run/cdi")


def step_container(report: Report, ctx: Context) -> None:
    """The share claim's spec applied by podman's CDI library to a container whose root is the
    host's (an overlay: nothing to pull): nvidia-smi, cuInit and both limits inside it; then the
    share is unprepared."""
    share, ctx.share = ctx.share, None
    if share is None:
        report.skipped("container: needs the share claim of step d")
        return
    try:
        podman = os.environ.get("GPU_CHECK_PODMAN") or shutil.which("podman")
        if not podman or podman == "none":
            report.skipped(
                "container: no container runtime (podman not found; GPU_CHECK_PODMAN names one), so the "
                "composed spec was not applied by a runtime"
            )
        elif os.geteuid() != 0:
            report.skipped(
                f"container: podman reads CDI specs from {PODMAN_CDI_DIR} only as root; run as root"
            )
        else:
            _run_container(report, ctx, share, podman)
    finally:
        _unprepare(report, share.preparer, share.ref, share.spec_path, "share")


def _numbers(version: str) -> tuple[int, ...]:
    """``0.7.0`` -> (0, 7, 0); anything unreadable sorts first."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return ()


def _run_container(report: Report, ctx: Context, share: PreparedShare, podman: str) -> None:
    hami = ctx.hami_core_lib is not None and ctx.libcuda_works
    plan = ProbePlan(
        chunks=share.limit_mib * MIB // CHUNK + 8 if hami else 0,
        spin_s=spin_seconds() if hami and ctx.spin_rate else 0.0,
        iterations=ctx.spin_iterations,
        smi=True,
    )
    PODMAN_CDI_DIR.mkdir(parents=True, exist_ok=True)
    registered = PODMAN_CDI_DIR / f"gpu-check-{share.ref.uid}.json"
    storage = Path(tempfile.mkdtemp(prefix="gpu-check-podman-", dir="/tmp"))
    conf = storage / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    volumes = [
        f"--volume={path}:{path}:ro"
        for path in sorted({REPO, Path(sys.prefix), Path(sys.base_prefix)})
        if path.stat().st_dev != Path("/").stat().st_dev  # the overlay of / shows only its own mount
    ]
    run = [
        podman, f"--root={storage / 'root'}", f"--runroot={storage / 'run'}", f"--tmpdir={storage / 'tmp'}",
        "run", "--rm", "--network=none", "--workdir=/", *volumes,
    ]  # fmt: skip
    rootfs = ["--rootfs", "/:O"]  # the host's root as the container's, under an overlay that takes the mounts
    command = [
        *run, *(f"--device={cdi_id}" for cdi_id in share.cdi_ids), *rootfs,
        sys.executable, str(Path(__file__).resolve()), "--cuda-probe", "libcuda.so.1", plan.to_json(),
    ]  # fmt: skip
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    try:
        # First without the spec: a podman that cannot run such a container here says nothing of it.
        trial = _run([*run, *rootfs, sys.executable, "-c", "pass"], timeout=PROBE_TIMEOUT_S, env=env)
        if trial.returncode != 0:
            last = (trial.stderr.strip().splitlines() or ["no output"])[-1]
            report.skipped(
                f"container: {podman} cannot run the host's root as a container here (exit "
                f"{trial.returncode}: {last[:300]}), so the spec was not applied by a runtime"
            )
            return
        report.note(" ".join(command))
        shutil.copyfile(share.spec_path, registered)
        proc = _run(command, timeout=PROBE_TIMEOUT_S + 2 * plan.spin_s, env=env)
    finally:
        registered.unlink(missing_ok=True)
        shutil.rmtree(storage, ignore_errors=True)
    result = _result_of(proc.stdout)
    result["stderr"] = proc.stderr
    version = str(json.loads(share.spec_path.read_text()).get("cdiVersion", ""))
    if proc.returncode != 0 and "unresolvable CDI devices" in proc.stderr and _numbers(version) > (0, 5, 0):
        # podman 4.x (Debian 12) reads specs up to cdiVersion 0.5.0; a node with nvidia-drm loaded
        # gets additionalGids (0.7.0). That is the runtime's age, not a fault of the spec.
        report.skipped(
            f"container: {podman} could not read the claim's spec (cdiVersion {version}, e.g. "
            "additionalGids for 0660 DRM nodes): its CDI library is older; podman >= 5 or the "
            "cluster's containerd >= 1.7 reads it"
        )
        return
    if not report.expect(
        proc.returncode == 0 and bool(result) and "load_error" not in result,
        f"container through {', '.join(share.cdi_ids)} (podman, root overlaid from the host) ran: exit "
        f"{proc.returncode}"
        + (f"; libcuda.so.1 does not load in it: {result['load_error']}" if "load_error" in result else ""),
    ):
        _print_stderr(result)
        return
    report.expect(result.get("pid") == 1, f"in the container the probe is PID {result.get('pid')}")
    smi = result.get("smi") or {}
    report.expect(
        smi.get("rc") == 0,
        f"nvidia-smi -L in the container: exit {smi.get('rc')}: {smi.get('out') or 'no output'}",
    )
    if not report.expect(
        "error" not in result,
        f"CUDA in the container on {result.get('device', '?')}: cuDeviceTotalMem {_mib(result.get('total'))}"
        f"{_probe_error(result)}",
    ):
        _print_stderr(result)
        return
    # The container's root is the host's: the spec's mount must be what the loader found.
    report.expect(
        result.get("libcuda") in share.libcuda_mounts,
        f"in the container libcuda is the spec's mount: {result.get('libcuda')} "
        f"(the spec mounts {', '.join(share.libcuda_mounts) or 'none'})",
    )
    if not hami:
        report.skipped(f"HAMi-core limits in the container: {_hami_core_found(ctx)}")
        return
    report.expect(
        result.get("total") == share.limit_mib * MIB,
        f"in the container cuDeviceTotalMem reads {_mib(result.get('total'))} (limit {share.limit_mib} MiB): "
        "HAMi-core preloaded through the spec's /etc/ld.so.preload",
    )
    _check_memory_limit(report, result, share.limit_mib, "in the container: ")
    if plan.spin_s:
        _check_cores(report, ctx, result, str(SHARE_CORES), "in the container: ")


# -- the probe -------------------------------------------------------------------------------------


def _probe_command(
    library: str, env: Mapping[str, str], plan: ProbePlan, wrap: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    full = {**os.environ, **env}
    if "/" in library:
        full["LD_LIBRARY_PATH"] = ":".join(
            filter(None, [str(Path(library).parent), full.get("LD_LIBRARY_PATH")])
        )
    script = str(Path(__file__).resolve())
    return [*wrap, sys.executable, script, "--cuda-probe", library, plan.to_json()], full


def _probe(library: str, env: Mapping[str, str], plan: ProbePlan, wrap: Sequence[str] = ()) -> dict[str, Any]:
    """Run :func:`cuda_probe` in a subprocess: LD_PRELOAD works only from a process's start."""
    command, full = _probe_command(library, env, plan, wrap)
    timeout = PROBE_TIMEOUT_S + 2 * plan.spin_s
    try:
        proc = subprocess.run(command, env=full, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        return {"error": f"no answer within {timeout:.0f}s", "stderr": _text(err.stderr)}
    result = _result_of(proc.stdout) or {"error": f"probe exited {proc.returncode} without a result"}
    result["stderr"] = proc.stderr
    return result


def _result_of(stdout: str) -> dict[str, Any]:
    """The probe's result: the JSON object on its last line of output ({} when there is none)."""
    last = stdout.strip().splitlines()[-1:] if stdout.strip() else []
    try:
        result = json.loads(last[0]) if last else {}
    except json.JSONDecodeError:
        return {}
    return result if isinstance(result, dict) else {}


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _print_stderr(result: Mapping[str, Any], lines: int = 8) -> None:
    for line in str(result.get("stderr", "")).strip().splitlines()[-lines:]:
        Report.note(f"stderr: {line}")


def _probe_error(result: Mapping[str, Any]) -> str:
    if result.get("error"):
        return f"; {result['error']}"
    return f", then {result['stop']}" if result.get("stop") else ""


def _mib(value: object) -> str:
    return f"{int(value) // MIB} MiB" if isinstance(value, int) else "?"


def _smi_in_probe() -> dict[str, Any]:
    """``nvidia-smi -L`` as the process sees it (in a container: the one the spec mounted)."""
    proc = _run(["nvidia-smi", "-L"])
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return {"rc": proc.returncode, "out": "; ".join(lines[:4])}


def cuda_probe(library: str, plan: ProbePlan) -> dict[str, Any]:
    """The driver API on device 0 (the primary context, present in every CUDA version): total and
    free memory, then what ``plan`` asks. Prints nothing itself except a held result."""
    result: dict[str, Any] = {"pid": os.getpid()}
    if plan.smi:
        result["smi"] = _smi_in_probe()
    try:
        cuda = ctypes.CDLL(library)
    except OSError as err:
        result["load_error"] = str(err)
        return result
    result["libcuda"] = _loaded_library("libcuda")
    size_t = ctypes.c_size_t

    def name(code: int) -> str:
        text = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(text))
        return f"{text.value.decode() if text.value else 'CUDA error'} ({code})"

    def call(function: str, *args: Any) -> None:
        code = int(getattr(cuda, function)(*args))
        if code:
            raise RuntimeError(f"{function}: {name(code)}")

    device, context = ctypes.c_int(), ctypes.c_void_p()
    allocations: list[ctypes.c_ulonglong] = []
    try:
        cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), size_t]
        call("cuInit", 0)
        call("cuDeviceGet", ctypes.byref(device), 0)
        label = ctypes.create_string_buffer(256)
        call("cuDeviceGetName", label, 256, device)
        result["device"] = label.value.decode(errors="replace")
        total = size_t()
        call("cuDeviceTotalMem_v2", ctypes.byref(total), device)
        result["total"] = total.value
        call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        call("cuCtxSetCurrent", context)
        if plan.spin_s > 0:
            result["spin"] = _spin(cuda, call, device, plan)
        free, info_total = size_t(), size_t()
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(info_total))
        result["free"], result["info_total"] = free.value, info_total.value
        while len(allocations) < plan.chunks:
            address = ctypes.c_ulonglong()  # a CUdeviceptr
            code = int(cuda.cuMemAlloc_v2(ctypes.byref(address), size_t(CHUNK)))
            if code:
                result["stop"] = f"cuMemAlloc_v2: {name(code)}"
                break
            allocations.append(address)
        result["chunks"] = len(allocations)
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(info_total))
        result["free_after"] = free.value
    except RuntimeError as err:
        result["error"] = str(err)
    except AttributeError as err:  # a library by that name without the driver API (a stub)
        result["error"] = f"{library} lacks a driver-API function: {err}"
    try:
        if plan.hold:
            print(json.dumps(result), flush=True)
            sys.stdin.read()  # until the parent closes it
    finally:
        for address in allocations:
            cuda.cuMemFree_v2(address)
        if context.value:
            release = getattr(cuda, "cuDevicePrimaryCtxRelease_v2", None) or cuda.cuDevicePrimaryCtxRelease
            release(device)
    return result


def _spin(cuda: Any, call: Callable[..., None], device: ctypes.c_int, plan: ProbePlan) -> dict[str, Any]:
    """The timed kernel loop: launch, wait, again, for ``plan.spin_s`` seconds; 4 blocks per SM."""
    sms = ctypes.c_int()
    call("cuDeviceGetAttribute", ctypes.byref(sms), 16, device)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    module, function, out = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_ulonglong()
    call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(SPIN_PTX))
    try:
        call("cuModuleGetFunction", ctypes.byref(function), module, b"spin")
        call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(4096))
        iterations = ctypes.c_uint32(plan.iterations or 1 << 16)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(iterations), ctypes.addressof(out))
        grid = max(1, sms.value) * 4
        dims = [ctypes.c_uint(n) for n in (grid, 1, 1, SPIN_BLOCK, 1, 1, 0)]

        def launch() -> float:
            started = time.monotonic()
            call("cuLaunchKernel", function, *dims, None, params, None)
            call("cuCtxSynchronize")
            return time.monotonic() - started

        launch()  # the first launch pays for loading the module
        for _ in range(6 if not plan.iterations else 0):
            took = launch()
            if took >= SPIN_LAUNCH_S / 2 or iterations.value >= 1 << 30:
                break
            iterations.value = min(
                1 << 30, iterations.value * min(64, max(2, int(SPIN_LAUNCH_S / max(took, 1e-6))))
            )
        launches, started = 0, time.monotonic()
        while time.monotonic() - started < plan.spin_s:
            launch()
            launches += 1
        seconds = time.monotonic() - started
        return {
            "launches": launches,
            "seconds": round(seconds, 3),
            "rate": launches / seconds,
            "iterations": iterations.value,
            "grid": grid,
        }
    finally:
        if out.value:
            cuda.cuMemFree_v2(out)
        cuda.cuModuleUnload(module)


# -- main ------------------------------------------------------------------------------------------


# -- j. a MIG instance created and destroyed ---------------------------------------------------------

#: Compute-instance profile index spanning a GPU instance of this many compute slices (nvml.h).
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def step_mig(report: Report, ctx: Context) -> None:
    """On a card in MIG mode, with ``--allow-mig-changes``: create the smallest GPU instance there
    is room for and a compute instance spanning it, see discovery publish it as a MIG device with
    its profile, destroy both, see it gone. The card's existing instances are never touched."""
    from dra_driver.devices.mig import mig_device_name
    from dra_driver.devices.mig_profiles import mig_model
    from dra_driver.devices.source import DeviceSourceError, open_source

    cards = [gpu for gpu in ctx.gpus if gpu.mig_enabled]
    if not cards:
        report.skipped("MIG instance create/destroy: no GPU in MIG mode")
        return
    card = cards[0]
    if not ctx.allow_mig_changes:
        report.skipped(
            f"MIG instance create/destroy on {card.name} ({card.uuid}): pass --allow-mig-changes to let the "
            "check create and destroy one instance (make gpu-check GPU_CHECK_ARGS=--allow-mig-changes)"
        )
        return
    model = mig_model(card.product_name)
    if model is None:
        report.skipped(f"MIG instance create/destroy: no MIG profile table for {card.product_name!r}")
        return
    import pynvml as nvml

    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(card.uuid)
        chosen = None
        for profile in sorted(model.profiles, key=lambda p: (p.slices, p.memory_mib)):
            if profile.name.endswith("+me"):
                continue
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.nvml_index)
                if int(nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, info.id)) > 0:
                    chosen = profile, info
                    break
            except nvml.NVMLError:
                continue
        if chosen is None:
            report.skipped(f"MIG instance create/destroy: no room on {card.name} for any profile")
            return
        profile, info = chosen

        def discovered() -> dict[str, str]:
            try:
                gpus = open_source("nvml", node_name=ctx.node_name, driver_root=ctx.driver_root).discover()
            except DeviceSourceError as err:
                report.failed(f"NVML discovery after the MIG change: {err}")
                return {}
            return {
                mig_device_name(gpu.name, mig): mig.profile
                for gpu in gpus
                if gpu.uuid == card.uuid
                for mig in gpu.mig_devices
            }

        before = discovered()
        gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, info.id)
        compute_instance = None
        try:
            gi = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)
            ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                _CI_PROFILE_BY_SLICES[profile.slices],
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            compute_instance = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile.id)
            created = f"{card.name}-mig-{gi}-0"
            report.passed(
                f"created {profile.name} (GPU instance {gi}) and its compute instance on {card.name}"
            )
            after = discovered()
            new = sorted(set(after) - set(before))
            seen = ", ".join(f"{name} {after[name]}" for name in new) or "none"
            report.expect(
                [(name, after[name]) for name in new] == [(created, profile.name)],
                f"discovery publishes the new instance: {seen} (expected {created} {profile.name})",
            )
        finally:
            if compute_instance is not None:
                nvml.nvmlComputeInstanceDestroy(compute_instance)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
        gone = discovered()
        report.expect(
            gone == before,
            f"destroyed it: discovery is back to {len(gone)} MIG device(s) on {card.name}",
        )
    except nvml.NVMLError as err:
        report.failed(f"MIG instance create/destroy on {card.name}: NVML {err}")
    finally:
        nvml.nvmlShutdown()


def node_name() -> str:
    """``$NODE_NAME``, else the host name made a DNS subdomain (the pool and slice names use it)."""
    raw = os.environ.get("NODE_NAME") or socket.gethostname()
    name = _DNS_LABEL_CHARS.sub("-", raw.lower()).strip("-.")[:253]
    return name or "gpu-check"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cuda_probe:
        print(json.dumps(cuda_probe(args.cuda_probe[0], ProbePlan.from_json(args.cuda_probe[1]))), flush=True)
        return 0
    report = Report()
    logging.basicConfig(level=logging.INFO, handlers=[report.log])
    driver_root = args.nvidia_driver_root
    registry = args.cdi_registry or [Path("/etc/cdi"), Path("/var/run/cdi")]
    ctx = Context(args.node_name, args.dev_root, driver_root, registry)
    ctx.allow_mig_changes = args.allow_mig_changes
    ctx.hami_core_lib = find_hami_core()
    started = time.monotonic()
    print(
        f"hami-dra GPU check: python {sys.version.split()[0]} ({sys.executable}), repository {REPO}, "
        f"node {ctx.node_name}, NVIDIA_DRIVER_ROOT {driver_root or 'unset'}, work dir {ctx.work}",
        flush=True,
    )
    steps: list[tuple[str, str, Callable[[Report, Context], None]]] = [
        ("a", "NVML discovery -> ResourceSlices", step_discovery),
        ("b", "cross-check against nvidia-smi", step_nvidia_smi),
        ("c", "NVML health watcher", step_health),
        ("d", "CDI spec of prepared claims", step_cdi),
        ("e", "CUDA driver API and HAMi-core memory limit", step_hami_core),
        ("f", "HAMi-core cores limit", step_cores),
        ("g", "two processes sharing one limit", step_two_processes),
        ("h", "a PID namespace", step_pid_namespace),
        ("i", "a container through the share claim's CDI spec", step_container),
        ("j", "a MIG instance created and destroyed", step_mig),
    ]
    try:
        for key, title, run in steps:
            with report.step(key, title):
                run(report, ctx)
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
    counts = report.counts
    print(
        f"SUMMARY: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"in {time.monotonic() - started:.1f}s",
        flush=True,
    )
    for failure in report.failures:
        print(f"  FAIL {failure}")
    return 1 if counts["FAIL"] else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Check hami-dra against this machine's NVIDIA GPUs.")
    parser.add_argument(
        "--node-name", default=node_name(), help="node (pool) name; default $NODE_NAME or host name"
    )
    parser.add_argument(
        "--dev-root",
        type=Path,
        default=Path("/dev"),
        help="where the nvidia* device nodes are (default /dev; nvidia-ctk gets the directory above it)",
    )
    parser.add_argument(
        "--nvidia-driver-root",
        type=Path,
        default=Path(os.environ["NVIDIA_DRIVER_ROOT"]) if os.environ.get("NVIDIA_DRIVER_ROOT") else None,
        help="load NVML (and libcuda) from below this root (env NVIDIA_DRIVER_ROOT)",
    )
    parser.add_argument(
        "--cdi-registry",
        type=Path,
        action="append",
        help="CDI registry dir with the NVIDIA toolkit's spec (repeatable; default /etc/cdi, /var/run/cdi)",
    )
    parser.add_argument(
        "--allow-mig-changes",
        action="store_true",
        help="on a GPU in MIG mode, create and destroy one MIG instance (step j; off: skipped)",
    )
    parser.add_argument("--cuda-probe", nargs=2, metavar=("LIBRARY", "PLAN"), help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
