"""The chart's monitoring on the real cluster, read by a real Prometheus (Debian's package).

The chart is upgraded with monitoring on (PodMonitor and PrometheusRule are Prometheus Operator
kinds; the test installs stand-in CRDs that accept any spec, as the operator's would, so the API
server stores what the chart renders). Prometheus runs as a child process with a static scrape
config of the components' pod addresses (what a PodMonitor makes the operator generate) and the
rules of the PrometheusRule read back from the API, scraping and evaluating every second. A few
pods with claims run on the 4 x T4 lab, one pod stays pending, a GpuQuota limits their namespace;
then every panel query of the dashboard ConfigMap and every alert's query (the expression without
its threshold) returns data. Finally an overcommit is injected as another allocator (or a human)
could make one: two claims whose allocations, written by the admin, take 10Gi each of one 15Gi
card. The controller reports it and HamiDraGpuOvercommitted fires. Then the components go away:
the controller scaled to 0 fires HamiDraControllerDown (its targets vanish: the `or vector(0)`
path, not `up == 0`), the webhook scaled to 0 fires HamiDraWebhookDown and, from the real API
server's own counters, HamiDraWebhookCallsFailing (a pod refused) and HamiDraWebhookFailedOpen (a
DeviceClass let through). Every query's result goes to build/monitoring-report.txt (what the
dashboard would show).

Prometheus finds the components as the Operator's PodMonitor config does: the pods the monitors'
selector labels match, by their port's name, `job` `<namespace>/<monitor>`, a `pod` label; so a
deleted pod's target disappears. Debian's Prometheus has no Kubernetes discovery, so the test
lists the pods and writes them for file discovery (``PodDiscovery``), again after each scaling.
It also scrapes the real kube-apiserver and kube-scheduler with the admin's client certificate.
kube-state-metrics is not in the lab: HamiDraKubeletPluginUnavailable is evaluated by
tests/chart/test_alert_rules.py.

The chart is restored (upgraded without the monitoring values) at the module's end.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.quota import crd
from hami_dra_dev.cluster.layout import Layout
from tests.chart.helpers import REPO
from tests.chart.monitoring import MONITORING_SETS, Query, panel_queries, split_threshold
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import (
    CHART_NAMESPACE,
    COMPONENT_LABEL,
    DRIVER,
    RELEASE,
    ChartDriver,
    DriverUnderTest,
)
from tests.cluster.tenancy import claim, manifest, pod
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

NAMESPACE = "gpu-monitoring"
COMPONENTS = ("controller", "kubelet-plugin", "webhook")
#: Pods of the lab: two shares that run, one claim no card can hold (stays pending).
RUNNING = {"small-a": "2Gi", "small-b": "3Gi"}
PENDING = {"huge": "100Gi"}
#: Seconds between scrapes and rule evaluations: short, so the test is quick.
INTERVAL = "1s"
DATA_TIMEOUT = 120.0
#: Every query and what it returned, for a reader without Grafana (the issue's closing note).
REPORT = REPO / "build" / "monitoring-report.txt"
#: The monitoring values, with the components-down alerts firing after 10 s instead of 5 minutes
#: and the scheduler's rule group on.
RULE_SETS = (
    *MONITORING_SETS,
    "monitoring.prometheusRule.downFor=10s",
    "monitoring.prometheusRule.scheduler=true",
)
#: Alerts whose query has no data in a healthy lab, and why.
NO_DATA_WHEN_HEALTHY = {
    "HamiDraKubeletPluginUnavailable": "kube-state-metrics is not installed in the lab",
    # The API server creates these counters at a webhook's first failed call:
    "HamiDraWebhookCallsFailing": "no failed call yet (test_the_webhook_scaled_to_zero_fires_its_alerts)",
    "HamiDraWebhookFailedOpen": "no failed call yet (test_the_webhook_scaled_to_zero_fires_its_alerts)",
}


def _crd(kind: str, plural: str) -> dict[str, Any]:
    """A stand-in for a Prometheus Operator CRD: the kind exists, any spec is kept as written."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


