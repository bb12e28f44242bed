"""What a GPU container needs on this node, read from the NVIDIA Container Toolkit's CDI specs.

Design (issue 24): every CDI ID that NodePrepareResources returns names a device of the claim's
own transient spec (``cdi.py``), never a device of another spec. That spec is complete: the
toolkit's *common* edits (driver libraries, ``nvidia-smi``, control device nodes, its hooks, its
``NVIDIA_VISIBLE_DEVICES=void``) at spec level and, per GPU, the toolkit's edits for that GPU
(``/dev/nvidia<minor>`` and its DRI nodes). We read them instead of discovering libraries
ourselves because the toolkit already knows each distribution's layout, its hooks
(``update-ldcache``, ``create-symlinks``) and their host paths, and it regenerates the spec on
driver upgrades; we compose instead of returning ``nvidia.com/gpu=<UUID>`` because the names the
toolkit defines differ by layout:

- a host toolkit >= 1.18 (``nvidia-cdi-refresh``): kind ``nvidia.com/gpu``, names by index and UUID;
- toolkits older than 1.15 or ``--device-name-strategy=index``: index names only;
- the GPU Operator: only ``management.nvidia.com/gpu`` with one device ``all`` holding every GPU.

A GPU's edits are found by its device node, which all three layouts carry: the one device whose
nodes include ``/dev/nvidia<minor>`` and no other GPU's (taken whole, every field), else a device
holding several GPUs (``all``), cut down to that GPU (:func:`shared_cut`). Every field the CDI spec
defines is carried (``container_edits.py``); the control nodes CUDA needs are checked against the
host each time and completed from it (``control_nodes.py``). Where no spec
defines a GPU, the plugin does not publish it (``plugin.py``) and says why; a stale spec (a host
path that is gone, as after a driver upgrade without a new spec) is refused the same way, so
that no pod is scheduled onto a node where its container could not start.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.kubeletplugin.container_edits import (
    GIDS,
    Edits,
    EditsConflict,
    EditsError,
    merge_edits,
    read_edits,
)
from dra_driver.kubeletplugin.control_nodes import (
    CONTROL_NODES,
    ControlNodes,
    HostView,
    complete,
    describe_host_node,
    dev_root,
    nvidia_caps_major,
)

LOG = logging.getLogger(__name__)

#: The standard CDI registry directories, lowest priority first (a later one overrides).
REGISTRY_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
#: The toolkit's kinds we compose with, preferred first; the GPU Operator defines only the second.
TOOLKIT_KINDS = ("nvidia.com/gpu", "management.nvidia.com/gpu")
#: Told to the admin wherever no usable spec was found.
GENERATE_HINT = (
    "generate the NVIDIA Container Toolkit's spec on the node (host install: "
    "'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml', or enable nvidia-cdi-refresh; "
    "GPU Operator: enable CDI, cdi.enabled=true)"
)

_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_CAPS_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$")
#: Fields of a device shared by several GPUs that a cut for one GPU keeps as they are; its hooks
#: (DRM by-path links, nvidia-caps permissions) and network devices concern what the cut leaves out.
_SHARED_KEPT = ("env", "mounts", "intelRdt")
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ToolkitSpecError(ValueError):
    """A toolkit spec that cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class ToolkitSpec:
    """One toolkit spec file, parsed: its common edits and each device's edits by name."""

    path: Path
    kind: str
    common: Edits
    devices: dict[str, Edits]

    def gpu_minors(self, device: str) -> set[int]:
        return {
            int(match.group(1))
            for node in self.devices[device].get("deviceNodes", [])
            if (match := _GPU_NODE.match(str(node.get("path", ""))))
        }

    def caps_minors(self, device: str) -> tuple[int, ...]:
        """The ``/dev/nvidia-caps/nvidia-cap<N>`` minors a device holds: a MIG device's two access
        capabilities (GPU instance, compute instance), or every one in a device holding several."""
        return tuple(sorted(caps_minors(self.devices[device])))


