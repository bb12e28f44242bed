"""Helpers for the Helm chart tests: paths, running helm, picking objects out of a render."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hami-dra"
EXAMPLES = REPO / "api" / "examples"
ALL_ON = Path(__file__).with_name("values-all-on.yaml")
NAMESPACE = "hami-system"
RELEASE = "t"

Render = Callable[..., list[dict[str, Any]]]


class HelmError(Exception):
    """helm exited non-zero; the message is helm's stderr."""


def find_or_install_helm() -> tuple[str | None, str]:
    """The helm binary (installing it with hack/install.d/helm.sh if needed), or None and why not."""
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local), ""
    script = REPO / "hack" / "install.d" / "helm.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode == 0 and local.is_file():
        return str(local), ""
    on_path = shutil.which("helm")
    if on_path:
        return on_path, ""
    return None, (proc.stderr or proc.stdout).strip()[-400:]


def run_helm(helm: str, *args: str) -> str:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


def find(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of ``kind`` whose name ends with ``name_suffix``."""
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def all_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result