STAND_IN_CRDS = (_crd("PodMonitor", "podmonitors"), _crd("PrometheusRule", "prometheusrules"))


def _prometheus_binary() -> str:
    local = REPO / ".tools" / "bin" / "prometheus"
    if not local.exists():
        script = REPO / "hack" / "install.d" / "prometheus.sh"
        subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300, check=False)
    if not local.exists():
        pytest.skip("Prometheus is not installed and hack/install.d/prometheus.sh could not install it")
    return str(local)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Prometheus:
    """A Prometheus child process and its HTTP API."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            assert self.process.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
            return False

    def all_up(self) -> bool:
        targets = self.api("targets")["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@dataclass
class Monitoring:
    cluster: RealCluster
    prometheus: Prometheus
    panels: list[Query]
    rules: list[dict[str, Any]]
    driver: ChartDriver
    discovery: PodDiscovery


@dataclass(frozen=True)
class Kubeconfig:
    """What Prometheus needs to reach the API server as the admin: its URL, CA and client pair."""

    path: Path
    server: str
    ca: str
    cert: str
    key: str

    @classmethod
    def read(cls, path: Path) -> Kubeconfig:
        config = yaml.safe_load(path.read_text())
        [cluster] = config["clusters"]
        [user] = config["users"]
        return cls(path, cluster["cluster"]["server"], cluster["cluster"]["certificate-authority"],
                   user["user"]["client-certificate"], user["user"]["client-key"])  # fmt: skip


@dataclass
class PodDiscovery:
    """What the Prometheus Operator's PodMonitor config makes Prometheus discover, written as file
    discovery (Debian's Prometheus is built without Kubernetes discovery): for each monitor the
    pods its selector's labels match in its namespaces, that have not ended, one target per
    container port of the endpoint's name, labelled ``namespace`` and ``pod``. ``refresh()``
    re-lists the pods: a deleted pod's target disappears as with the operator."""

    cluster: RealCluster
    monitors: list[dict[str, Any]]
    directory: Path

    def file(self, monitor: dict[str, Any]) -> Path:
        return self.directory / f"{monitor['metadata']['name']}.json"

    def targets(self, monitor: dict[str, Any]) -> list[dict[str, Any]]:
        spec = monitor["spec"]
        [endpoint] = spec["podMetricsEndpoints"]
        selector = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
        groups = []
        for namespace in spec["namespaceSelector"]["matchNames"]:
            for item in self.cluster.get("pods", "-n", namespace, "-l", selector)["items"]:
                status = item.get("status") or {}
                if status.get("phase") in ("Failed", "Succeeded") or not status.get("podIP"):
                    continue
                for container in item["spec"]["containers"]:
                    for port in container.get("ports", ()):
                        if port.get("name") == endpoint["port"]:
                            groups.append({
                                "targets": [f"{status['podIP']}:{port['containerPort']}"],
                                "labels": {"namespace": namespace, "pod": item["metadata"]["name"]},
                            })  # fmt: skip
        return groups

    def refresh(self) -> None:
        for monitor in self.monitors:
            written = self.file(monitor).with_suffix(".tmp")
            written.write_text(json.dumps(self.targets(monitor)))
            written.replace(self.file(monitor))  # Prometheus never reads half a file

    def job(self, monitor: dict[str, Any]) -> dict[str, Any]:
        """The monitor's scrape job: ``job`` ``<namespace>/<name>`` (no jobLabel set), its path and scheme."""
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        meta = monitor["metadata"]
        job: dict[str, Any] = {
            "job_name": f"{meta['namespace']}/{meta['name']}",
            "metrics_path": endpoint["path"],
            "file_sd_configs": [{"files": [str(self.file(monitor))], "refresh_interval": "1s"}],
        }
        if endpoint.get("scheme") == "https":
            job |= {"scheme": "https", "tls_config": {"insecure_skip_verify": True}}
        return job


def _control_plane_jobs(kubeconfig: Kubeconfig, scheduler_port: int) -> list[dict[str, Any]]:
    """kube-apiserver and kube-scheduler, as the admin (system:masters may read /metrics)."""
    client = {"cert_file": kubeconfig.cert, "key_file": kubeconfig.key}
    server = urllib.parse.urlsplit(kubeconfig.server)
    return [
        {"job_name": "apiserver", "scheme": "https", "static_configs": [{"targets": [server.netloc]}],
         "tls_config": {"ca_file": kubeconfig.ca, **client}},
        # its serving certificate is self-signed for its loopback address
        {"job_name": "kube-scheduler", "scheme": "https",
         "static_configs": [{"targets": [f"127.0.0.1:{scheduler_port}"]}],
         "tls_config": {"insecure_skip_verify": True, **client}},
    ]  # fmt: skip


def _scrape_config(
    discovery: PodDiscovery, kubeconfig: Kubeconfig, layout: Layout, rules_file: Path
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            *(discovery.job(m) for m in discovery.monitors),
            *_control_plane_jobs(kubeconfig, layout.ports.scheduler),
        ],
    }


