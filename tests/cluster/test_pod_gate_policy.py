"""The pod gate in kube-apiserver (``webhook.podGate: policy``; dra_driver/webhook/pod_gate.py) on the
real cluster, host processes and chart alike, where the API server serves MutatingAdmissionPolicy
(1.36+; skipped on older ones, where the chart's ``auto`` keeps the webhook).

No pod here reaches our webhook's ``/mutate`` (its review counter stays where it was): a pod with a
template claim of our class is gated by the API server, allocated and bound; a pod of another
driver's class is gated and released by the controller; a pod whose container breaks HAMi-core's
per-container limits is admitted and held gated with the reason (the webhook would have refused it).
The module switches the driver to the policy and back, so the other modules see the default."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.contract import GATE_NAME
from dra_driver.controller import FINALIZER
from dra_driver.controller.reasons import Reason
from hami_dra_dev.cluster.driver import WEBHOOK_URL, serves_mutating_policies
from hami_dra_dev.cluster.layout import PAUSE_IMAGE
from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, COMPONENT_LABEL, ChartDriver, DriverUnderTest, HostDriver
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = manifests.DRIVER
OURS = "podgate-test.gpu.hami.io"
OTHER = "podgate-test.other.example.com"
CONDITION = "gpu.hami.io/Allocated"
METRIC = "hami_dra_webhook_reviews"


def _reviews(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == METRIC
        for sample in family.samples
        if sample.name == f"{METRIC}_total" and sample.labels.get("path") == "/mutate"
    )


def mutate_reviews(cluster: RealCluster, driver: DriverUnderTest) -> float:
    """Pod reviews our webhook has answered on ``/mutate`` (every replica), from its /metrics."""
    if isinstance(driver, HostDriver):
        context = ssl.create_default_context(cafile=str(driver.pki.ca.cert))
        with urllib.request.urlopen(f"{WEBHOOK_URL}/metrics", context=context, timeout=10) as answer:
            return _reviews(answer.read().decode())
    assert isinstance(driver, ChartDriver)
    pods = cluster.get("pods", "-n", CHART_NAMESPACE, "-l", f"{COMPONENT_LABEL}=webhook")["items"]
    total = 0.0
    for pod in pods:
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{CHART_NAMESPACE}/pods/https:{name}:8443/proxy/metrics"
        total += _reviews(cluster.kubectl("get", "--raw", path))
    return total


def device_class(name: str, driver: str) -> dict[str, Any]:
    selectors = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": selectors}}  # fmt: skip


def template(name: str, class_name: str, memory: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": class_name}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}}}  # fmt: skip


def pod(name: str, templates: dict[str, str]) -> dict[str, Any]:
    """Pod ``name`` whose one container consumes a claim from each of ``templates`` (entry ->
    template), created without a gate: a gate it has was added by admission."""
    claims = [{"name": entry, "resourceClaimTemplateName": t} for entry, t in templates.items()]
    container = {
        "name": "main",
        "image": PAUSE_IMAGE,
        "resources": {"claims": [{"name": e} for e in templates]},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [container], "resourceClaims": claims,
                     "terminationGracePeriodSeconds": 0}}  # fmt: skip


def create(cluster: RealCluster, body: dict[str, Any], *flags: str) -> dict[str, Any]:
    created: dict[str, Any] = json.loads(
        cluster.kubectl("create", "-o", "json", *flags, "-f", "-", stdin=json.dumps(body))
    )
    return created


def gates(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or ()]


def switch(driver: DriverUnderTest, mode: str) -> None:
    assert isinstance(driver, (HostDriver, ChartDriver)), f"no pod gate switch for the {driver.kind} driver"
    driver.set_pod_gate(mode)


@pytest.fixture(scope="module")
def policy_gate(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[DriverUnderTest]:
    """The driver with the pod gate policy in place of the webhook's ``/mutate``, in effect (a
    dry-run pod is gated without a review), our classes and templates made; undone afterwards."""
    if not serves_mutating_policies(real_cluster.api_client):
        pytest.skip("kube-apiserver does not serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy")
    switch(driver, "policy")
    try:
        for body in (device_class(OURS, DRIVER), device_class(OTHER, "other.example.com"),
                     template("pg-ours", OURS, "1Gi"), template("pg-limited", OURS, "1Gi"),
                     template("pg-whole", OURS), template("pg-foreign", OTHER)):  # fmt: skip
            create(real_cluster, body)

        # The API server applies policies and webhook configurations from informers.
        def in_effect() -> bool:
            before = mutate_reviews(real_cluster, driver)
            probe = create(real_cluster, pod("pg-probe", {"gpu": "pg-foreign"}), "--dry-run=server")
            return gates(probe) == [GATE_NAME] and mutate_reviews(real_cluster, driver) == before

        wait_for(in_effect, 60, "pods gated by the API server, not the webhook", 0.5)
        yield driver
    finally:
        real_cluster.kubectl("delete", "pods", "-n", "default", "pg-ours", "pg-foreign", "pg-conflict",
                             "--ignore-not-found", "--wait=true", "--timeout=90s")  # fmt: skip
        real_cluster.kubectl("delete", "resourceclaimtemplates", "-n", "default", "pg-ours", "pg-limited",
                             "pg-whole", "pg-foreign", "--ignore-not-found")  # fmt: skip
        real_cluster.kubectl("delete", "deviceclass", OURS, OTHER, "--ignore-not-found", "--wait=true")
        switch(driver, "webhook")


def pod_claim(cluster: RealCluster, pod_name: str, entry: str) -> dict[str, Any]:
    current = cluster.get("pod", "-n", "default", pod_name)
    statuses = (current.get("status") or {}).get("resourceClaimStatuses") or ()
    name = next(s["resourceClaimName"] for s in statuses if s["name"] == entry)
    claim: dict[str, Any] = cluster.get("resourceclaim", "-n", "default", name)
    return claim


def test_pods_are_gated_in_the_api_server_and_handled_by_the_controller(
    real_cluster: RealCluster, policy_gate: DriverUnderTest
) -> None:
    cluster = real_cluster
    before = mutate_reviews(cluster, policy_gate)
    ours = create(cluster, pod("pg-ours", {"gpu": "pg-ours"}))
    foreign = create(cluster, pod("pg-foreign", {"gpu": "pg-foreign"}))
    conflict = create(cluster, pod("pg-conflict", {"gpu": "pg-limited", "more": "pg-whole"}))
    assert [gates(p) for p in (ours, foreign, conflict)] == [[GATE_NAME]] * 3, "gated at creation"

    # Ours: allocated by the controller, bound by kube-scheduler.
    wait_for(
        lambda: cluster.get("pod", "-n", "default", "pg-ours")["spec"].get("nodeName"), 90, "pg-ours bound"
    )
    allocation = pod_claim(cluster, "pg-ours", "gpu")["status"]["allocation"]
    assert allocation["devices"]["results"][0]["driver"] == DRIVER

    # Another driver's: the gate lifted, nothing of ours on its claim.
    wait_for(lambda: not gates(cluster.get("pod", "-n", "default", "pg-foreign")), 60, "pg-foreign released")
    claim = pod_claim(cluster, "pg-foreign", "gpu")
    assert not (claim.get("status") or {}).get("allocation") and FINALIZER not in claim["metadata"].get(
        "finalizers", []
    )

    # HAMi-core's limits cannot be enforced: held gated, with the reason on the pod.
    def held() -> dict[str, Any] | None:
        conditions = (cluster.get("pod", "-n", "default", "pg-conflict").get("status") or {}).get(
            "conditions"
        )
        return next((c for c in conditions or () if c["type"] == CONDITION and c["status"] == "False"), None)

    condition = wait_for(held, 60, "pg-conflict reported pending")
    assert condition["reason"] == Reason.LIMITS_CONFLICT.value, condition
    assert "together with another GPU" in condition["message"]
    assert gates(cluster.get("pod", "-n", "default", "pg-conflict")) == [GATE_NAME]

    assert mutate_reviews(cluster, policy_gate) == before, "no pod went through the webhook's /mutate"
