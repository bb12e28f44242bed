"""NVIDIA's own CDI specs for a mock GPU node: the layouts our kubelet plugin has to compose with.

A GPU node that runs our plugin usually has the NVIDIA Container Toolkit too, and its spec is one
of four shapes (issue 24), which :func:`generate_spec` reproduces with the real ``nvidia-ctk``
(built by ``hack/cluster/build.sh`` into the version-keyed cache, see
:func:`hami_dra_dev.cluster.binaries.nvidia_toolkit_bin`) run against our mock NVML library:

``host``
    a host install of toolkit >= 1.18: kind ``nvidia.com/gpu``, every GPU named by index and by
    UUID (plus ``all``), in ``<cdi dir>/nvidia.yaml``;
``operator``
    the GPU Operator: the driver lives in a container root (``/run/nvidia/driver``) and only a
    management spec is written, kind ``management.nvidia.com/gpu`` with the single device ``all``,
    in ``<cdi dir>/management.nvidia.com-gpu.yaml``;
``index-only``
    kind ``nvidia.com/gpu`` with index names only (older installs, or an explicit strategy);
``none``
    no spec at all.

The mock driver root (:func:`build_driver_root`) is what ``nvidia-ctk`` inspects on a real node,
scaled down: the mock ``libnvidia-ml.so.<driver version>`` (hack/mock-nvml, built with gcc) that
go-nvml loads, a stub ``libcuda.so.<driver version>``, an ``nvidia-smi`` stand-in, GSP firmware
stubs and real character device nodes, so that the spec is the one a real node of that profile
gets and a real container runtime can apply it. Nothing here downloads; the gcc builds take well
under a second. Device nodes need root (``mknod``) and a filesystem not mounted ``nodev``.

The device nodes are those of a real node (issue 33, :class:`DeviceFiles`): ``nvidia-drm`` loaded,
so each GPU has ``/dev/dri/card<N>`` and ``renderD<N>`` (0660, groups video and render) with
their ``by-path`` links, for which toolkit >= 1.19 writes ``additionalGids``; ``/dev/nvidia*``
as ``NVreg_DeviceFileMode``/``-GID`` leave them (the driver's default 0666 root, or a hardened
0660 with a group); and, by default, ``nvidia-uvm`` not yet loaded when the spec is generated
(:func:`generate_spec`), as where nothing loaded it before the boot-time ``nvidia-cdi-refresh``.
``nvidia-ctk`` finds a GPU's DRM nodes in ``/sys/bus/pci/devices/<bus id>/drm``; the root holds
that tree (``sys/``) and :func:`generate_spec` mounts it there for ``nvidia-ctk`` alone (a mount
namespace of its own).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from dra_driver.devices.mig import gpu_instance_id, mig_caps_minors
from dra_driver.devices.mig_profiles import MigModel, mig_model
from hami_dra_dev.cluster import binaries

REPO = Path(__file__).resolve().parents[1]
MOCK_NVML_SOURCE = REPO / "hack" / "mock-nvml" / "mock_nvml.c"
PROFILES = REPO / "hack" / "mock-nvml" / "profiles"

Layout = Literal["host", "operator", "index-only", "none"]
#: Every layout, in the order issue 24 lists them.
LAYOUTS: tuple[Layout, ...] = ("host", "operator", "index-only", "none")
#: The layouts that write a spec, with the file name and kind their installer gives it.
SPEC_FILES: dict[Layout, str] = {
    "host": "nvidia.yaml",
    "operator": "management.nvidia.com-gpu.yaml",
    "index-only": "nvidia.yaml",
}
KINDS: dict[Layout, str] = {
    "host": "nvidia.com/gpu",
    "operator": "management.nvidia.com/gpu",
    "index-only": "nvidia.com/gpu",
}

#: Where the driver's libraries are on Debian/Ubuntu, relative to the driver root.
LIB_DIR = Path("usr/lib/x86_64-linux-gnu")
#: The profile's copy inside the root: a container that mounts the root sets MOCK_NVML_PROFILE to
#: ``<mount point>/`` this.
PROFILE_IN_ROOT = Path("etc/mock-nvml/profile.json")
#: The NVIDIA driver's fixed character major: nvidia<minor> (minor 0-254) and nvidiactl (255).
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
#: The ``nvidia-caps`` character major (dynamic on a real node, read from /proc/devices).
NVIDIA_CAPS_MAJOR = 237
#: Where the driver lists every MIG capability's minor, relative to the (driver) root.
MIG_MINORS_FILE = Path("proc/driver/nvidia-caps/mig-minors")
#: nvidia-uvm's major is dynamic on a real node; the kernel hands out 511 first (it allocates
#: dynamic majors downwards), which is what most real nodes show. nvidia-uvm-tools is minor 1.
NVIDIA_UVM_MAJOR = 511
UVM_NODES = ("nvidia-uvm", "nvidia-uvm-tools")
#: The DRM subsystem's fixed major; card<N> minors count from 0, renderD<N> from 128.
DRM_MAJOR = 226
RENDER_MINOR_BASE = 128
#: Groups of the DRM nodes on Debian/Ubuntu: video is 44 everywhere; render is a dynamic system
#: group (109 on a stock Ubuntu 22.04 server).
VIDEO_GID = 44
RENDER_GID = 109


@dataclass(frozen=True)
class DeviceFiles:
    """How the node's NVIDIA device nodes look (see the module docstring)."""

    #: ``NVreg_DeviceFileMode`` and ``NVreg_DeviceFileGID``: mode and group of ``/dev/nvidia*``.
    nvidia_mode: int = 0o666
    nvidia_gid: int = 0
    #: ``nvidia-drm`` loaded: per GPU ``/dev/dri/card<index+1>`` (card0 is the BMC's VGA on most
    #: servers) and ``renderD<128+index>``, 0660 in groups video and render, with by-path links.
    drm: bool = True