def _workloads(cluster: RealCluster) -> None:
    cluster.kubectl("create", "namespace", NAMESPACE)
    quota = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": "team", "namespace": NAMESPACE},
        "spec": {"hard": {"memory": "200Gi"}},
    }
    objects = [quota]
    for name, memory in {**RUNNING, **PENDING}.items():
        objects += [claim(name, memory), pod(name, name)]
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(*objects))
    for name in RUNNING:
        waited = cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", NAMESPACE,
                                 "--timeout=120s", check=False)  # fmt: skip
        assert "condition met" in waited, cluster.kubectl(
            "describe", "pod", name, "-n", NAMESPACE, check=False
        )


@pytest.fixture(scope="module")
def monitoring(
    real_cluster: RealCluster, driver: DriverUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitoring]:
    assert isinstance(driver, ChartDriver)
    cluster = real_cluster
    binary = _prometheus_binary()
    work = tmp_path_factory.mktemp("prometheus")
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=manifest(*STAND_IN_CRDS))
    for item in STAND_IN_CRDS:
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{item['metadata']['name']}", "--timeout=60s"
        )
    prometheus: Prometheus | None = None
    try:
        driver.upgrade(*RULE_SETS)
        [rule_object] = cluster.get("prometheusrules", "-n", CHART_NAMESPACE)["items"]
        monitors = cluster.get("podmonitors", "-n", CHART_NAMESPACE)["items"]
        rules_file = work / "rules.yaml"
        rules_file.write_text(yaml.safe_dump({"groups": rule_object["spec"]["groups"]}))
        dashboards = cluster.get("configmaps", "-n", CHART_NAMESPACE, "-l", "grafana_dashboard=1")["items"]
        [board] = [json.loads(text) for item in dashboards for text in item["data"].values()]
        config = work / "prometheus.yml"
        kubeconfig = Kubeconfig.read(cluster.kubeconfig)
        discovery = PodDiscovery(cluster, monitors, work)
        discovery.refresh()
        config.write_text(
            yaml.safe_dump(_scrape_config(discovery, kubeconfig, Layout(cluster.state_dir), rules_file))
        )
        port = _free_port()
        log = work / "prometheus.log"
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log)
        wait_for(prometheus.ready, 60, "Prometheus ready", interval=0.2)
        # The workloads come after every target's first scrape, so the rates and latencies see them.
        wait_for(lambda: prometheus.all_up(), 30, "every target scraped", interval=0.2)
        _workloads(cluster)
        rules = [rule for group in rule_object["spec"]["groups"] for rule in group["rules"]]
        yield Monitoring(cluster, prometheus, panel_queries(board), rules, driver, discovery)
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s"
        )
        driver.upgrade()
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=manifest(*STAND_IN_CRDS))
        print(f"\ntest_gpu_monitoring: {time.monotonic() - started:.0f} s including the chart upgrades")


