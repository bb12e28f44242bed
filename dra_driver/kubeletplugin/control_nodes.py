"""The driver's control device nodes in every claim's spec, completed from the host when the toolkit's
spec lacks them.

CUDA opens ``/dev/nvidiactl`` and ``/dev/nvidia-uvm`` besides the GPU's own node; without them a
container starts and ``cuInit`` fails. The toolkit (releases up to v1.20.0) writes a control node
into its spec only if the node existed when the spec was generated, and ``nvidia-uvm`` is often
loaded later (by the first CUDA program, or ``nvidia-modprobe -u``) than the boot-time
``nvidia-cdi-refresh``. So the plugin checks each time it composes, against the host as it is now:

- a control node in the spec (common edits, or the GPU's own edits as in the GPU Operator's ``all``
  device) is taken as the toolkit wrote it;
- one the spec lacks but the host has is added to the claim's spec, described as the toolkit
  describes nodes (``hostPath``, ``major``/``minor``, ``fileMode``, ``permissions`` ``rwm``, a
  non-zero ``gid``) with ``additionalGids`` when a group is needed to open it;
- a *required* one (``nvidiactl``, ``nvidia-uvm``) that the host lacks too, or that the plugin
  cannot see, withholds the GPU with a reason that names the fix; ``nvidia-uvm-tools`` and
  ``nvidia-modeset`` (optional: profilers, display) are added when present and otherwise left out,
  as the toolkit does.

Where the host's device nodes are seen from the plugin's container is :class:`HostView`'s job.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dra_driver.kubeletplugin.container_edits import Edits, node_gid_needed

#: Every control node the toolkit puts into a spec when it exists (``controlDeviceNodeDiscoverer``).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
#: Without these CUDA cannot initialise: a GPU whose container would lack one is not given out.
REQUIRED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
#: How to make the nodes on the node, for the withheld message.
LOAD_HINT = (
    "load the driver's modules and create their device nodes on the node ('nvidia-modprobe -u -c=0' "
    "creates /dev/nvidia-uvm and -tools; 'nvidia-ctk system create-device-nodes --control-devices "
    "--load-kernel-modules' does it for every control node), then regenerate the toolkit's spec"
)


@dataclass(frozen=True)
class HostView:
    """Where the plugin sees a host path: below ``host_root`` (the host's ``/``), else below
    ``driver_root`` for paths under ``host_driver_root`` (the NVIDIA driver root's host path, which
    the chart mounts at ``driver_root``). None for a path it cannot see."""

    host_root: Path | None = Path("/")
    host_driver_root: PurePosixPath | None = None
    driver_root: Path | None = None

    def seen_at(self, host_path: str) -> Path | None:
        if not host_path.startswith("/"):
            return None
        if self.host_root is not None:
            return self.host_root / host_path.lstrip("/")
        if self.host_driver_root is not None and self.driver_root is not None:
            try:
                rest = PurePosixPath(host_path).relative_to(self.host_driver_root)
            except ValueError:
                return None
            return self.driver_root / rest
        return None


@dataclass(frozen=True)
class ControlNodes:
    """What a GPU's claim spec needs besides the toolkit's edits: ``edits`` to add (spec level) or
    ``problem``, why the GPU cannot be given out (None: nothing missing)."""

    edits: Edits
    problem: str | None = None


def _nodes(parts: Iterable[Edits]) -> list[dict[str, Any]]:
    return [node for part in parts for node in part.get("deviceNodes", []) if isinstance(node, dict)]


def dev_root(nodes: Iterable[dict[str, Any]]) -> str:
    """The host directory holding ``dev/`` that the spec's nodes come from ("" for the host's ``/``):
    a node's ``hostPath`` is this plus its ``path`` (``nvidia-ctk cdi generate --dev-root``)."""
    for node in nodes:
        path, host_path = str(node.get("path", "")), str(node.get("hostPath") or "")
        if host_path and path.startswith("/dev/") and host_path.endswith(path):
            return host_path[: -len(path)]
    return ""


def describe_host_node(path: str, host_path: str, seen: Path) -> dict[str, Any] | None:
    """``path`` as the toolkit's spec describes a character device node found at ``seen``, or None
    when there is none (a missing file, or something other than a character device)."""
    try:
        info = os.lstat(seen)
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    node: dict[str, Any] = {"path": path}
    if host_path != path:
        node["hostPath"] = host_path
    node["major"] = os.major(info.st_rdev)
    node["minor"] = os.minor(info.st_rdev)
    mode = stat.S_IMODE(info.st_mode)
    if mode:
        node["fileMode"] = mode
    node["permissions"] = "rwm"
    if info.st_gid:
        node["gid"] = info.st_gid
    return node


def nvidia_caps_major(host: HostView) -> int | None:
    """The ``nvidia-caps`` character major the host's kernel gave (``/proc/devices``), or None."""
    seen = host.seen_at("/proc/devices")
    try:
        text = seen.read_text() if seen is not None else ""
    except OSError:
        return None
    for line in text.splitlines():
        number, _, name = line.strip().partition(" ")
        if name.strip() == "nvidia-caps" and number.isdigit():
            return int(number)
    return None


def _listed(paths: list[str], root: str) -> str:
    return ", ".join(f"{root}{path}" for path in paths)


def complete(present: Iterable[Edits], host: HostView) -> ControlNodes:
    """The control nodes missing from ``present`` (the edits a GPU's container gets from the
    toolkit's spec), added from the host or named in a problem (see the module docstring)."""
    nodes = _nodes(present)
    have = {str(node.get("path", "")) for node in nodes}
    root = dev_root(nodes)
    added: list[dict[str, Any]] = []
    unseen: list[str] = []
    absent: list[str] = []
    for path in CONTROL_NODES:
        if path in have:
            continue
        host_path = f"{root}{path}"
        seen = host.seen_at(host_path)
        node = describe_host_node(path, host_path, seen) if seen is not None else None
        if node is not None:
            added.append(node)
        elif path in REQUIRED_NODES:
            (unseen if seen is None else absent).append(path)
    if absent or unseen:
        where = []
        if absent:
            where.append(f"{_listed(absent, root)} missing on the node too")
        if unseen:
            where.append(f"{_listed(unseen, root)} not visible to the plugin, so it cannot add them")
        return ControlNodes(
            {},
            f"the toolkit's spec has no {' or '.join(absent + unseen)}, which CUDA needs "
            f"({'; '.join(where)}): {LOAD_HINT}",
        )
    edits: Edits = {}
    if added:
        edits["deviceNodes"] = added
        gids = [gid for node in added if (gid := node_gid_needed(node))]
        if gids:
            edits["additionalGids"] = gids
    return ControlNodes(edits)
