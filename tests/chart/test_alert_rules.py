"""The absence and control-plane alerts evaluated by Prometheus's own rule engine (promtool test rules).

Each case feeds the series a scrape would store (a component's ``up`` going to 0 or its target
vanishing, kube-state-metrics' DaemonSet series, the API server's webhook counters, the scheduler's
gated queue) and names the alerts expected to fire at a given time, and those expected not to.
The rendered rules are evaluated as written, minus their annotations (promtool compares those
verbatim; their wording is checked by test_monitoring.py and docs/prometheus.md). The real
cluster's Prometheus runs the same rules against the real components in
tests/cluster/test_gpu_monitoring.py.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helpers import NAMESPACE, RELEASE, Render
from tests.chart.monitoring import MONITORING_ALL_RULES, groups, promtool

CONTROLLER = f'up{{job="{NAMESPACE}/{RELEASE}-hami-dra-controller", pod="ctl-%s"}}'
WEBHOOK = f'up{{job="{NAMESPACE}/{RELEASE}-hami-dra-webhook", pod="hook-%s"}}'
PLUGIN = f'up{{job="{NAMESPACE}/{RELEASE}-hami-dra-kubelet-plugin", pod="%s"}}'
PLUGIN_DAEMONSET = f"{RELEASE}-hami-dra-kubelet-plugin"
DAEMONSET = 'kube_daemonset_status_number_unavailable{namespace="%s", daemonset="' + PLUGIN_DAEMONSET + '"}'
REJECTED = (
    'apiserver_admission_webhook_rejection_count{name="%s", type="admit", operation="CREATE", '
    'error_type="%s", rejection_code="%s"}'
)
FAIL_OPEN = 'apiserver_admission_webhook_fail_open_count{name="%s", type="validating"}'
GATED = 'scheduler_pending_pods{queue="gated"}'


@dataclass
class Case:
    """Input series (promtool's expanding notation, one sample a minute) and the expectations."""

    series: dict[str, str]
    #: minute -> {alert name: [the label sets expected firing]}; an empty list: not firing.
    expect: dict[int, dict[str, list[dict[str, str]]]]
    values: dict[str, Any] = field(default_factory=dict)


CASES = {
    # Both controller pods deleted (scaled to 0): their targets vanish, `up` goes stale, not 0.
    "controller-scaled-to-zero": Case(
        {CONTROLLER % "a": "1x9 stale", CONTROLLER % "b": "1x9 stale"},
        {
            9: {"HamiDraControllerDown": []},
            13: {"HamiDraControllerDown": []},
            16: {"HamiDraControllerDown": [{"severity": "critical"}]},
        },
    ),
    # A controller that crash-loops: its target stays (the pod is Running) and answers nothing.
    "controller-crash-looping": Case(
        {CONTROLLER % "a": "1x4 0x20"},
        {8: {"HamiDraControllerDown": []}, 11: {"HamiDraControllerDown": [{"severity": "critical"}]}},
    ),
    # One replica of two down: the other leads or takes over, nothing to page about.
    "controller-one-of-two": Case(
        {CONTROLLER % "a": "1x4 0x20", CONTROLLER % "b": "1x24"},
        {20: {"HamiDraControllerDown": []}},
    ),
    # Never scraped at all (no pod ever ran, or the PodMonitor selects nothing): down too.
    "webhook-never-scraped": Case(
        {CONTROLLER % "a": "1x20"},
        {6: {"HamiDraWebhookDown": [{"severity": "critical"}], "HamiDraControllerDown": []}},
    ),
    "webhook-down-for-is-the-value": Case(
        {WEBHOOK % "a": "1x4 stale"},
        {6: {"HamiDraWebhookDown": []}, 7: {"HamiDraWebhookDown": [{"severity": "critical"}]}},
        {"downFor": "2m"},
    ),
    # One node's plugin crash-loops: that pod, not the other node's.
    "plugin-crash-looping": Case(
        {PLUGIN % "plugin-n1": "1x4 0x20", PLUGIN % "plugin-n2": "1x24"},
        {
            8: {"HamiDraKubeletPluginDown": []},
            11: {"HamiDraKubeletPluginDown": [{"severity": "warning", "pod": "plugin-n1"}]},
        },
    ),
    # kube-state-metrics: a node where the DaemonSet's pod is missing or not available.
    "plugin-unavailable": Case(
        {DAEMONSET % NAMESPACE: "0x4 1x30", DAEMONSET % "elsewhere": "0x35"},
        {
            18: {"HamiDraKubeletPluginUnavailable": []},
            21: {"HamiDraKubeletPluginUnavailable": [{"severity": "warning"}]},
        },
    ),
    "plugin-of-another-release-unavailable": Case(
        {DAEMONSET % NAMESPACE: "0x35", DAEMONSET % "elsewhere": "0x4 1x30"},
        {30: {"HamiDraKubeletPluginUnavailable": []}},
    ),
    # The API server could not call the pods webhook (failurePolicy Fail): a 503 each create.
    "webhook-calls-failing": Case(
        {
            REJECTED % ("pods.gpu.hami.io", "calling_webhook_error", "503"): "1 2 3 4 4x20",
            REJECTED % ("pods.gpu.hami.io", "no_error", "403"): "0+1x25",
            REJECTED % ("pods.other.example.com", "calling_webhook_error", "503"): "0+1x25",
        },
        {
            2: {
                "HamiDraWebhookCallsFailing": [
                    {"severity": "critical", "name": "pods.gpu.hami.io", "type": "admit"}
                ]
            },
            # a window (10m) after the last failure it resolves; our own refusals (403) never count
            15: {"HamiDraWebhookCallsFailing": []},
        },
    ),
    "webhook-failed-open": Case(
        {FAIL_OPEN % "deviceclasses.gpu.hami.io": "0 0 1 1x20", FAIL_OPEN % "x.other.io": "0+1x20"},
        {
            3: {
                "HamiDraWebhookFailedOpen": [
                    {"severity": "warning", "name": "deviceclasses.gpu.hami.io", "type": "validating"}
                ]
            }
        },
    ),
    # Gated pods piling up (nobody releases them): fires once the 30m window has grown for 30m;
    # a queue that goes up and down and holds steady does not.
    "gated-pods-growing": Case(
        {GATED: "0+1x70"},
        {25: {"HamiDraGatedPodsGrowing": []}, 35: {"HamiDraGatedPodsGrowing": [{"severity": "warning"}]}},
    ),
    "gated-pods-steady": Case(
        {GATED: "0 5 5 3 5 4 5x70"},
        {70: {"HamiDraGatedPodsGrowing": []}},
    ),
}


def _rules_file(render: Render, directory: Path, values: dict[str, Any]) -> Path:
    rule_values = {**MONITORING_ALL_RULES["monitoring"]["prometheusRule"], **values}
    monitoring = {**MONITORING_ALL_RULES["monitoring"], "prometheusRule": rule_values}
    objects = render(values={"monitoring": monitoring})
    rule_groups = groups(objects)
    for group in rule_groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups}))
    return path


def _promtool_test(case: Case, rules_file: Path) -> dict[str, Any]:
    return {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": f"{minute}m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels} for labels in firing],
                    }
                    for minute, alerts in case.expect.items()
                    for alert, firing in alerts.items()
                ],
            }
        ],
    }


def _run_promtool(tool: str, test_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool, "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("name", list(CASES))
def test_alert_fires_as_the_series_say(render: Render, tmp_path: Path, name: str) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (hack/install.d/prometheus.sh)")
    case = CASES[name]
    rules_file = _rules_file(render, tmp_path, case.values)
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(_promtool_test(case, rules_file)))
    result = _run_promtool(tool, test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(render: Render, tmp_path: Path) -> None:
    """The harness can fail: the controller-down case expected at the wrong minute is reported."""
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (hack/install.d/prometheus.sh)")
    early = {13: {"HamiDraControllerDown": [{"severity": "critical"}]}}
    case = Case(CASES["controller-scaled-to-zero"].series, early)
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(_promtool_test(case, _rules_file(render, tmp_path, {}))))
    result = _run_promtool(tool, test_file)
    assert result.returncode != 0 and "HamiDraControllerDown" in result.stdout + result.stderr
