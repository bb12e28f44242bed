"""What only the chart-installed driver shows: pods, their identities, the lease, rollouts, uninstall.

The chart is installed once for the session (conftest.py's ``driver`` fixture, ``chart`` way) with
``charts/hami-dra/values-local.yaml``; test_e2e.py runs the seed's lab against the same install
first. These tests run in file order and the last one uninstalls; a chart test after it finds the
release installed again (conftest.py's ``chart_installed``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hami_dra_dev.demo import manifests
from hami_dra_dev.demo.manifests import DemoPod
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import (
    CHART_NAMESPACE,
    LEASE,
    ChartDriver,
    DriverUnderTest,
    checkpoint,
    claims_with_our_finalizer,
    reset_workloads,
    slice_published,
)
from tests.cluster.test_e2e import POD_TIMEOUT, apply, cdi_spec, claim_of, device_of, wait_running
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]


@pytest.fixture
def chart(real_cluster: RealCluster, driver: DriverUnderTest) -> ChartDriver:
    assert isinstance(driver, ChartDriver)
    apply(real_cluster, manifests.claim_template("binpack"))
    return driver


def place(cluster: RealCluster, name: str) -> dict[str, Any]:
    """A binpack pod of the seed's 1000Mi template, running; returns its claim."""
    apply(cluster, manifests.pod(DemoPod(name, "binpack", "", "")))
    wait_running(cluster, name)
    return claim_of(cluster, name)


def names(chart: ChartDriver, component: str) -> set[str]:
    return {p["metadata"]["name"] for p in chart.pods(component)}


def all_ready(chart: ChartDriver, component: str, count: int) -> bool:
    pods = chart.pods(component)
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]
    return len(pods) == count and len(ready) == count


def test_every_component_runs_as_the_chart_installs_it(real_cluster: RealCluster, chart: ChartDriver) -> None:
    # values-local.yaml: two controllers (a standby); values.yaml: two webhooks (failurePolicy Fail).
    # Waited for: a module before this one may have rolled a Deployment (an upgrade, a scale back)
    # whose new pods are still starting; what the chart installs is what the rollout settles on.
    wait_for(
        lambda: (
            all_ready(chart, "controller", 2)
            and all_ready(chart, "webhook", 2)
            and all_ready(chart, "kubelet-plugin", 1)
        ),
        POD_TIMEOUT,
        "2 controllers, 2 webhooks and 1 kubelet plugin, every pod ready",
        interval=1.0,
    )
    leader = chart.leader()
    assert leader in names(chart, "controller")
    standby = (names(chart, "controller") - {leader}).pop()
    standby_log = real_cluster.kubectl("logs", "-n", CHART_NAMESPACE, standby)
    assert "acquired leadership" not in standby_log and " -> " not in standby_log, (
        "the standby never allocates"
    )
    # The validating webhook answers through its Service with the chart's self-signed certificate
    # (the DeviceClass webhook fails open, so an unreachable webhook would let this class in).
    refused = real_cluster.kubectl(
        "apply", "-f", "-", stdin=json.dumps(manifests.misspelled_class()), check=False
    )
    assert "denied the request" in refused and "unknown policy name(s) 'binpak'" in refused, refused
    # Least-privilege RBAC: nothing the driver did so far was forbidden.
    for component in ("controller", "webhook", "kubelet-plugin"):
        text = chart.log(component)
        # "403: " is how an API error is logged (KubeError); a bare 403 also occurs in timestamps.
        assert not re.search(r"\b403: |[Ff]orbidden", text), f"{component}: {text[-2000:]}"