def _empty(prometheus: Prometheus, queries: list[Query]) -> list[str]:
    """The queries with no series, or only NaN (a latency quantile of nothing observed)."""
    return [
        f"{q.where}: {q.expr}"
        for q in queries
        if all(series["value"][1] == "NaN" for series in prometheus.query(q.expr))
    ]


def _wait_for_data(prometheus: Prometheus, queries: list[Query], what: str) -> None:
    """Until every query returns a number; on timeout, name the ones that do not."""
    try:
        wait_for(lambda: not _empty(prometheus, queries), DATA_TIMEOUT, what, interval=1.0)
    except AssertionError:
        empty = "\n".join(_empty(prometheus, queries))
        raise AssertionError(f"{what}: queries without data:\n{empty}") from None


def _report(prometheus: Prometheus, title: str, queries: list[Query]) -> None:
    """Append each query's result (series and values, shortened) to ``REPORT``."""
    lines = [f"== {title}"]
    for query in queries:
        lines.append(f"{query.where}: {query.expr}")
        for series in prometheus.query(query.expr)[:6]:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(series["metric"].items()) if k not in ("job", "instance")
            )
            lines.append(f"    {{{labels}}} {series['value'][1]}")
    REPORT.parent.mkdir(exist_ok=True)
    with REPORT.open("a") as out:
        out.write("\n".join(lines) + "\n")


