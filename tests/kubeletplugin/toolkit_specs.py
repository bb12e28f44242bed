"""Toolkit CDI specs shaped as ``nvidia-ctk cdi generate`` writes them, for unit tests.

The real tool's output for each layout is checked in ``tests/devices/test_toolkit_layouts.py``
(built from its Go module); these small hand-made ones keep the plugin's unit tests fast and
independent of that build, with the same structure: common edits (``NVIDIA_VISIBLE_DEVICES=void``,
control nodes, library mounts, hooks) and per-device edits naming ``/dev/nvidia<minor>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "550.54.15"
HOOK = "/usr/bin/nvidia-cdi-hook"


def common_edits(root: str = "") -> dict[str, Any]:
    lib = f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    return {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
        "mounts": [
            {"hostPath": f"{root}{lib}", "containerPath": lib, "options": ["ro", "nosuid", "nodev", "bind"]}
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": HOOK,
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR],
            }
        ],
    }


def gpu_device(name: str, minor: int) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]}}


def toolkit_spec(layout: str, uuids: list[str], minors: list[int], root: str = "") -> dict[str, Any]:
    """``host`` (index and UUID names, plus ``all``), ``index-only`` or ``operator`` (``all`` only)."""
    every = {"name": "all", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{m}"} for m in minors]}}
    if layout == "operator":
        every["containerEdits"]["deviceNodes"] += [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
        edits = common_edits(root)
        del edits["deviceNodes"]
        return {
            "cdiVersion": "0.5.0",
            "kind": "management.nvidia.com/gpu",
            "devices": [every],
            "containerEdits": edits,
        }
    devices = [gpu_device(str(index), minor) for index, minor in enumerate(minors)]
    if layout == "host":
        devices += [gpu_device(uuid, minor) for uuid, minor in zip(uuids, minors, strict=True)]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [*devices, every],
        "containerEdits": common_edits(root),
    }


def write_toolkit_spec(directory: Path, layout: str, uuids: list[str], minors: list[int]) -> Path:
    spec = toolkit_spec(layout, uuids, minors)
    name = "management.nvidia.com-gpu.yaml" if layout == "operator" else "nvidia.yaml"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(yaml.safe_dump(spec))
    return directory / name


def host_root_with_libraries(root: Path) -> Path:
    """A directory standing in for the host's ``/`` that has the files the specs above name."""
    for path in (f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}", HOOK):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text("")
    return root