#: A node whose driver was loaded with ``NVreg_DeviceFileMode=0660 NVreg_DeviceFileGID=44``.
HARDENED = DeviceFiles(nvidia_mode=0o660, nvidia_gid=VIDEO_GID)


class LayoutError(RuntimeError):
    """A mock driver root or spec could not be made; the message says what is missing."""


@dataclass(frozen=True)
class MockGpu:
    """One GPU of the profile as nvidia-ctk names it: NVML index, UUID and device minor."""

    index: int
    uuid: str
    minor: int
    #: ``0000:bb:dd.f``: where sysfs lists the GPU (``/sys/bus/pci/devices/<this>``).
    bus_id: str = ""

    @property
    def device_node(self) -> str:
        """The GPU's node inside a container (and under the mock dev root)."""
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class DriverRoot:
    """A built mock driver root; paths are absolute on this machine."""

    root: Path
    driver_version: str
    gpus: tuple[MockGpu, ...]
    files: DeviceFiles = DeviceFiles()

    @property
    def lib_dir(self) -> Path:
        return self.root / LIB_DIR

    @property
    def profile(self) -> Path:
        """The profile copy the mock reads (MOCK_NVML_PROFILE)."""
        return self.root / PROFILE_IN_ROOT

    @property
    def nvml_library(self) -> Path:
        """``libnvidia-ml.so.<driver version>``: the mock, SONAME libnvidia-ml.so.1."""
        return self.lib_dir / f"libnvidia-ml.so.{self.driver_version}"

    @property
    def libcuda(self) -> Path:
        """``libcuda.so.<driver version>``: an empty stub, SONAME libcuda.so.1."""
        return self.lib_dir / f"libcuda.so.{self.driver_version}"

    @property
    def dev_root(self) -> Path:
        """What ``--dev-root`` names: the directory holding ``dev/`` (here, the driver root)."""
        return self.root

    @property
    def sysfs_pci(self) -> Path:
        """The root's stand-in for ``/sys/bus/pci/devices`` (``<bus id>/drm/<node>`` per DRM node)."""
        return self.root / "sys" / "bus" / "pci" / "devices"

    def load_uvm(self) -> None:
        """``nvidia-modprobe -u -c=0``: create ``/dev/nvidia-uvm`` and ``-tools`` (0666 root, as the
        driver makes them whatever ``NVreg_DeviceFileMode`` says)."""
        for minor, name in enumerate(UVM_NODES):
            _char_device(self.dev_root / "dev" / name, NVIDIA_UVM_MAJOR, minor, 0o666, 0)

    def unload_uvm(self) -> None:
        """``rmmod nvidia-uvm`` as far as the device nodes go: they are gone."""
        for name in UVM_NODES:
            (self.dev_root / "dev" / name).unlink(missing_ok=True)

    def uvm_loaded(self) -> bool:
        return all((self.dev_root / "dev" / name).is_char_device() for name in UVM_NODES)

    def drm_nodes(self, gpu: MockGpu) -> tuple[str, str]:
        """The GPU's ``/dev/dri`` card and render node names."""
        return f"card{gpu.index + 1}", f"renderD{RENDER_MINOR_BASE + gpu.index}"

    def nvml_env(self) -> dict[str, str]:
        """Variables under which go-nvml (or pynvml) loads the mock and the mock finds its profile."""
        return {"MOCK_NVML_PROFILE": str(self.profile), "LD_LIBRARY_PATH": str(self.lib_dir)}


