"""How the local cluster registers the pod gate (dev/hami_dra_dev/cluster/driver.py, the benchmark's
``--ours-pod-gate``): the policy by name only where the API server serves it, and the webhook's
``pods`` entry then keeping what the policy leaves, as the chart's (tests/chart/test_pod_gate.py)."""

from __future__ import annotations

import pytest

from dra_driver.webhook.pod_gate import WEBHOOK_KEEPS
from hami_dra_dev.cluster.driver import check_pod_gate
from hami_dra_dev.webhooks import MUTATING, USES_RESOURCE_CLAIMS, webhook_configurations


def test_the_policy_is_refused_where_it_is_not_served_and_unknown_modes_everywhere() -> None:
    check_pod_gate("webhook", served=False)
    check_pod_gate("policy", served=True)
    with pytest.raises(ValueError, match=r"needs kube-apiserver serving .* MutatingAdmissionPolicy"):
        check_pod_gate("policy", served=False)
    with pytest.raises(ValueError, match="must be one of webhook, policy, not 'auto'"):
        check_pod_gate("auto", served=True)


def pods_entry(pod_gate: str) -> dict:
    configurations = dict(webhook_configurations("https://x", "Y2E=", "gpu.hami.io", pod_gate=pod_gate))
    (entry,) = [w for w in configurations[MUTATING]["webhooks"] if w["name"] == "pods.gpu.hami.io"]
    return entry


def test_with_the_policy_the_pods_entry_keeps_only_what_it_leaves() -> None:
    assert pods_entry("webhook")["matchConditions"] == [USES_RESOURCE_CLAIMS]
    assert pods_entry("policy")["matchConditions"] == [USES_RESOURCE_CLAIMS, WEBHOOK_KEEPS]
