"""A check of this driver against real NVIDIA GPUs, for a person or CI on a GPU machine.

Run through ``hack/gpu-check.sh`` (which picks the Python and puts the repository on the path).
Everything the kubelet plugin does with the hardware is exercised through the plugin's own code,
so a pass means the shipped code works on this machine, not a re-implementation of it:

a. discovery through :class:`dra_driver.devices.nvml.NvmlSource` (``NVIDIA_DRIVER_ROOT`` honoured)
   into the ResourceSlices of :mod:`dra_driver.kubeletplugin.slices`, checked against the API
   server's rules that can be checked offline (``tests/kube_validate.py``; strict schemas too when
   ``kubernetes_validate`` is installed);
b. every published GPU cross-checked against ``nvidia-smi``, which reads the driver by another
   path: an error in our NVML use shows up as a disagreement;
c. the NVML health watcher the plugin starts (``NvmlHealthWatcher``) initialised and registered on
   every GPU, then stopped;
d. the CDI spec of a prepared claim, written by the plugin's :class:`Preparer` into a temporary
   directory (claims come from a stand-in for the API server), for one share and one whole card,
   composed with the NVIDIA Container Toolkit's spec as the plugin finds it (or as ``nvidia-ctk``,
   when it is here, generates it), and everything it names checked to exist on the host;
e. a CUDA driver-API probe through ``ctypes``: without HAMi-core it proves ``libcuda`` works; with
   a HAMi-core ``libvgpu.so`` preloaded and the share claim's environment, it checks that the
   memory limit is enforced (what ``/etc/ld.so.preload`` does inside the container).

Each check prints ``PASS``, ``FAIL`` or ``SKIP`` with its figures; a check whose Python module is
missing is skipped naming the module, not failed, except discovery's ``pynvml``: without it nothing
is checked, and such a run must not end green. The exit status is 1 when anything failed.
Options: ``--node-name`` (default ``$NODE_NAME`` or the host name), ``--dev-root`` (where the
``nvidia*`` device nodes are, default ``/dev``), ``--nvidia-driver-root`` (default
``$NVIDIA_DRIVER_ROOT``), ``--cdi-registry`` (default ``/etc/cdi`` and ``/var/run/cdi``);
``--cuda-probe`` is the internal entry point of step e's subprocess. Env: ``HAMI_CORE_LIB``,
``NVIDIA_CTK``.
Tests run this end to end against ``hack/mock-nvml`` and a fake ``nvidia-smi``
(``tests/devices/test_gpu_check.py``).
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
    hami_core_lib: Path | None = None
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-check-")))


# -- a. discovery and ResourceSlices ---------------------------------------------------------------


def step_discovery(report: Report, ctx: Context) -> None:
    """NVML through the plugin's source, into the slices the plugin would publish."""
    from dra_driver.devices.source import DeviceSourceError, open_source
    from dra_driver.kubeletplugin.slices import build_resource_slices

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
        f"({library}; {where}; MIG-mode cards left out)",
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
    """Every published GPU against nvidia-smi; MIG-enabled cards must be absent."""
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
    published = {gpu.uuid: gpu for gpu in ctx.gpus}
    mig = {u for u, row in by_uuid.items() if (row.get("mig.mode.current") or "").lower() == "enabled"}
    expected = set(by_uuid) - mig
    report.expect(
        set(published) == expected,
        f"published GPUs = nvidia-smi's GPUs without MIG: {len(published)} published, {len(by_uuid)} in "
        f"nvidia-smi, {len(mig)} with MIG enabled"
        + _difference(set(published) - expected, "published but not in nvidia-smi (or in MIG mode)")
        + _difference(expected - set(published), "in nvidia-smi but not published"),
    )
    for u in sorted(mig):
        report.expect(
            u not in published, f"MIG-enabled {u} (index {by_uuid[u]['index']}) is absent from the slice"
        )
    devices = {d["name"]: d for s in ctx.slices for d in s["spec"]["devices"]}
    for gpu in ctx.gpus:
        row = by_uuid.get(gpu.uuid)
        if row is None:
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