def _firing(prometheus: Prometheus) -> set[str]:
    return {a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"}


def test_every_target_is_scraped(monitoring: Monitoring) -> None:
    assert monitoring.prometheus.all_up()
    targets = monitoring.prometheus.api("targets")["activeTargets"]
    prefix = f"{CHART_NAMESPACE}/{RELEASE}"
    assert {t["labels"]["job"] for t in targets} == {
        *(f"{prefix}-{component}" for component in COMPONENTS), "apiserver", "kube-scheduler",
    }  # fmt: skip
    # One target per pod, as the PodMonitors would give.
    pods = {t["labels"]["pod"] for t in targets if t["labels"]["job"].startswith(prefix)}
    driver = monitoring.driver
    assert pods == {p["metadata"]["name"] for c in COMPONENTS for p in driver.pods(c)}


def test_every_panel_query_returns_data(monitoring: Monitoring) -> None:
    queries = monitoring.panels
    assert len(queries) >= 20
    _wait_for_data(monitoring.prometheus, queries, "every panel query with data")
    REPORT.unlink(missing_ok=True)
    _report(monitoring.prometheus, "dashboard panels", queries)
    # What the lab holds: the claims' shares on their cards, the pending pod under its reason.
    tenants = monitoring.prometheus.query(
        f'sum by (claim) (hami_dra_claim_allocated_memory_bytes{{claim_namespace="{NAMESPACE}"}})'
    )
    assert {t["metric"]["claim"]: float(t["value"][1]) for t in tenants} == {
        "small-a": 2 * 1024**3, "small-b": 3 * 1024**3,
    }  # fmt: skip
    pending = monitoring.prometheus.query("sum by (reason) (hami_dra_pending_pods)")
    assert sum(float(p["value"][1]) for p in pending) >= 1


def test_every_rule_query_returns_data(monitoring: Monitoring) -> None:
    """Each alert's query without its threshold: where the alert stands, for every alert."""
    queries = [
        Query(f"rule {r['alert']}", split_threshold(r["expr"])[0])
        for r in monitoring.rules
        if r["alert"] not in NO_DATA_WHEN_HEALTHY
    ]
    assert len(queries) == len(monitoring.rules) - len(NO_DATA_WHEN_HEALTHY)
    _wait_for_data(monitoring.prometheus, queries, "every rule query with data")
    _report(monitoring.prometheus, "alert queries (without their thresholds)", queries)
    alerts = _firing(monitoring.prometheus)
    assert "HamiDraGpuOvercommitted" not in alerts and "HamiDraKubeletPluginNotReady" not in alerts
    # Every component answers: the absence alerts see each replica.
    up = {q.where: q for q in queries}
    for alert, replicas in (("HamiDraControllerDown", "controller"), ("HamiDraWebhookDown", "webhook")):
        [series] = monitoring.prometheus.query(up[f"rule {alert}"].expr)
        assert float(series["value"][1]) == len(monitoring.driver.pods(replicas)) >= 1
    assert not alerts & {"HamiDraControllerDown", "HamiDraWebhookDown", "HamiDraKubeletPluginDown"}


def test_an_injected_overcommit_fires_its_alert(monitoring: Monitoring) -> None:
    cluster, prometheus = monitoring.cluster, monitoring.prometheus
    [slice_] = [s for s in cluster.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    pool, device = slice_["spec"]["pool"]["name"], slice_["spec"]["devices"][-1]["name"]
    for name in ("over-a", "over-b"):
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(claim(name, "10Gi")))
        # Another allocator's claims: without the finalizer our admission gives every claim of our
        # classes (controller.claimFinalizer), which would make them ours to repair (deallocate).
        cluster.kubectl(
            "patch",
            "resourceclaim",
            name,
            "-n",
            NAMESPACE,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )
        written = cluster.get("resourceclaim", name, "-n", NAMESPACE)
        assert not written["metadata"].get("finalizers")
        written["status"] = {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": pool, "device": device, "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "10Gi", "cores": "0", "slots": "1"},
        }]}}}  # fmt: skip
        cluster.kubectl(
            "replace", "--subresource=status", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(written)
        )

    wait_for(
        lambda: "HamiDraGpuOvercommitted" in _firing(prometheus),
        60,
        "the overcommit alert firing",
        interval=0.5,
    )
    # The cards' series show it too, once the leader has refreshed them (at most once a second).
    over = f'hami_dra_gpu_allocated_memory_bytes{{device="{device}"}} > hami_dra_gpu_memory_capacity_bytes'
    wait_for(lambda: prometheus.query(over), 30, "the card over its memory capacity", interval=0.5)
    # Nothing of ours to repair (the claims are not ours and have no pods): reported, not changed.
    assert prometheus.query('hami_dra_overcommitted_devices_total{action="reported"} > 0')
    assert "overcommitted" in cluster.driver_log("controller")
    alerts = [
        a for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == "HamiDraGpuOvercommitted"
    ]
    with REPORT.open("a") as out:
        out.write(f"== after the injected overcommit\n{json.dumps(alerts, indent=1)}\n")


def _scale(monitoring: Monitoring, component: str, replicas: int) -> None:
    cluster = monitoring.cluster
    deployment = f"deployment/{RELEASE}-{component}"
    cluster.kubectl("scale", "-n", CHART_NAMESPACE, deployment, f"--replicas={replicas}")
    if replicas:
        cluster.kubectl("rollout", "status", "-n", CHART_NAMESPACE, deployment, "--timeout=180s")
    else:
        # Deleted, not only terminating: until then discovery (and the operator's) still lists them.
        selector = f"{COMPONENT_LABEL}={component}"
        wait_for(
            lambda: not cluster.get("pods", "-n", CHART_NAMESPACE, "-l", selector)["items"], 120, "pods gone"
        )
    monitoring.discovery.refresh()


def _replicas(monitoring: Monitoring, component: str) -> int:
    deployment = monitoring.cluster.get("deployment", f"{RELEASE}-{component}", "-n", CHART_NAMESPACE)
    return int(deployment["spec"]["replicas"])


