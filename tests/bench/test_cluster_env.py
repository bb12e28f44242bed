"""The two switches hack/bench_cluster.py sets for the cluster it starts
(dev/hami_dra_dev/cluster/configs.py): kube-apiserver's audit log (requests per client) and
kube-controller-manager's client rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_dra_dev.cluster import configs
from hami_dra_dev.cluster.layout import Layout


def test_no_audit_log_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(configs.AUDIT_POLICY_ENV, raising=False)
    assert configs.audit_args(Layout(tmp_path)) == []


def test_the_audit_log_goes_to_the_logs_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    monkeypatch.setenv(configs.AUDIT_POLICY_ENV, "/etc/policy.yaml")
    args = configs.audit_args(layout)
    assert "--audit-policy-file=/etc/policy.yaml" in args
    assert f"--audit-log-path={layout.logs / 'kube-apiserver-audit.log'}" in args
    assert "--audit-log-format=json" in args


def test_controller_manager_client_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(configs.CONTROLLER_MANAGER_QPS_ENV, raising=False)
    assert configs.controller_manager_client_args() == []
    monkeypatch.setenv(configs.CONTROLLER_MANAGER_QPS_ENV, "5000")
    assert configs.controller_manager_client_args() == ["--kube-api-qps=5000", "--kube-api-burst=5000"]
    monkeypatch.setenv(configs.CONTROLLER_MANAGER_QPS_ENV, "-1")
    with pytest.raises(ValueError, match="positive number"):
        configs.controller_manager_client_args()