def toolkit_bin() -> Path | None:
    """The built toolkit's bin dir (``nvidia-ctk``, ``nvidia-cdi-hook``), or None if not built.

    Built by ``make cluster-build`` (``hami-dra cluster build``, part of ``make test``) or just
    ``bash hack/cluster/build.sh nvidia-container-toolkit``.
    """
    bin_dir = binaries.nvidia_toolkit_bin()
    if all(os.access(bin_dir / program, os.X_OK) for program in binaries.NVIDIA_TOOLKIT_PROGRAMS):
        return bin_dir
    return None


def gpus_of(profile: Mapping[str, Any]) -> tuple[MockGpu, ...]:
    """The profile's GPUs in NVML index order (the order of ``devices``)."""
    gpus = []
    for index, device in enumerate(profile.get("devices", [])):
        if "minor" not in device:
            raise LayoutError(f"profile device {index} has no 'minor': nvidia-ctk names /dev/nvidia<minor>")
        bus = str(device.get("busId") or f"00000000:{index + 0x10:02x}:00.0")
        gpus.append(MockGpu(index, str(device["uuid"]), int(device["minor"]), pci_bus_id(bus)))
    return tuple(gpus)


def pci_bus_id(nvml_bus_id: str) -> str:
    """The bus id as go-nvlib (and sysfs) spell it: lower case, a 4-digit domain (NVML gives 8)."""
    bus = nvml_bus_id.lower()
    return bus[4:] if len(bus.split(":", 1)[0]) == 8 and bus.startswith("0000") else bus


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise LayoutError("gcc is needed to build hack/mock-nvml; run `bash hack/install.d/gcc.sh`")
    return gcc


def _shared_object(gcc: str, soname: str, out: Path, source: Path | None) -> None:
    """Build a shared object with ``soname``; ``source`` None gives an empty one (a stub that a
    loader and ldconfig accept as the library, which is all a spec test needs of libcuda)."""
    inputs = [str(source)] if source else ["-x", "c", "/dev/null"]
    flags = ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-Wl,-soname,{soname}"]
    subprocess.run([gcc, *flags, "-o", str(out), *inputs], check=True)


def _symlink(link: Path, target: str) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def _char_device(path: Path, major: int, minor: int, mode: int, gid: int) -> None:
    if not (path.is_char_device() and path.stat().st_rdev == os.makedev(major, minor)):
        path.unlink(missing_ok=True)
        try:
            os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
        except PermissionError as err:
            raise LayoutError(f"cannot create the device node {path} (mknod needs root): {err}") from err
    # The mode and group the kernel module gives them (mknod's mode went through the umask); the
    # spec copies them into fileMode and gid, and the runtime gives the container's node those.
    path.chmod(mode)
    os.chown(path, 0, gid)


def _drm_nodes(driver: DriverRoot) -> None:
    """Each GPU's DRM nodes, their ``by-path`` links and the sysfs entries that name them."""
    dri = driver.dev_root / "dev" / "dri"
    by_path = dri / "by-path"
    by_path.mkdir(parents=True, exist_ok=True)
    for gpu in driver.gpus:
        card, render = driver.drm_nodes(gpu)
        _char_device(dri / card, DRM_MAJOR, gpu.index + 1, 0o660, VIDEO_GID)
        _char_device(dri / render, DRM_MAJOR, RENDER_MINOR_BASE + gpu.index, 0o660, RENDER_GID)
        _symlink(by_path / f"pci-{gpu.bus_id}-card", f"../{card}")
        _symlink(by_path / f"pci-{gpu.bus_id}-render", f"../{render}")
        sysfs = driver.sysfs_pci / gpu.bus_id / "drm"
        for name in (card, render):
            (sysfs / name).mkdir(parents=True, exist_ok=True)