def _wait_firing(prometheus: Prometheus, alert: str, timeout: float = 90) -> None:
    wait_for(lambda: alert in _firing(prometheus), timeout, f"{alert} firing", interval=0.5)


def test_the_controller_scaled_to_zero_fires_its_absence_alert(monitoring: Monitoring) -> None:
    """No controller pod: its own series are gone with it, only `up`'s absence tells."""
    prometheus = monitoring.prometheus
    job = f"{CHART_NAMESPACE}/{RELEASE}-controller"
    replicas = _replicas(monitoring, "controller")
    _scale(monitoring, "controller", 0)
    try:
        # The pods' targets are gone, not failing: the `or vector(0)` path, which absent() would be.
        wait_for(lambda: not prometheus.query(f'up{{job="{job}"}}'), 60, "the controller's targets gone")
        _wait_firing(prometheus, "HamiDraControllerDown")
        assert not prometheus.query("hami_dra_leader")  # what HamiDraNoLeader needs is gone too
        assert "HamiDraNoLeader" not in _firing(prometheus)
    finally:
        _scale(monitoring, "controller", replicas)
    wait_for(lambda: "HamiDraControllerDown" not in _firing(prometheus), 60, "HamiDraControllerDown resolved")


def test_the_webhook_scaled_to_zero_fires_its_alerts(monitoring: Monitoring) -> None:
    """With no webhook the API server refuses pods with claims (failurePolicy Fail) and lets
    DeviceClasses through (Ignore): its own counters, scraped from the real API server, fire
    HamiDraWebhookCallsFailing and HamiDraWebhookFailedOpen; HamiDraWebhookDown fires from `up`."""
    cluster, prometheus = monitoring.cluster, monitoring.prometheus
    replicas = _replicas(monitoring, "webhook")
    calling_error = 'error_type="calling_webhook_error"'
    rejected = f'apiserver_admission_webhook_rejection_count{{name="pods.{DRIVER}", {calling_error}}}'
    failed_open = f'apiserver_admission_webhook_fail_open_count{{name="deviceclasses.{DRIVER}"}}'
    classes: list[str] = []
    _scale(monitoring, "webhook", 0)
    try:
        _wait_firing(prometheus, "HamiDraWebhookDown")
        # The API server creates each counter at its first failure; increase() needs a second.
        for attempt in (1, 2):
            name = f"down-{attempt}"
            objects = manifest(claim(name, "1Gi"), pod(name, name))
            refused = cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", check=False, stdin=objects)
            assert "failed calling webhook" in refused, refused
            cluster.kubectl("apply", "-f", "-", stdin=manifest(_device_class(f"hami-{name}")))
            classes.append(f"hami-{name}")
            for series in (rejected, failed_open):
                _wait_for_series(prometheus, f"{series} >= {attempt}")
        _wait_firing(prometheus, "HamiDraWebhookCallsFailing")
        _wait_firing(prometheus, "HamiDraWebhookFailedOpen")
        firing = [a["labels"] for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
        assert {"alertname": "HamiDraWebhookCallsFailing", "name": f"pods.{DRIVER}", "type": "admit",
                "severity": "critical"} in firing  # fmt: skip
    finally:
        _scale(monitoring, "webhook", replicas)
        for name in classes:
            cluster.kubectl("delete", "deviceclass", name, "--ignore-not-found")
    wait_for(lambda: "HamiDraWebhookDown" not in _firing(prometheus), 60, "HamiDraWebhookDown resolved")


def _wait_for_series(prometheus: Prometheus, query: str) -> None:
    wait_for(lambda: prometheus.query(query), 60, f"{query}: the API server's count", interval=0.5)


def _device_class(name: str) -> dict[str, Any]:
    """A DeviceClass with a GpuConfig for our driver: the one kind the chart validates with Ignore."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig"}}}],
        },
    }  # fmt: skip
