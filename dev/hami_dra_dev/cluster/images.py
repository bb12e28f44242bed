"""The two images the cluster needs, built locally because no registry can be reached.

- the pod sandbox image (``registry.k8s.io/pause``): a static ``pause`` program compiled with gcc
  from :data:`PAUSE_SOURCE` (sleep until SIGINT/SIGTERM, reap zombies);
- ``busybox:1.36``: Debian's ``busybox-static`` with its applets linked under ``/bin``.

Each is written as an OCI image layout archive (one uncompressed layer) and imported with
``ctr -n k8s.io images import``, the namespace kubelet's CRI uses. The archives are cached in the
state directory, so a restarted cluster imports without rebuilding.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from hami_dra_dev.cluster.layout import BUSYBOX_IMAGE, PAUSE_IMAGE

BUSYBOX = Path("/bin/busybox")

PAUSE_SOURCE = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


class ImageError(RuntimeError):
    """A tool the images need (gcc, busybox-static, ctr) is missing or failed."""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_archive(path: Path, ref: str, layer: bytes, config: dict[str, Any]) -> Path:
    """An OCI image layout tar holding one image named ``ref`` (containerd's name annotation)."""
    blobs: dict[str, bytes] = {}
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    image_config = {
        "architecture": _arch(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(blobs, json.dumps(image_config).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(blobs, json.dumps(manifest).encode()),
        "platform": {"architecture": _arch(), "os": "linux"},
        "annotations": {
            "io.containerd.image.name": ref,
            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
        },
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add_file(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644)
        _add_file(tar, "index.json", json.dumps(index).encode(), 0o644)
        for digest, data in blobs.items():
            _add_file(tar, f"blobs/sha256/{digest}", data, 0o644)
    tmp.replace(path)
    return path


def _layer(build: Any) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        build(tar)
    return buffer.getvalue()


def pause_archive(directory: Path) -> Path:
    archive = directory / "pause.oci.tar"
    if archive.exists():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    source, binary = directory / "pause.c", directory / "pause"
    source.write_text(PAUSE_SOURCE)
    try:
        subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(source)], check=True,
                       capture_output=True, text=True)  # fmt: skip
    except FileNotFoundError as err:
        raise ImageError("gcc not found; install it (hack/install.d/gcc.sh)") from err
    except subprocess.CalledProcessError as err:
        raise ImageError(f"gcc could not build the pause program: {err.stderr.strip()}") from err
    data = binary.read_bytes()
    layer = _layer(lambda tar: _add_file(tar, "pause", data))
    return write_oci_archive(archive, PAUSE_IMAGE, layer, {"Entrypoint": ["/pause"]})


def busybox_archive(directory: Path) -> Path:
    archive = directory / "busybox.oci.tar"
    if archive.exists():
        return archive
    if not BUSYBOX.is_file():
        raise ImageError(f"{BUSYBOX} not found; install Debian's busybox-static (hack/install.d/podman.sh)")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    data = BUSYBOX.read_bytes()

    def build(tar: tarfile.TarFile) -> None:
        for name in ("bin", "etc", "tmp", "proc", "sys", "dev", "var", "root"):
            _add_dir(tar, name)
        _add_file(tar, "bin/busybox", data)
        for applet in applets:
            if applet != "busybox":
                _add_link(tar, f"bin/{applet}", "busybox")
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        _add_file(tar, "etc/group", b"root:x:0:\n", 0o644)

    config = {"Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    return write_oci_archive(archive, BUSYBOX_IMAGE, _layer(build), config)


def driver_image_archive() -> Path:
    """Where ``make image`` (hack/image/build.sh) leaves the driver's image as an OCI archive."""
    from dra_driver import __version__
    from hami_dra_dev.cluster.binaries import cache_dir

    return cache_dir() / "image" / f"hami-dra-{__version__}.oci.tar"


#: The name ``make image`` gives the driver's image (charts/hami-dra/values-local.yaml uses it).
DRIVER_IMAGE_REPOSITORY = "localhost/hami-dra"


def import_images(ctr: Path, socket: Path, directory: Path) -> list[str]:
    """Build (once) and import both images into containerd's ``k8s.io`` namespace, and the
    driver's image too when ``make image`` has built it, so the chart installs in either order."""
    imported = []
    wanted = [(pause_archive(directory), PAUSE_IMAGE), (busybox_archive(directory), BUSYBOX_IMAGE)]
    if driver_image_archive().is_file():
        wanted.append((driver_image_archive(), DRIVER_IMAGE_REPOSITORY))
    for archive, ref in wanted:
        try:
            subprocess.run(
                [str(ctr), "--address", str(socket), "-n", "k8s.io", "images", "import", str(archive)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
        except subprocess.CalledProcessError as err:
            raise ImageError(f"ctr could not import {ref}: {err.stderr.strip()}") from err
        imported.append(ref)
    return imported