@dataclass(frozen=True)
class ToolkitEdits:
    """What the toolkit says a container needs: ``common`` for any GPU, ``by_minor`` per GPU."""

    source: Path
    kind: str
    common: Edits
    by_minor: dict[int, Edits] = field(default_factory=dict)
    #: Why a GPU of the spec is unusable (a host path that does not exist), by minor number.
    stale: dict[int, str] = field(default_factory=dict)
    #: Where the plugin sees the host's files, to complete the control nodes (``control_nodes.py``).
    host: HostView = field(default_factory=lambda: HostView(None))
    #: The toolkit's MIG devices (``1:0``, ``MIG-<uuid>``) by (GPU minor, GPU instance capability
    #: minor, compute instance capability minor), taken whole like a GPU's own device.
    by_mig: dict[tuple[int, int, int], Edits] = field(default_factory=dict)
    #: Every ``nvidia-caps`` node the spec describes, by minor (its major, mode and group).
    cap_nodes: dict[int, dict[str, Any]] = field(default_factory=dict)

    def for_minor(self, minor: int) -> Edits | None:
        """The GPU's own edits, or None when the spec does not define it (or is stale for it)."""
        if minor in self.stale:
            return None
        return self.by_minor.get(minor)

    def problem(self, minor: int) -> str | None:
        """Why the GPU with ``minor`` cannot be injected through this spec, or None."""
        if minor in self.stale:
            return self.stale[minor]
        if minor not in self.by_minor:
            return f"{self.source} ({self.kind}) defines no device with /dev/nvidia{minor}"
        return None

    def for_mig(self, minor: int, caps: tuple[int, int]) -> Edits | None:
        """A MIG device's edits: the toolkit's own MIG device when the spec has it, else the parent
        card's node (``for_minor``, which for a card in MIG mode is cut from its MIG devices or from
        ``all``; the host's node where the spec has neither) with the two capability nodes (as the
        spec describes them, else as the host has them, else by number or path). None when neither
        the spec nor the host has the parent card."""
        if minor in self.stale:
            return None
        found = self.by_mig.get((minor, *caps))
        if found is not None:
            return found
        parent = self.by_minor.get(minor) or self._unlisted_card(minor)
        if parent is None:
            return None
        nodes = [self.cap_nodes.get(cap) or self._unlisted_cap(parent, cap) for cap in caps]
        return merge_edits(parent, {"deviceNodes": nodes})

    def _unlisted_card(self, minor: int) -> Edits | None:
        """The card's node for a MIG device when the spec has no device of the card: nvidia-ctk
        writes none for a card in MIG mode without instances (one in MIG on demand, before its
        first instance), so it is described from the host's node, found where the spec's control
        nodes come from. None when the host has no such node either."""
        path = f"/dev/nvidia{minor}"
        host_path = dev_root(n for n in self.common.get("deviceNodes", []) if isinstance(n, dict)) + path
        seen = self.host.seen_at(host_path)
        described = describe_host_node(path, host_path, seen) if seen is not None else None
        return None if described is None else {"deviceNodes": [described]}

    def _unlisted_cap(self, parent: Edits, cap: int) -> dict[str, Any]:
        """A capability node the spec does not describe (an instance created after the spec was
        generated, as MIG on demand's are, whose node the host may not have either): as the host's
        node where it exists; else with its type, major (``nvidia-caps`` in the host's
        /proc/devices) and minor, which the runtime creates it from in the container; else by path."""
        path = f"/dev/nvidia-caps/nvidia-cap{cap}"
        nodes = [n for n in parent.get("deviceNodes", []) if isinstance(n, dict)]
        host_path = dev_root(nodes) + path
        seen = self.host.seen_at(host_path)
        described = describe_host_node(path, host_path, seen) if seen is not None else None
        if described is not None:
            return described
        major = nvidia_caps_major(self.host)
        if major is None:
            return {"path": path}
        return {
            "path": path,
            "type": "c",
            "major": major,
            "minor": cap,
            "fileMode": 0o444,
            "permissions": "rw",
        }

    def mig_problem(self, minor: int, caps: tuple[int, int]) -> str | None:
        """Why the MIG device with capability minors ``caps`` on card ``minor`` cannot be injected,
        or None: the card is not in the spec, or a capability is neither described by the spec
        nor present on the host (a MIG device created after the spec was generated)."""
        problem = self.problem(minor)
        if problem is not None or (minor, *caps) in self.by_mig:
            return problem
        for cap in caps:
            path = f"/dev/nvidia-caps/nvidia-cap{cap}"
            seen = self.host.seen_at(path)
            if cap not in self.cap_nodes and seen is not None and not seen.exists():
                return (
                    f"{self.source} ({self.kind}) does not describe the MIG capability {path} and the "
                    "node has no such device node (a MIG device created after the spec was generated)"
                )
        return None

    def control(self, minors: list[int]) -> ControlNodes:
        """The control nodes a container with the GPUs ``minors`` lacks in this spec, as the host has
        them now (added) or why they cannot be added. Checked on every call: nodes come and go."""
        own = [self.by_minor[minor] for minor in minors if minor in self.by_minor]
        return complete([self.common, *own], self.host)


def _edits(raw: Any, where: str) -> Edits:
    try:
        return read_edits(raw, where)
    except EditsError as err:
        raise ToolkitSpecError(str(err)) from err


