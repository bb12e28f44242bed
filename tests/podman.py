"""podman for the tests that run a real container from a CDI spec: no registry, a busybox image.

podman 4.3 reads CDI specs only from /etc/cdi and :data:`CDI_DIR`, so these tests need root;
podman, runc and busybox-static come from hack/install.d/podman.sh. :func:`busybox_podman` skips
with the reason where any of that is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

#: The CDI dir podman reads that tests may write to (the other, /etc/cdi, is the machine's).
CDI_DIR = Path("/var/run/cdi")
CONTAINERS_CONF = (
    "[containers]\n"
    'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    "[engine]\n"
    'runtime = "runc"\n'
    'cgroup_manager = "cgroupfs"\n'
    'events_logger = "file"\n'
)


class Podman:
    """podman with its own storage under ``root`` (vfs, runc, cgroupfs: what these machines run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        conf = root / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [
            "podman",
            "--root", str(self.root / "root"),
            "--runroot", str(self.root / "runroot"),
            "--tmpdir", str(self.root / "tmp"),
            "--storage-driver", "vfs",
            *args,
        ]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)


def busybox_podman(root: Path, image: str) -> Podman:
    """podman storing under ``root`` (keep it short: runroot paths must stay under 50 characters)
    with ``image`` imported: busybox alone, no ldconfig and no libc, which a spec's hooks must cope
    with. Skips the test without root, podman, runc or busybox-static."""
    if os.geteuid() != 0:
        pytest.skip(f"podman test needs root (CDI specs are read from {CDI_DIR})")
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    busybox = shutil.which("busybox") or "/bin/busybox"
    if missing or not Path(busybox).is_file():
        pytest.skip(f"missing {missing or ['busybox-static']}: run hack/install.d/podman.sh")
    engine = Podman(root)
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    subprocess.run(["chroot", str(rootfs), "/bin/busybox", "--install", "-s", "/bin"], check=True)
    for directory in ("dev", "proc", "sys", "etc", "tmp"):
        (rootfs / directory).mkdir(exist_ok=True)
    tarball = root / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(rootfs, arcname=".")
    imported = engine("import", str(tarball), image)
    assert imported.returncode == 0, imported.stderr
    return engine