def _nvidia_smi(profile: Mapping[str, Any], gpus: tuple[MockGpu, ...]) -> str:
    """An ``nvidia-smi`` stand-in: nvidia-ctk mounts the driver's binaries, and a container that
    runs it sees the profile's GPUs in ``nvidia-smi -L`` form whatever the arguments."""
    names = [str(device.get("name", "NVIDIA GPU")) for device in profile.get("devices", [])]
    lines = [f"GPU {gpu.index}: {name} (UUID: {gpu.uuid})" for gpu, name in zip(gpus, names, strict=True)]
    body = "".join(f"echo '{line}'\n" for line in lines)
    version = profile.get("driverVersion")
    return f"#!/bin/sh\n# mock nvidia-smi, driver {version} (tests/nvidia_layouts.py)\n{body}"


def build_driver_root(
    root: Path, profile: Path | Mapping[str, Any], files: DeviceFiles = DeviceFiles()
) -> DriverRoot:
    """Lay out a mock NVIDIA driver root in ``root`` (created if missing; rebuilt files replace
    old ones) for ``profile`` (a hack/mock-nvml JSON file or the parsed dict):

    * ``usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<driverVersion>`` (the mock) and
      ``libcuda.so.<driverVersion>`` (empty stub), each with its ``.so.1`` symlink, as the driver
      installer leaves them: nvidia-ctk finds the driver's libraries by that version suffix;
    * ``usr/bin/nvidia-smi`` (a shell stand-in) and ``lib/firmware/nvidia/<driverVersion>/gsp_*.bin``
      (empty), which nvidia-ctk mounts like the real ones;
    * ``dev/nvidia<minor>`` per GPU and ``dev/nvidiactl`` (major 195, ``files``' mode and group),
      ``dev/nvidia-uvm`` and ``dev/nvidia-uvm-tools``: real character nodes, because nvidia-ctk
      skips anything else and a runtime recreates them in the container from their numbers;
    * with ``files.drm``, ``dev/dri/card<N>``/``renderD<N>``, their ``by-path`` links and
      ``sys/bus/pci/devices/<bus id>/drm/`` naming them;
    * the profile at ``etc/mock-nvml/profile.json``.
    """
    data: dict[str, Any] = json.loads(profile.read_text()) if isinstance(profile, Path) else dict(profile)
    version = str(data.get("driverVersion") or "")
    if not version:
        raise LayoutError("the profile has no driverVersion: nvidia-ctk finds the driver's files by it")
    gpus = gpus_of(data)
    gcc = _gcc()
    root.mkdir(parents=True, exist_ok=True)
    if os.statvfs(root).f_flag & os.ST_NODEV:
        raise LayoutError(f"{root} is on a filesystem mounted nodev: its device nodes could not be used")
    driver = DriverRoot(root.resolve(), version, gpus, files)

    driver.lib_dir.mkdir(parents=True, exist_ok=True)
    _shared_object(gcc, "libnvidia-ml.so.1", driver.nvml_library, MOCK_NVML_SOURCE)
    _symlink(driver.lib_dir / "libnvidia-ml.so.1", driver.nvml_library.name)
    _shared_object(gcc, "libcuda.so.1", driver.libcuda, None)
    _symlink(driver.lib_dir / "libcuda.so.1", driver.libcuda.name)

    smi = driver.root / "usr" / "bin" / "nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(_nvidia_smi(data, gpus))
    smi.chmod(0o755)
    firmware = driver.root / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        (firmware / blob).write_bytes(b"")

    dev = driver.root / "dev"
    dev.mkdir(exist_ok=True)
    for gpu in gpus:
        _char_device(dev / f"nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor, files.nvidia_mode, files.nvidia_gid)
    _char_device(dev / "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR, files.nvidia_mode, files.nvidia_gid)
    driver.load_uvm()
    shutil.rmtree(driver.root / "sys", ignore_errors=True)
    shutil.rmtree(dev / "dri", ignore_errors=True)
    if files.drm:
        _drm_nodes(driver)

    _mig_caps(driver, data)
    driver.profile.parent.mkdir(parents=True, exist_ok=True)
    driver.profile.write_text(json.dumps(data, indent=1) + "\n")
    return driver


def _mig_caps(driver: DriverRoot, data: Mapping[str, Any]) -> None:
    """What the NVIDIA driver gives MIG: ``proc/driver/nvidia-caps/mig-minors`` (every capability's
    minor, for GPU minors 0..31 as the real file lists them) and, for each GPU and compute instance
    the profile starts with, ``dev/nvidia-caps/nvidia-cap<minor>`` (0444 root, as nvidia-modprobe
    makes them), which is where nvidia-ctk and our plugin find a MIG device's capability nodes; a
    card in MIG mode without instances (MIG on demand) gets those of every GPU instance id."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            access, _ = mig_caps_minors(gpu, gi, 0)
            lines.append(f"gpu{gpu}/gi{gi}/access {access}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_caps_minors(gpu, gi, ci)[1]}" for ci in range(8)]
    minors_file = driver.root / MIG_MINORS_FILE
    minors_file.parent.mkdir(parents=True, exist_ok=True)
    minors_file.write_text("\n".join(lines) + "\n")
    caps = driver.dev_root / "dev" / "nvidia-caps"
    shutil.rmtree(caps, ignore_errors=True)
    for device, gpu in zip(data.get("devices", []), driver.gpus, strict=True):
        model = mig_model(str(device.get("name", "")))
        instances = device.get("gpuInstances") or []
        if model is None or device.get("migMode") != 1:
            continue
        caps.mkdir(exist_ok=True)
        # A card in MIG mode without instances is one for MIG on demand: the nodes of every GPU
        # instance it may get (each with its whole compute instance, id 0), as nvidia-modprobe
        # makes them on a node where instances come and go.
        ids = mig_instance_ids(model, instances) if instances else [(gi, 0) for gi in range(15)]
        for gi, ci in ids:
            for minor in mig_caps_minors(gpu.minor, gi, ci):
                _char_device(caps / f"nvidia-cap{minor}", NVIDIA_CAPS_MAJOR, minor, 0o444, 0)


def mig_instance_ids(model: MigModel, instances: list[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """(GPU instance id, compute instance id) of a mock profile's ``gpuInstances``, numbered as the
    mock library numbers them (hack/mock-nvml/mock_nvml_mig.c): the GPU instance by its placement,
    compute instances in order from 0."""
    ids = []
    for instance in instances:
        profile = model.by_id(int(instance["profileId"]))
        assert profile is not None, instance
        gi = gpu_instance_id(int(instance["start"]), profile.placement_size)
        count = len(instance.get("computeInstances") or [{}])
        ids += [(gi, ci) for ci in range(count)]
    return ids


def require_toolkit(*, required: bool = False) -> Path:
    """:func:`toolkit_bin` for a test: without a built toolkit it skips (``required``: fails),
    saying how to build it."""
    bin_dir = toolkit_bin()
    if bin_dir is None:
        give_up = pytest.fail if required else pytest.skip
        give_up(
            "the NVIDIA Container Toolkit (nvidia-ctk) is not built: run `make cluster-build` "
            "(or `bash hack/cluster/build.sh nvidia-container-toolkit`)"
        )
    return bin_dir


def mock_driver_root(
    root: Path, profile: Path, files: DeviceFiles = DeviceFiles(), *, required: bool = False
) -> DriverRoot:
    """:func:`build_driver_root` for a test: fails without gcc; skips (``required``: fails) where
    device nodes cannot be made (not root, or ``root`` on a filesystem mounted nodev)."""
    give_up = pytest.fail if required else pytest.skip
    try:
        _gcc()
    except LayoutError as err:
        pytest.fail(str(err))
    if os.geteuid() != 0:
        give_up("the mock driver root's device nodes need root (mknod)")
    root.mkdir(parents=True, exist_ok=True)
    if os.statvfs(root).f_flag & os.ST_NODEV:
        give_up(f"{root} is on a filesystem mounted nodev: no usable device nodes there")
    return build_driver_root(root, profile, files)


def spec_command(layout: Layout, driver: DriverRoot, cdi_dir: Path, bin_dir: Path) -> list[str] | None:
    """The ``nvidia-ctk cdi generate`` command line that writes ``layout``'s spec (None: "none").

    Each is what that installer runs, with the paths pointed at the mock root and our build:
    ``--driver-root``/``--dev-root`` at the mock root, ``--nvidia-cdi-hook-path`` at the built
    hook (the runtime executes it from the spec), the mode explicit (auto detects ``nvml`` here).
    """
    if layout == "none":
        return None
    common = [
        str(bin_dir / "nvidia-ctk"),
        "cdi",
        "generate",
        f"--driver-root={driver.root}",
        f"--dev-root={driver.dev_root}",
        f"--nvidia-cdi-hook-path={bin_dir / 'nvidia-cdi-hook'}",
        "--format=yaml",
        f"--output={cdi_dir / SPEC_FILES[layout]}",
    ]
    if layout == "host":
        return [*common, "--mode=nvml", "--device-name-strategy=index", "--device-name-strategy=uuid"]
    if layout == "operator":
        return [*common, "--mode=management", "--vendor=management.nvidia.com", "--class=gpu"]
    return [*common, "--mode=nvml", "--device-name-strategy=index"]


def generate_spec(
    layout: Layout,
    driver: DriverRoot,
    cdi_dir: Path,
    bin_dir: Path | None = None,
    *,
    uvm_loaded: bool = False,
) -> Path | None:
    """Write ``layout``'s spec into ``cdi_dir`` with the built ``nvidia-ctk`` and return its path
    (None for "none", which writes nothing). ``bin_dir`` defaults to the built toolkit.

    The toolkit runs with the mock on ``LD_LIBRARY_PATH`` and ``MOCK_NVML_PROFILE`` set, without
    any inherited ``NVIDIA_CTK_*`` variable (each one overrides a flag), and with the root's
    ``sys/bus/pci/devices`` over the real one in a mount namespace of its own (the DRM nodes).
    Unless ``uvm_loaded``, ``nvidia-uvm`` is not loaded while it runs (its nodes are removed and
    made again afterwards), as at boot on many real nodes: the spec lacks them.
    """
    bin_dir = bin_dir or toolkit_bin()
    if bin_dir is None:
        raise LayoutError(
            "nvidia-ctk is not built; run `make cluster-build` (or "
            "`bash hack/cluster/build.sh nvidia-container-toolkit`)"
        )
    command = spec_command(layout, driver, cdi_dir, bin_dir)
    if command is None:
        return None
    cdi_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIDIA_CTK_")}
    env.update(driver.nvml_env())
    proc_driver = driver.root / MIG_MINORS_FILE.parent.parent
    if driver.sysfs_pci.is_dir() or proc_driver.is_dir():
        command = [*_with_sysfs(driver.sysfs_pci, proc_driver), *command]
    had_uvm = driver.uvm_loaded()
    if not uvm_loaded:
        driver.unload_uvm()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        if had_uvm:
            driver.load_uvm()
    if proc.returncode != 0:
        raise LayoutError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr}")
    return cdi_dir / SPEC_FILES[layout]


_REAL_SYSFS_PCI = "/sys/bus/pci/devices"


def _with_sysfs(sysfs_pci: Path, proc_driver: Path) -> list[str]:
    """A prefix that runs a command with ``sysfs_pci`` (when the root has one: DRM nodes) mounted over
    ``/sys/bus/pci/devices`` and ``proc_driver`` over ``/proc/driver`` (nvidia-ctk reads the host's
    ``/proc/driver/nvidia-caps/mig-minors`` for MIG devices, whatever its driver root), in a private
    mount namespace (root), so nothing else on the machine sees the mock's entries."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise LayoutError("unshare (util-linux) is needed to show nvidia-ctk the mock's DRM nodes")
    script = (
        'if [ -d "$0" ]; then mount --bind "$0" ' + _REAL_SYSFS_PCI + " || exit 1; fi; "
        'mount --bind "$1" /proc/driver && shift && exec "$@"'
    )
    namespace = [unshare, "--mount", "--propagation", "private"]
    return [*namespace, "sh", "-c", script, str(sysfs_pci), str(proc_driver)]


def cdi_list(spec_dir: Path, bin_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """The CDI devices the real CDI library (``nvidia-ctk cdi list``, tags.cncf.io/container-device-
    interface as containerd and podman use it) finds in ``spec_dir``, and its registry errors (a spec
    it refuses: unknown fields, a version lower than its content needs, invalid edits)."""
    bin_dir = bin_dir or require_toolkit()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIDIA_CTK_")}
    proc = subprocess.run(
        [str(bin_dir / "nvidia-ctk"), "cdi", "list", f"--spec-dir={spec_dir}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise LayoutError(f"nvidia-ctk cdi list failed ({proc.returncode}):\n{proc.stderr}")
    errors = [
        line
        for line in proc.stderr.splitlines()
        if "level=warning" in line and "registry errors were reported" not in line
    ]
    return proc.stdout.split(), errors