def parse_spec(path: Path, text: str) -> ToolkitSpec:
    """Parse one spec file (JSON or YAML, as the CDI registry reads both)."""
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_LOADER)
    except (ValueError, yaml.YAMLError) as err:
        raise ToolkitSpecError(f"{path}: not valid {path.suffix[1:].upper()}: {err}") from err
    if not isinstance(data, dict):
        raise ToolkitSpecError(f"{path}: not a CDI spec (no mapping at the top)")
    devices: dict[str, Edits] = {}
    for entry in data.get("devices") or []:
        if not isinstance(entry, dict) or not entry.get("name"):
            raise ToolkitSpecError(f"{path}: a device without a name")
        name = str(entry["name"])
        devices[name] = _edits(entry.get("containerEdits"), f"{path} device {name}")
    common = _edits(data.get("containerEdits"), str(path))
    return ToolkitSpec(path, str(data.get("kind", "")), common, devices)


def _host_paths(edits: Edits) -> Iterable[str]:
    """Files a driver upgrade replaces: mounted libraries and binaries, hook programs.

    Device nodes are not among them: they live in the host's ``/dev``, which the plugin sees
    directly, and a missing one is a lost GPU (health), not a stale spec.
    """
    for mount in edits.get("mounts", []):
        yield str(mount.get("hostPath", ""))
    for hook in edits.get("hooks", []):
        yield str(hook.get("path", ""))


def _missing(edits: Edits, host: HostView) -> str | None:
    """The first host path ``edits`` name that does not exist, of those the plugin can see."""
    for path in _host_paths(edits):
        if not path or path.startswith("/dev/"):
            continue
        seen = host.seen_at(path)
        if seen is not None and not seen.exists():
            return path
    return None


def _is_dri(node: dict[str, Any]) -> bool:
    return str(node.get("path", "")).startswith("/dev/dri/")


def shared_cut(edits: Edits, minor: int) -> Edits:
    """One GPU's part of a device that holds several (the GPU Operator's ``all``).

    Its device nodes are the GPU's own ``/dev/nvidia<minor>`` and the control nodes
    (``control_nodes.CONTROL_NODES``), never another card's node, a DRM node (which card it belongs
    to is not written there), an ``nvidia-caps`` capability or an IMEX channel: those would give a
    tenant of one GPU more than its GPU. ``additionalGids`` keeps the groups the kept nodes need
    (all of them when the nodes do not say their group); env, mounts and intelRdt are kept.
    """
    kept = [
        node
        for node in edits.get("deviceNodes", [])
        if node.get("path") == f"/dev/nvidia{minor}" or node.get("path") in CONTROL_NODES
    ]
    cut: Edits = {key: edits[key] for key in _SHARED_KEPT if edits.get(key)}
    cut["deviceNodes"] = kept
    gids = edits.get(GIDS, [])
    if gids:
        nodes = edits.get("deviceNodes", [])
        if any("gid" in node for node in nodes):
            needed = {node.get("gid") for node in kept}
            gids = [gid for gid in gids if gid in needed]
        if gids:
            cut[GIDS] = gids
    return cut


def caps_minors(edits: Edits) -> set[int]:
    """The ``nvidia-caps`` capability minors among ``edits``' device nodes."""
    return {
        int(match.group(1))
        for node in edits.get("deviceNodes", [])
        if (match := _CAPS_NODE.match(str(node.get("path", ""))))
    }


def gpu_edits(spec: ToolkitSpec) -> dict[int, Edits]:
    """Each GPU's own edits in ``spec``, by minor number (see the module docstring for the rule).

    A device that holds ``nvidia-caps`` capabilities (a MIG device, ``1:0``) is never a card's own:
    the toolkit defines no whole-card device for a card in MIG mode, and taking a MIG device's edits
    for the card would hand its capabilities to whoever gets the card. Such a card's own edits are
    cut from its MIG devices like from ``all`` (its ``/dev/nvidia<minor>`` alone).
    """
    whole: dict[int, Edits] = {}
    shared: dict[int, Edits] = {}
    for name in spec.devices:
        minors = spec.gpu_minors(name)
        if len(minors) == 1 and not spec.caps_minors(name):
            whole.setdefault(minors.pop(), spec.devices[name])
            continue
        for minor in minors:
            shared.setdefault(minor, shared_cut(spec.devices[name], minor))
    return {**shared, **whole}


def mig_edits(spec: ToolkitSpec) -> dict[tuple[int, int, int], Edits]:
    """The spec's MIG devices (one GPU node and two capability nodes) by (GPU minor, caps minors)."""
    found: dict[tuple[int, int, int], Edits] = {}
    for name in spec.devices:
        minors, caps = spec.gpu_minors(name), spec.caps_minors(name)
        if len(minors) == 1 and len(caps) == 2:
            found.setdefault((minors.pop(), caps[0], caps[1]), spec.devices[name])
    return found


