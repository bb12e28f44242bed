"""monitoring.*: PodMonitors, the PrometheusRule and the Grafana dashboard ConfigMap.

All off by default. When on, the monitors select exactly the components' pods by a port those pods
name; the rules pass ``promtool check rules`` and every expression is ``<query> <op> <number>``;
every query (rules and panels) names only metrics the components export (tests/metrics_catalog.py),
so a rename cannot leave a dead panel or an alert that can never fire.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helpers import REPO, Render, all_of, find
from tests.chart.monitoring import (
    EXTERNAL_SERIES,
    MONITORING_ALL_RULES,
    MONITORING_KINDS,
    MONITORING_ON,
    dashboard,
    dashboard_config_map,
    external_names,
    groups,
    metric_names,
    panel_queries,
    promtool,
    rules,
    split_threshold,
)
from tests.kube_validate import assert_valid
from tests.metrics_catalog import catalog

EXPORTED = {metric.name for metric in catalog()}


def _pod_template(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    kind = "DaemonSet" if component == "kubelet-plugin" else "Deployment"
    template: dict[str, Any] = find(objects, kind, f"-{component}")["spec"]["template"]
    return template


def test_everything_is_off_by_default(render: Render) -> None:
    objects = render()
    assert not [o for o in objects if o["kind"] in MONITORING_KINDS]
    assert not [
        o for o in all_of(objects, "ConfigMap") if "grafana_dashboard" in o["metadata"].get("labels", {})
    ]


def test_every_object_renders_valid(render: Render) -> None:
    objects = render(values=MONITORING_ON)
    for obj in objects:
        if obj["kind"] in MONITORING_KINDS:  # CRD kinds kubernetes-validate has no schema for
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
        else:
            assert_valid(obj)


@pytest.mark.parametrize("component", ["controller", "kubelet-plugin", "webhook"])
def test_pod_monitors_select_the_components_by_a_port_they_name(render: Render, component: str) -> None:
    on = MONITORING_ON["monitoring"]
    labelled = {"enabled": True, "labels": {"release": "kps"}}
    objects = render(values={"monitoring": {**on, "podMonitor": labelled}})
    monitor = find(objects, "PodMonitor", f"-{component}")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    template = _pod_template(objects, component)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/component"] == component
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [monitor["metadata"]["namespace"]]}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    ports = {port["name"] for c in template["spec"]["containers"] for port in c.get("ports", ())}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    if component == "webhook":
        assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    else:
        assert "scheme" not in endpoint


def test_pod_monitors_follow_the_components_that_run(render: Render) -> None:
    on = MONITORING_ON["monitoring"]
    objects = render(values={"monitoring": {**on, "podMonitor": {"enabled": True, "webhook": False}}})
    assert {o["metadata"]["name"] for o in all_of(objects, "PodMonitor")} == {
        "t-hami-dra-controller", "t-hami-dra-kubelet-plugin",
    }  # fmt: skip
    objects = render(
        values={"monitoring": on, "controller": {"enabled": False}, "webhook": {"enabled": False}}
    )
    assert [o["metadata"]["name"] for o in all_of(objects, "PodMonitor")] == ["t-hami-dra-kubelet-plugin"]


def test_the_controller_probes_health_and_readiness(render: Render) -> None:
    controller = _pod_template(render(), "controller")["spec"]["containers"][0]
    assert controller["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert controller["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_rules_pass_promtool_and_name_exported_metrics(render: Render, tmp_path: Path) -> None:
    objects = render(values=MONITORING_ALL_RULES)
    alerts = rules(objects)
    assert {rule["alert"] for rule in alerts} >= {
        "HamiDraGpuOvercommitted", "HamiDraPodPendingTooLong", "HamiDraKubeletPluginNotReady",
        "HamiDraSharesNotEnforced", "HamiDraWebhookErrors", "HamiDraControllerDown", "HamiDraWebhookDown",
        "HamiDraKubeletPluginDown", "HamiDraKubeletPluginUnavailable", "HamiDraWebhookCallsFailing",
        "HamiDraWebhookFailedOpen", "HamiDraGatedPodsGrowing",
    }  # fmt: skip
    assert [group["name"] for group in groups(objects)] == list(EXTERNAL_SERIES)
    for group in groups(objects):
        for rule in group["rules"]:
            query, _, _ = split_threshold(rule["expr"])
            ours, theirs = metric_names(query), external_names(query)
            assert ours | theirs, rule["expr"]
            assert ours <= EXPORTED, rule["expr"]
            # Another exporter's series only in the group named after what it needs.
            assert theirs <= EXTERNAL_SERIES[group["name"]], (group["name"], rule["expr"])
            assert rule["labels"]["severity"] in {"critical", "warning"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (hack/install.d/prometheus.sh)")
    path = tmp_path / "rules.yaml"
    [rule_object] = all_of(objects, "PrometheusRule")
    path.write_text(yaml.safe_dump({"groups": rule_object["spec"]["groups"]}))
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_rule_values_reach_the_rules(render: Render) -> None:
    values = {"monitoring": {"prometheusRule": {"enabled": True, "pendingMinutes": 30, "window": "1h",
                                                "additionalLabels": {"team": "gpu"}}}}  # fmt: skip
    alerts = {rule["alert"]: rule for rule in rules(render(values=values))}
    assert split_threshold(alerts["HamiDraPodPendingTooLong"]["expr"])[2] == 30 * 60
    assert "[1h]" in alerts["HamiDraGpuOvercommitted"]["expr"]
    assert all(rule["labels"]["team"] == "gpu" for rule in alerts.values())


def test_the_absence_rules_follow_the_components_and_the_sources_chosen(render: Render) -> None:
    """A rule for a component that is not installed would fire for ever; a source turned off
    (no kube-state-metrics, no API server scrape, no scheduler scrape) drops its group."""
    on = {"enabled": True}
    objects = render(values={"monitoring": {"prometheusRule": on}})
    names = {rule["alert"] for rule in rules(objects)}
    assert {"HamiDraControllerDown", "HamiDraWebhookDown", "HamiDraKubeletPluginDown"} <= names
    assert "HamiDraGatedPodsGrowing" not in names  # the scheduler's metrics: opt in
    assert [g["name"] for g in groups(objects)] == [
        "hami-dra", "hami-dra-kube-state-metrics", "hami-dra-apiserver",
    ]  # fmt: skip
    no_ksm = {"prometheusRule": {**on, "kubeStateMetrics": False}}
    objects = render(
        values={"controller": {"enabled": False}, "webhook": {"enabled": False}, "monitoring": no_ksm}
    )
    names = {rule["alert"] for rule in rules(objects)}
    assert not names & {"HamiDraControllerDown", "HamiDraWebhookDown", "HamiDraWebhookCallsFailing"}
    assert "HamiDraKubeletPluginDown" in names and "HamiDraKubeletPluginUnavailable" not in names
    assert [g["name"] for g in groups(objects)] == ["hami-dra"]
    # Not scraping the webhook: no `up` for it, so no rule that would read its absence as down.
    objects = render(values={"monitoring": {"prometheusRule": on, "podMonitor": {"webhook": False}}})
    assert "HamiDraWebhookDown" not in {rule["alert"] for rule in rules(objects)}


def test_the_absence_rules_read_the_jobs_of_the_pod_monitors(render: Render) -> None:
    on = MONITORING_ON["monitoring"]
    objects = render(values={"monitoring": on})
    alerts = {rule["alert"]: rule for rule in rules(objects)}
    for alert, component in (("HamiDraControllerDown", "controller"), ("HamiDraWebhookDown", "webhook"),
                             ("HamiDraKubeletPluginDown", "kubelet-plugin")):  # fmt: skip
        monitor = find(objects, "PodMonitor", f"-{component}")["metadata"]
        # The Prometheus Operator names a PodMonitor's job <namespace>/<name> (no jobLabel set).
        assert f'up{{job="{monitor["namespace"]}/{monitor["name"]}"}}' in alerts[alert]["expr"]
    assert "jobLabel" not in find(objects, "PodMonitor", "-controller")["spec"]
    own = {"controller": "gpu/ctl", "kubeletPlugin": "gpu/plugin", "webhook": "gpu/hook"}
    values = {"monitoring": {**on, "prometheusRule": {"enabled": True, "jobs": own, "downFor": "2m"}}}
    alerts = {rule["alert"]: rule for rule in rules(render(values=values))}
    assert 'up{job="gpu/ctl"}' in alerts["HamiDraControllerDown"]["expr"]
    assert 'up{job="gpu/plugin"}' in alerts["HamiDraKubeletPluginDown"]["expr"]
    assert 'up{job="gpu/hook"}' in alerts["HamiDraWebhookDown"]["expr"]
    assert alerts["HamiDraWebhookDown"]["for"] == "2m"
    # The API server's webhook names are ours: every webhook the chart registers matches the regex.
    hooks = [hook["name"] for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
             for config in all_of(render(), kind) for hook in config["webhooks"]]  # fmt: skip
    pattern = re.search(r'name=~"([^"]+)"', alerts["HamiDraWebhookCallsFailing"]["expr"])
    assert pattern and hooks and all(re.fullmatch(pattern[1], hook) for hook in hooks), hooks
    assert not re.fullmatch(pattern[1], "pods.gpu-hami.io") and not re.fullmatch(pattern[1], "gpu.hami.io")


def test_dashboard_queries_parse_and_name_exported_metrics(render: Render, tmp_path: Path) -> None:
    objects = render(values=MONITORING_ON)
    config_map = dashboard_config_map(objects)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = dashboard(objects)
    assert board["uid"] == "hami-dra"
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    queries = panel_queries(board)
    used: set[str] = set()
    for query in queries:
        names = metric_names(query.expr)
        assert names and names <= EXPORTED, (query.where, names - EXPORTED)
        used |= names
    # The panels the issue asks for: capacity vs allocated, per card, tenants, pending, latency.
    assert {"hami_dra_gpu_memory_capacity_bytes", "hami_dra_gpu_allocated_cores", "hami_dra_pending_pods",
            "hami_dra_claim_allocated_memory_bytes", "hami_dra_decision_seconds"} <= used  # fmt: skip
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (hack/install.d/prometheus.sh)")
    path = tmp_path / "panels.yaml"
    records = [{"record": f"hami_dra:panel_{i}", "expr": q.expr} for i, q in enumerate(queries)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": records}]}))
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_namespace_and_annotations(render: Render) -> None:
    values = {"monitoring": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                                                  "annotations": {"grafana_folder": "GPU"}}}}  # fmt: skip
    config_map = dashboard_config_map(render(values=values))
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def test_docs_list_every_alert_as_rendered_and_every_panel(render: Render) -> None:
    """docs/prometheus.md gives each alert with its defaults' expression, and each panel."""
    text = (REPO / "docs" / "prometheus.md").read_text()
    documented: dict[str, tuple[str, str, str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\| `(HamiDra\w+)` \| (\w+) \| ?(\w*) ?\| `(.+?)` \|", line)
        if match:
            documented[match[1]] = (match[2], match[3], match[4].replace("\\|", "|"))
    rendered = {
        rule["alert"]: (rule["labels"]["severity"], rule.get("for", ""), rule["expr"])
        # as installed in the docs' examples: release hami-dra in hami-system
        for rule in rules(render(values={**MONITORING_ALL_RULES, "fullnameOverride": "hami-dra"}))
    }
    assert documented == rendered
    titles = {p["title"] for p in dashboard(render(values=MONITORING_ON))["panels"] if p["type"] != "row"}
    table = text.split("| row | panel | queries |", 1)[1].split("\n\n", 1)[0]
    panels = {line.split("|")[2].strip() for line in table.splitlines()[2:]}
    assert panels == titles
