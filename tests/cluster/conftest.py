"""One real single-node cluster (``hami-dra cluster up --no-driver``) for the whole ``cluster``
test session, and the driver on it in both of the ways it runs (``driver``, see drivers.py): as
host processes, then installed by its Helm chart. Tests that take ``driver`` run once per way.

The cluster runs as a child process of the tests, exactly as a user starts it, in the default
state directory (the one charts/hami-dra/values-local.yaml names), and is stopped with SIGTERM
at the end (``cluster down`` does the same). Its binaries come from the version
cache that ``make test`` fills first (``hack/cluster/build.sh``); where they are missing, or the
tests do not run as root, the suite skips with the reason, except under CI, where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hami_dra_dev.cluster.binaries import MissingBinaries, Toolchain, require_toolchain
from hami_dra_dev.cluster.child import ClusterChild, ClusterStartFailed
from hami_dra_dev.cluster.layout import default_state_dir
from hami_dra_dev.pidfile import running_pid
from tests.chart.helpers import find_or_install_helm
from tests.cluster.drivers import ChartDriver, DriverUnderTest, HostDriver

NAMESPACE = "default"
UP_TIMEOUT = 240.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"real-cluster suite cannot run under CI: {reason}")
    pytest.skip(reason)


@dataclass
class RealCluster:
    """What a test needs: kubeconfig, the real kubectl, the kubernetes client, the state dir."""

    kubeconfig: Path
    state_dir: Path
    toolchain: Toolchain
    api_client: Any
    output: list[str]
    #: The driver the current test runs against (set by the ``driver`` fixture).
    driver: DriverUnderTest | None = field(default=None)

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        result = subprocess.run(
            [str(self.toolchain.path("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, input=stdin, timeout=180, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout + (result.stderr if not check else "")

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def log(self, component: str) -> str:
        """A host process's log: the cluster's components, or the driver run as host processes."""
        return (self.state_dir / "logs" / f"{component}.log").read_text(errors="replace")

    def driver_log(self, component: str) -> str:
        """``controller``, ``webhook`` or ``kubelet-plugin`` of the driver under test."""
        assert self.driver is not None, "the test needs the driver fixture"
        return self.driver.log(component)


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    if os.geteuid() != 0:
        _unavailable("the real cluster runs a kubelet and containerd, which need root")
    version = os.environ.get("KUBERNETES_VERSION") or None
    try:
        toolchain = require_toolchain(version)
    except MissingBinaries as err:
        _unavailable(f"{err} (make test builds them first)")
    state_dir = default_state_dir()
    if running_pid(state_dir / "cluster.pid") is not None:
        _unavailable(f"a cluster is already running from {state_dir}; stop it with `hami-dra cluster down`")
    cluster = ClusterChild(state_dir, version)
    try:
        kubeconfig = cluster.start(UP_TIMEOUT)
    except ClusterStartFailed as err:
        pytest.fail(str(err))
    try:
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        yield RealCluster(kubeconfig, state_dir, toolchain, new_client(str(kubeconfig)), cluster.output)
    finally:
        cluster.stop()


@pytest.fixture(scope="session", params=["host", "chart"])
def driver(
    request: pytest.FixtureRequest, real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverUnderTest]:
    """The driver as host processes, then as the chart installs it (pytest groups the tests by
    this parameter, so each way is set up once). A test module that is about the chart alone
    parametrizes it to ``["chart"]`` indirectly and shares the same install."""
    started: DriverUnderTest
    proxy = None
    if request.param == "host":
        started = HostDriver(real_cluster)
    elif request.param == "faults":
        # The host-process driver with the controller's API traffic through a fault proxy.
        from hami_dra_dev.cluster.layout import NODE_IP, Layout
        from tests.api_proxy import ApiFaultProxy, proxied_kubeconfig

        proxy = ApiFaultProxy((NODE_IP, Layout(real_cluster.state_dir).ports.apiserver))
        kubeconfig = proxied_kubeconfig(
            real_cluster.kubeconfig, proxy.port, real_cluster.state_dir / "controller-proxied.kubeconfig"
        )
        started = HostDriver(real_cluster, controller_kubeconfig=str(kubeconfig))
        started.proxy = proxy
    else:
        helm, why = find_or_install_helm()
        if helm is None:
            _unavailable(f"helm is not installed and hack/install.d/helm.sh could not install it: {why}")
        assert helm is not None
        if request.param == "registry":
            # The chart and image `make release` pushed to a local registry, installed from it.
            from tests.cluster.registry import RegistryDriver

            root = tmp_path_factory.mktemp("release")
            try:
                started = RegistryDriver(real_cluster, helm, root)
            except FileNotFoundError as err:  # docker-registry not installed (hack/install.d/registry.sh)
                _unavailable(str(err))
                raise
        else:
            started = ChartDriver(real_cluster, helm)
    real_cluster.driver = started
    try:
        yield started
    finally:
        real_cluster.driver = None
        started.stop()
        if proxy is not None:
            proxy.stop()


def _install_the_chart_again(request: pytest.FixtureRequest) -> None:
    """The chart driver is one release for the whole session; a module that uninstalls it (the
    last test of test_helm_install.py) would leave every chart test after it waiting for classes
    nobody installed. Whatever the order, a test that takes the chart driver finds it installed."""
    if "driver" not in request.fixturenames:
        return
    driver = request.getfixturevalue("driver")
    if isinstance(driver, ChartDriver) and not driver.installed:
        driver.install()


@pytest.fixture(scope="module", autouse=True)
def chart_installed_for_the_module(request: pytest.FixtureRequest) -> None:
    """Before the module's own fixtures (``tenancy``, ...) use the driver."""
    _install_the_chart_again(request)


@pytest.fixture(autouse=True)
def chart_installed(request: pytest.FixtureRequest) -> None:
    """And before each test: one of the same module may have uninstalled it."""
    _install_the_chart_again(request)


@pytest.fixture(scope="module")
def tenancy(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[Any]:
    """An untrusted tenant and its namespaces, fresh for each attack module (tests/cluster/tenancy.py)."""
    from tests.cluster.tenancy import tenant_namespaces

    yield from tenant_namespaces(real_cluster, driver)