def cap_nodes(spec: ToolkitSpec) -> dict[int, dict[str, Any]]:
    """Every capability node the spec describes, by minor (the first description wins)."""
    nodes: dict[int, dict[str, Any]] = {}
    for edits in spec.devices.values():
        for node in edits.get("deviceNodes", []):
            match = _CAPS_NODE.match(str(node.get("path", "")))
            if match:
                nodes.setdefault(int(match.group(1)), node)
    return nodes


def select(specs: list[ToolkitSpec], kinds: tuple[str, ...] = TOOLKIT_KINDS) -> ToolkitSpec | None:
    """The spec to compose with: of the most preferred kind present, the last file in registry order."""
    for kind in kinds:
        found = [spec for spec in specs if spec.kind == kind]
        if found:
            return found[-1]
    return None


def toolkit_edits(spec: ToolkitSpec, host: HostView | None = None) -> ToolkitEdits:
    """Index ``spec`` by GPU minor and mark every GPU whose edits name a missing host path, or whose
    edits cannot be composed with the common ones (two different ``intelRdt``)."""
    host = host if host is not None else HostView()
    by_minor = gpu_edits(spec)
    stale: dict[int, str] = {}
    common_missing = _missing(spec.common, host)
    for minor, edits in by_minor.items():
        missing = common_missing or _missing(edits, host)
        if missing:
            stale[minor] = (
                f"{spec.path} names {missing}, which does not exist on the node (a stale spec, e.g. "
                "after a driver upgrade)"
            )
            continue
        try:
            merge_edits(spec.common, edits)
        except EditsConflict as err:
            stale[minor] = f"{spec.path}: /dev/nvidia{minor}: {err}"
    return ToolkitEdits(
        spec.path, spec.kind, spec.common, by_minor, stale, host, mig_edits(spec), cap_nodes(spec)
    )


_HOST_AT_ROOT = HostView()


class ToolkitRegistry:
    """The toolkit's specs in the CDI registry dirs, re-read only when a file changed."""

    def __init__(
        self,
        dirs: tuple[Path, ...] = REGISTRY_DIRS,
        kinds: tuple[str, ...] = TOOLKIT_KINDS,
        host: HostView | Path | None = _HOST_AT_ROOT,
        ignore_prefix: str = "",
    ) -> None:
        self.dirs = dirs
        self.kinds = kinds
        #: Where the host's files are seen (stale specs, control nodes): a HostView, or where the
        #: host's / is seen (a Path; None: nowhere, nothing is checked and nothing can be added).
        self.host = host if isinstance(host, HostView) else HostView(host)
        #: Our own transient specs share the dirs; their file names start with this and are skipped.
        self.ignore_prefix = ignore_prefix
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._edits: ToolkitEdits | None = None
        self._errors: list[str] = []

    def _files(self) -> list[Path]:
        files: list[Path] = []
        for directory in self.dirs:
            try:
                entries = sorted(directory.iterdir())
            except OSError:
                continue
            files += [
                path
                for path in entries
                if path.suffix in (".json", ".yaml", ".yml")
                and not (self.ignore_prefix and path.name.startswith(self.ignore_prefix))
            ]
        return files

    def current(self) -> tuple[ToolkitEdits | None, list[str]]:
        """The edits to compose with (None: no usable spec) and the problems met reading specs."""
        files = self._files()
        stamp = []
        for path in files:
            try:
                info = path.stat()
            except OSError:
                continue
            stamp.append((str(path), info.st_mtime_ns, info.st_size))
        if tuple(stamp) != self._stamp:
            self._stamp = tuple(stamp)
            self._edits, self._errors = self._load(files)
        return self._edits, list(self._errors)

    def _load(self, files: list[Path]) -> tuple[ToolkitEdits | None, list[str]]:
        specs: list[ToolkitSpec] = []
        errors: list[str] = []
        for path in files:
            try:
                text = path.read_text()
            except OSError as err:
                errors.append(f"{path}: {err.strerror}")
                continue
            if not any(kind in text for kind in self.kinds):
                continue  # another vendor's spec: not parsed, not our business
            try:
                specs.append(parse_spec(path, text))
            except ToolkitSpecError as err:
                errors.append(str(err))
        chosen = select(specs, self.kinds)
        if chosen is None:
            return None, errors
        edits = toolkit_edits(chosen, self.host)
        LOG.info(
            "composing CDI specs with %s (kind %s): %d GPUs defined, %d stale",
            chosen.path,
            chosen.kind,
            len(edits.by_minor),
            len(edits.stale),
        )
        return edits, errors


__all__ = [
    "GENERATE_HINT",
    "ToolkitEdits",
    "ToolkitRegistry",
    "ToolkitSpec",
    "ToolkitSpecError",
    "gpu_edits",
    "merge_edits",
    "parse_spec",
    "select",
    "shared_cut",
    "toolkit_edits",
]
