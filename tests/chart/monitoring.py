"""The chart's monitoring objects as data: its alert rules and dashboard queries, rendered.

Shared by the chart tests (tests/chart/test_monitoring.py: names, syntax through promtool) and the
real-cluster test (tests/cluster/test_gpu_monitoring.py: every query returns data from a real
Prometheus scraping the driver).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from typing import Any

from tests.chart.helpers import REPO

#: Values that turn every monitoring object on.
MONITORING_ON = {
    "monitoring": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    }
}
#: ... and every rule group, the opt-in ones (the scheduler's) too.
MONITORING_ALL_RULES = {
    "monitoring": {
        **MONITORING_ON["monitoring"],
        "prometheusRule": {"enabled": True, "scheduler": True},
    }
}
MONITORING_SETS = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
)
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}

#: ``<query> <comparison> <number>``: the shape of every alert expression the chart ships.
_THRESHOLD = re.compile(r"^(?P<query>.+?)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<value>-?[0-9.]+)$", re.S)
_METRIC = re.compile(r"\bhami_dra_[a-z0-9_]+")
#: A selector's metric name: ``name{`` (every series of another exporter is read with labels).
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{")

#: The series of other exporters the rules read, by the rule group that reads them: the group's
#: name says what the alerts need scraped (docs/prometheus.md).
EXTERNAL_SERIES = {
    "hami-dra": {"up"},  # Prometheus's own, one per target
    "hami-dra-kube-state-metrics": {"kube_daemonset_status_number_unavailable"},
    "hami-dra-apiserver": {
        "apiserver_admission_webhook_rejection_count",
        "apiserver_admission_webhook_fail_open_count",
    },
    "hami-dra-scheduler": {"scheduler_pending_pods"},
}
_HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


@dataclass(frozen=True)
class Query:
    where: str  # "rule HamiDraNoLeader", "panel Decision latency/B"
    expr: str


def groups(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rule groups of the rendered PrometheusRule."""
    [rule_object] = [o for o in objects if o["kind"] == "PrometheusRule"]
    result: list[dict[str, Any]] = rule_object["spec"]["groups"]
    return result


def rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alert rules of the rendered PrometheusRule."""
    return [rule for group in groups(objects) for rule in group["rules"]]


def split_threshold(expr: str) -> tuple[str, str, float]:
    """An alert expression as (query, comparison, threshold)."""
    match = _THRESHOLD.match(expr.strip())
    assert match, f"not `<query> <comparison> <number>`: {expr}"
    return match["query"], match["op"], float(match["value"])


def dashboard_config_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [config_map] = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    return config_map


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [text] = dashboard_config_map(objects)["data"].values()
    result: dict[str, Any] = json.loads(text)
    return result


def panel_queries(board: dict[str, Any]) -> list[Query]:
    return [
        Query(f"panel {panel['title']}/{target['refId']}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", ())
    ]


def metric_names(expr: str) -> set[str]:
    """The metrics an expression reads, as the catalog names them (histograms by base name)."""
    return {_HISTOGRAM_SERIES.sub("", name) for name in _METRIC.findall(expr)}


def external_names(expr: str) -> set[str]:
    """The series of other exporters an expression reads (every selector not of ours)."""
    return {name for name in _SELECTOR.findall(expr) if not name.startswith("hami_dra_")}


def promtool() -> str | None:
    local = REPO / ".tools" / "bin" / "promtool"
    return str(local) if local.exists() else shutil.which("promtool")