def test_killing_the_leader_hands_the_lease_over_and_allocation_continues(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    first = place(real_cluster, "before-failover")
    old = chart.leader()
    real_cluster.kubectl("delete", "pod", "-n", CHART_NAMESPACE, str(old), "--grace-period=0", "--force")
    new = wait_for(lambda: (leader := chart.leader()) not in (None, old) and leader, 90, "a new lease holder")
    lease = real_cluster.get("lease", LEASE, "-n", CHART_NAMESPACE)
    assert int(lease["spec"].get("leaseTransitions") or 0) >= 1
    # The new leader rebuilt its ledger from the API: binpack stacks onto the card in use.
    second = place(real_cluster, "after-failover")
    assert device_of(second) == device_of(first)
    assert new in {p["metadata"]["name"] for p in chart.pods("controller")}
    wait_for(lambda: all_ready(chart, "controller", 2), POD_TIMEOUT, "the Deployment back at 2 replicas")
    reset_workloads(real_cluster)


def test_a_recreated_plugin_pod_reregisters_and_keeps_prepared_claims(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    claim = place(real_cluster, "prepared-before")
    uid = claim["metadata"]["uid"]
    assert uid in checkpoint(real_cluster) and cdi_spec(uid).is_file()
    old = names(chart, "kubelet-plugin")
    real_cluster.kubectl("delete", "pod", "-n", CHART_NAMESPACE, *old, "--wait=true")
    wait_for(
        lambda: names(chart, "kubelet-plugin").isdisjoint(old) and all_ready(chart, "kubelet-plugin", 1),
        POD_TIMEOUT,
        "the DaemonSet's new plugin pod Ready",
    )
    wait_for(lambda: "kubelet registered plugin" in chart.log("kubelet-plugin"), 60, "re-registration")
    assert slice_published(real_cluster)
    assert uid in checkpoint(real_cluster), "the checkpoint on the hostPath survived the pod"
    assert cdi_spec(uid).is_file()
    # The new pod prepares new claims and unprepares the ones its predecessor prepared.
    place(real_cluster, "prepared-after")
    real_cluster.kubectl("delete", "pod", "prepared-before", "--wait=true", "--timeout=60s")
    wait_for(lambda: not cdi_spec(uid).exists(), 60, "the old claim's CDI spec removed by the new pod")
    wait_for(lambda: uid not in checkpoint(real_cluster), 30, "the old claim's checkpoint entry removed")
    assert f"NodeUnprepareResources claim {uid}: unprepared" in chart.log("kubelet-plugin")
    reset_workloads(real_cluster)


def test_helm_upgrade_rolls_every_pod_without_losing_an_allocation(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    claim = place(real_cluster, "survives-upgrade")
    before = {c: names(chart, c) for c in ("controller", "webhook", "kubelet-plugin")}
    chart.upgrade("logVerbosity=2")
    for component, old in before.items():
        wait_for(lambda c=component, o=old: names(chart, c).isdisjoint(o), POD_TIMEOUT, f"{component} rolled")
    wait_for(chart.leader, 60, "a leader after the upgrade")
    pod = real_cluster.get("pod", "survives-upgrade")
    assert pod["status"]["phase"] == "Running"
    assert all(c["restartCount"] == 0 for c in pod["status"]["containerStatuses"])
    kept = claim_of(real_cluster, "survives-upgrade")
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"] and device_of(kept) == device_of(claim)
    assert claim["metadata"]["uid"] in checkpoint(real_cluster)
    assert device_of(place(real_cluster, "after-upgrade")) == device_of(claim), "the new leader counts it"
    reset_workloads(real_cluster)


def test_helm_uninstall_after_the_workloads_leaves_nothing_of_ours(
    real_cluster: RealCluster, chart: ChartDriver
) -> None:
    """charts/hami-dra/README.md: delete the pods with our claims first, then uninstall."""
    place(real_cluster, "last")
    reset_workloads(real_cluster)
    chart.uninstall()
    assert not claims_with_our_finalizer(real_cluster)
    leftovers = real_cluster.kubectl(
        "get", "deployments,daemonsets,services,secrets,serviceaccounts", "-n", CHART_NAMESPACE, "-o", "name"
    )
    assert "hami-dra" not in leftovers, leftovers
    charted = real_cluster.kubectl(
        "get", "deviceclasses", "-l", "app.kubernetes.io/instance=hami-dra", "-o", "name"
    )
    assert not charted.strip(), charted
    webhooks = real_cluster.kubectl(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"
    )
    assert "hami-dra" not in webhooks
    # Helm keeps a chart's crds/ (README "Upgrade and uninstall"): quotas are not lost with it.
    assert "gpuquotas.gpu.hami.io" in real_cluster.kubectl(
        "get", "crd", "gpuquotas.gpu.hami.io", "-o", "name"
    )
    # The kubelet deletes a driver's slices 30 s after its last plugin instance deregistered
    # (our plugin removes its registration socket on SIGTERM); nothing stale stays advertised.
    wait_for(
        lambda: not slice_published(real_cluster), 90, "the kubelet wiping the uninstalled plugin's slice"
    )
