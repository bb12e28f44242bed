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
card. The controller reports it and HamiDraGpuOvercommitted fires. Every query's result goes to
build/monitoring-report.txt (what the dashboard would show).

The module's name sorts before test_helm_install.py, whose last test uninstalls the chart; the
chart is restored (upgraded without the monitoring values) at the module's end.
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
from tests.chart.helpers import REPO
from tests.chart.monitoring import MONITORING_SETS, Query, panel_queries, split_threshold
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, DRIVER, ChartDriver, DriverUnderTest
from tests.cluster.test_gpu_tenants import claim, manifest, pod
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

NAMESPACE = "gpu-monitoring"
#: Pods of the lab: two shares that run, one claim no card can hold (stays pending).
RUNNING = {"small-a": "2Gi", "small-b": "3Gi"}
PENDING = {"huge": "100Gi"}
#: Seconds between scrapes and rule evaluations: short, so the test is quick.
INTERVAL = "1s"
DATA_TIMEOUT = 120.0
#: Every query and what it returned, for a reader without Grafana (the issue's closing note).
REPORT = REPO / "build" / "monitoring-report.txt"


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


def _targets(driver: ChartDriver, component: str, port_name: str) -> list[str]:
    """``ip:port`` of each running pod of the component, the port found by name as a PodMonitor does."""
    targets = []
    for item in driver.pods(component):
        [port] = [
            p["containerPort"]
            for c in item["spec"]["containers"]
            for p in c.get("ports", ())
            if p["name"] == port_name
        ]
        targets.append(f"{item['status']['podIP']}:{port}")
    assert targets, f"no running {component} pod"
    return targets


def _scrape_config(driver: ChartDriver, rules_file: Path) -> dict[str, Any]:
    jobs = []
    for component, port_name in (
        ("controller", "metrics"),
        ("kubelet-plugin", "metrics"),
        ("webhook", "https"),
    ):
        job: dict[str, Any] = {
            "job_name": component,
            "static_configs": [{"targets": _targets(driver, component, port_name)}],
        }
        if port_name == "https":  # the serving certificate names the Service, as with the PodMonitor
            job |= {"scheme": "https", "tls_config": {"insecure_skip_verify": True}}
        jobs.append(job)
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules_file)],
        "scrape_configs": jobs,
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
        driver.upgrade(*MONITORING_SETS)
        [rule_object] = cluster.get("prometheusrules", "-n", CHART_NAMESPACE)["items"]
        rules_file = work / "rules.yaml"
        rules_file.write_text(yaml.safe_dump({"groups": rule_object["spec"]["groups"]}))
        dashboards = cluster.get("configmaps", "-n", CHART_NAMESPACE, "-l", "grafana_dashboard=1")["items"]
        [board] = [json.loads(text) for item in dashboards for text in item["data"].values()]
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump(_scrape_config(driver, rules_file)))
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
        yield Monitoring(cluster, prometheus, panel_queries(board), rules)
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
    jobs = {t["labels"]["job"] for t in monitoring.prometheus.api("targets")["activeTargets"]}
    assert jobs == {"controller", "kubelet-plugin", "webhook"}


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
    queries = [Query(f"rule {r['alert']}", split_threshold(r["expr"])[0]) for r in monitoring.rules]
    _wait_for_data(monitoring.prometheus, queries, "every rule query with data")
    _report(monitoring.prometheus, "alert queries (without their thresholds)", queries)
    alerts = _firing(monitoring.prometheus)
    assert "HamiDraGpuOvercommitted" not in alerts and "HamiDraKubeletPluginNotReady" not in alerts


def test_an_injected_overcommit_fires_its_alert(monitoring: Monitoring) -> None:
    cluster, prometheus = monitoring.cluster, monitoring.prometheus
    [slice_] = [s for s in cluster.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    pool, device = slice_["spec"]["pool"]["name"], slice_["spec"]["devices"][-1]["name"]
    for name in ("over-a", "over-b"):
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(claim(name, "10Gi")))
        written = cluster.get("resourceclaim", name, "-n", NAMESPACE)
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