def _run(command: Sequence[str], timeout: float = SMI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
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

    gpu = ctx.gpus[0]
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
    for label, ref in (("share", share), ("whole", whole)):
        # One after the other: a whole card and a share of it cannot be prepared at the same time.
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
        _check_host_side(report, ctx, spec, gpu, label)
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


def _check_host_side(report: Report, ctx: Context, spec: Mapping[str, Any], gpu: Gpu, label: str) -> None:
    """What the runtime needs on the host to apply the spec: a container would not start without it.

    Every device node (``/dev`` read below ``--dev-root``), every mount's host path and every hook
    program must exist, and the GPU's own node must be among the device nodes. ``nvidia-uvm*``
    appear only at the first CUDA use (nvidia-modprobe), so their absence is a SKIP, not a FAIL.
    """
    edits = [spec.get("containerEdits", {}), *(d.get("containerEdits", {}) for d in spec.get("devices", []))]
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
    late: list[str] = []
    for node in nodes:
        host = str(node.get("hostPath") or node.get("path", ""))
        seen = ctx.dev_root / host[len("/dev/") :] if host.startswith("/dev/") else Path(host)
        if not seen.exists():
            (late if Path(host).name.startswith("nvidia-uvm") else missing).append(str(seen))
    missing += [str(m["hostPath"]) for m in mounts if not Path(str(m.get("hostPath", ""))).exists()]
    missing += [str(h["path"]) for h in hooks if not os.access(str(h.get("path", "")), os.X_OK)]
    report.expect(
        not missing,
        f"{label} spec's host side exists (device nodes, mount sources, hook programs)"
        + (f"; missing: {', '.join(missing)}" if missing else ""),
    )
    if late:
        report.skipped(f"{', '.join(late)} absent: nvidia-modprobe creates them at the first CUDA use")


# -- e. CUDA and HAMi-core -------------------------------------------------------------------------


def step_hami_core(report: Report, ctx: Context) -> None:
    """libcuda through ctypes, then with libvgpu.so preloaded and the share claim's environment."""
    library = _libcuda(ctx.driver_root)
    plain = _probe(library, {}, max_chunks=4)
    if "load_error" in plain:
        report.skipped(f"CUDA probe: {library} does not load ({plain['load_error']})")
        report.skipped(f"HAMi-core memory limit: needs libcuda.so.1 ({_hami_core_found(ctx)})")
        return
    if not report.expect(
        "error" not in plain,
        f"CUDA probe without HAMi-core on {plain.get('device', '?')}: "
        f"cuDeviceTotalMem {_mib(plain.get('total'))}, "
        f"cuMemGetInfo free {_mib(plain.get('free'))} of {_mib(plain.get('info_total'))}, "
        f"{plain.get('chunks', 0)} x 256 MiB allocated{_probe_error(plain)}",
    ):
        _print_stderr(plain)
    if ctx.gpus and "total" in plain:
        report.note(f"published memory of {ctx.gpus[0].name}: {ctx.gpus[0].memory_bytes // MIB} MiB")
    if ctx.hami_core_lib is None:
        configured = os.environ.get("HAMI_CORE_LIB")
        if configured:
            report.failed(f"HAMi-core memory limit: HAMI_CORE_LIB={configured} is not a file")
        else:
            report.skipped(f"HAMi-core memory limit: {_hami_core_found(ctx)}")
        return
    env = dict(ctx.share_env or {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"})
    limit_mib = int(env.get("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m").rstrip("m"))
    env.update(
        {
            "LD_PRELOAD": str(ctx.hami_core_lib),
            "CUDA_REDIRECT": str(ctx.hami_core_lib),  # libvgpu dlopens itself by this path
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(ctx.work / "hami-core" / "cudevshr.cache"),
        }
    )
    (ctx.work / "hami-core").mkdir(exist_ok=True)
    report.note("environment: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    limited = _probe(library, env, max_chunks=limit_mib * MIB // CHUNK + 8)
    if "error" in limited or "load_error" in limited:
        report.failed(f"CUDA probe with HAMi-core: {limited.get('error') or limited.get('load_error')}")
        _print_stderr(limited)
        return
    if "cannot be preloaded" in limited.get("stderr", ""):
        report.failed(f"{ctx.hami_core_lib} was not preloaded (ld.so refused it)")
        _print_stderr(limited)
        return
    total, allocated = int(limited.get("total", 0)), int(limited.get("chunks", 0)) * CHUNK
    report.expect(
        total == limit_mib * MIB,
        f"cuDeviceTotalMem with HAMi-core reads {_mib(total)} "
        f"(limit {limit_mib} MiB; real {_mib(plain.get('total'))})",
    )
    report.expect(
        limited.get("info_total") == limit_mib * MIB,
        f"cuMemGetInfo with HAMi-core: free {_mib(limited.get('free'))} of {_mib(limited.get('info_total'))}",
    )
    report.expect(
        (limit_mib - 512) * MIB <= allocated <= limit_mib * MIB and limited.get("stop") is not None,
        f"allocation stopped at {_mib(allocated)} ({limited.get('chunks')} x 256 MiB; limit {limit_mib} MiB)"
        f"{_probe_error(limited)}",
    )
    _print_stderr(limited, lines=4)


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


def _probe(library: str, env: Mapping[str, str], max_chunks: int) -> dict[str, Any]:
    """Run :func:`cuda_probe` in a subprocess: LD_PRELOAD works only from a process's start."""
    full = {**os.environ, **env}
    if "/" in library:
        full["LD_LIBRARY_PATH"] = ":".join(
            filter(None, [str(Path(library).parent), full.get("LD_LIBRARY_PATH")])
        )
    command = [sys.executable, str(Path(__file__).resolve()), "--cuda-probe", library, str(max_chunks)]
    try:
        proc = subprocess.run(
            command, env=full, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as err:
        return {"error": f"no answer within {PROBE_TIMEOUT_S}s", "stderr": _text(err.stderr)}
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        result: dict[str, Any] = json.loads(last[0]) if last else {}
    except json.JSONDecodeError:
        result = {}
    if not result:
        result = {"error": f"probe exited {proc.returncode} without a result"}
    result["stderr"] = proc.stderr
    return result


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


def cuda_probe(library: str, max_chunks: int) -> dict[str, Any]:
    """The driver API on device 0: total memory, free memory, then 256 MiB allocations until one
    fails or ``max_chunks`` succeeded. Uses the primary context (present in every CUDA version)."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError as err:
        return {"load_error": str(err)}
    size_t = ctypes.c_size_t
    result: dict[str, Any] = {}

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
        free, info_total = size_t(), size_t()
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(info_total))
        result["free"], result["info_total"] = free.value, info_total.value
        cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), size_t]
        while len(allocations) < max_chunks:
            address = ctypes.c_ulonglong()  # a CUdeviceptr
            code = int(cuda.cuMemAlloc_v2(ctypes.byref(address), size_t(CHUNK)))
            if code:
                result["stop"] = f"cuMemAlloc_v2: {name(code)}"
                break
            allocations.append(address)
        result["chunks"] = len(allocations)
    except RuntimeError as err:
        result["error"] = str(err)
    finally:
        for address in allocations:
            cuda.cuMemFree_v2(address)
        if context.value:
            release = getattr(cuda, "cuDevicePrimaryCtxRelease_v2", None) or cuda.cuDevicePrimaryCtxRelease
            release(device)
    return result


# -- main ------------------------------------------------------------------------------------------


def node_name() -> str:
    """``$NODE_NAME``, else the host name made a DNS subdomain (the pool and slice names use it)."""
    raw = os.environ.get("NODE_NAME") or socket.gethostname()
    name = _DNS_LABEL_CHARS.sub("-", raw.lower()).strip("-.")[:253]
    return name or "gpu-check"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cuda_probe:
        print(json.dumps(cuda_probe(args.cuda_probe[0], int(args.cuda_probe[1]))))
        return 0
    report = Report()
    logging.basicConfig(level=logging.INFO, handlers=[report.log])
    driver_root = args.nvidia_driver_root
    registry = args.cdi_registry or [Path("/etc/cdi"), Path("/var/run/cdi")]
    ctx = Context(args.node_name, args.dev_root, driver_root, registry)
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
        "--dev-root", type=Path, default=Path("/dev"), help="where the nvidia* device nodes are"
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
    parser.add_argument("--cuda-probe", nargs=2, metavar=("LIBRARY", "MAX_CHUNKS"), help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
