"""Leave nothing behind: pods and shims of our containerd, mounts under the state dir, the bridge.

Used by ``cluster down`` (after the processes stopped) and by ``cluster up`` before it starts, so
a cluster whose supervisor was killed is cleaned up by the next start.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from hami_dra_dev.cluster.binaries import cache_dir
from hami_dra_dev.cluster.layout import BRIDGE, CDI_DIR, NODE_IP, NODE_LINK, Layout
from hami_dra_dev.pidfile import alive

log = logging.getLogger(__name__)
_MNT_DETACH = 2


def remove_pods(crictl: Path, layout: Layout) -> None:
    """Stop and remove every pod sandbox (and its containers) while containerd still runs."""
    if not layout.containerd_socket.exists():
        return
    endpoint = f"unix://{layout.containerd_socket}"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [str(crictl), "--runtime-endpoint", endpoint, "--timeout", "20s", "rmp", "--all", "--force"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip


def _cmdlines() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        found.append((int(entry.name), raw.replace(b"\0", b" ").decode(errors="replace")))
    return found


#: What the cluster starts besides the upstream binaries of the cache: containerd's shims, our components.
_OURS = ("containerd-shim", "dra_driver.cli")


def kill_leftovers(layout: Layout) -> list[int]:
    """SIGKILL the processes this cluster started that outlived it (they name its state dir).

    Only programs the cluster runs are considered (see ``_OURS``), never, say, an editor or a
    ``tail -f`` that has one of its log files open; ``cluster up`` itself is left alone.
    """
    root = str(layout.root)
    me = os.getpid()
    marks = (str(cache_dir()), *_OURS)
    victims = [
        pid
        for pid, cmd in _cmdlines()
        if root in cmd and pid != me and "cluster up" not in cmd and any(mark in cmd for mark in marks)
    ]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while victims and time.monotonic() < deadline:
        victims = [pid for pid in victims if alive(pid)]
        time.sleep(0.05)
    return victims


def mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix) or point == str(root):
                points.append(point)
    return points


def unmount_all(root: Path) -> list[str]:
    """Detach every mount under ``root``, deepest first; returns what is still mounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(3):
        points = sorted(set(mounts_under(root)), key=len, reverse=True)
        if not points:
            return []
        for point in points:
            if libc.umount2(point.encode(), _MNT_DETACH) != 0:
                log.debug("umount %s: errno %d", point, ctypes.get_errno())
    return mounts_under(root)


def remove_cdi_specs(layout: Layout) -> list[str]:
    """Remove the CDI specs of claims our plugin still has in its checkpoint on this cluster.

    The specs live in the machine-wide ``/var/run/cdi``; a pod that was not unprepared through the
    kubelet (the cluster stopped, or was killed, with pods running) would leave its spec there.
    """
    from dra_driver.kubeletplugin.cdi import CdiNames

    removed = []
    plugins = layout.kubelet_root / "plugins"
    for checkpoint in plugins.glob("*/checkpoint.json") if plugins.is_dir() else ():
        try:
            claims = json.loads(checkpoint.read_text()).get("claims") or {}
        except (OSError, ValueError) as err:
            log.warning("cannot read %s to remove its CDI specs: %s", checkpoint, err)
            continue
        names = CdiNames(checkpoint.parent.name)
        for uid in claims:
            spec = CDI_DIR / names.spec_file_name(str(uid))
            with contextlib.suppress(FileNotFoundError):
                spec.unlink()
                removed.append(str(spec))
    return removed


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=10)


def remove_links() -> None:
    """Delete the pod bridge and the node's address (absent ones are fine)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _ip("link", "delete", BRIDGE)
        _ip("addr", "delete", f"{NODE_IP}/32", "dev", NODE_LINK)


def remove_service_rules(kube_proxy: Path) -> None:
    """Drop the KUBE-* chains kube-proxy left in the host's iptables (it never removes them itself)."""
    try:
        result = subprocess.run(
            [str(kube_proxy), "--cleanup"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("kube-proxy --cleanup failed: %s", err)
        return
    if result.returncode != 0:
        log.warning("kube-proxy --cleanup exited %d: %s", result.returncode, result.stderr.strip()[-500:])


def add_node_address() -> None:
    """Put the node IP (see layout.NODE_IP) on the loopback interface: local, and no kernel module."""
    result = _ip("addr", "replace", f"{NODE_IP}/32", "dev", NODE_LINK)
    if result.returncode != 0:
        raise OSError(f"cannot add {NODE_IP} to {NODE_LINK}: {result.stderr.strip()}")


def clean(layout: Layout, crictl: Path | None) -> list[str]:
    """Everything above, in order; returns problems that remain (empty when clean)."""
    if crictl is not None:
        remove_pods(crictl, layout)
    problems = [f"process {pid} would not die" for pid in kill_leftovers(layout)]
    remove_cdi_specs(layout)
    problems += [f"still mounted: {point}" for point in unmount_all(layout.root)]
    remove_links()
    return problems
