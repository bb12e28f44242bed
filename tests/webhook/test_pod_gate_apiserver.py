"""The pod gate's MutatingAdmissionPolicy (dra_driver/webhook/pod_gate.py) on the real kube-apiserver
of the shared tier, where it serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
(1.36+; skipped otherwise): the API server itself gates a new pod with claims, appends after
other gates, and leaves alone pods without claims, bound pods, pods gated already, pods asking for
HAMi's resources and pods of namespaces outside the selector. No webhook is registered here, so
every gate seen was added in process.

The policy is this test's own, scoped to its namespace by the selector, so the other tests on the
shared server never meet it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.contract import GATE_NAME
from dra_driver.kube.api import Kube
from dra_driver.kube.errors import KubeError
from dra_driver.webhook.pod_gate import pod_gate_policy
from dra_driver.webhook.policy import API_VERSION, BINDING_KIND, PLURALS, POLICY_KIND
from tests.waiting import wait_for

OTHER_GATE = "example.com/wait"
_names = itertools.count()


def _serves_policies(kube: Kube) -> bool:
    listing = kube.request("GET", f"/apis/{API_VERSION}")
    return any(r.get("name") == PLURALS[POLICY_KIND] for r in listing.get("resources") or ())


@pytest.fixture
def gated_namespace(api_kube: Kube, api_namespace: str) -> Iterator[str]:
    """``api_namespace`` with the pod gate policy bound to it alone (deleted afterwards)."""
    if not _serves_policies(api_kube):
        pytest.skip(f"this kube-apiserver does not serve {API_VERSION} MutatingAdmissionPolicy (1.36+)")
    name = f"pod-gate-{api_namespace}"
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                      "values": [api_namespace]}]}  # fmt: skip
    bodies = pod_gate_policy(name, selector)
    for body in bodies:
        api_kube.request("POST", f"/apis/{API_VERSION}/{PLURALS[body['kind']]}", body)
    try:
        yield api_namespace
    finally:
        for kind in (BINDING_KIND, POLICY_KIND):
            try:
                api_kube.request("DELETE", f"/apis/{API_VERSION}/{PLURALS[kind]}/{name}")
            except KubeError as err:
                if err.status != 404:
                    raise


def pod_body(
    claims: bool = True,
    gates: tuple[str, ...] = (),
    node: str = "",
    limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "some-template"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if limits:
        container.setdefault("resources", {})["limits"] = limits
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{next(_names)}"}, "spec": spec}


def created_gates(kube: Kube, namespace: str, body: dict[str, Any]) -> list[str]:
    """The gates of the pod as the API server stored it (admission included)."""
    pod = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    return [gate["name"] for gate in pod["spec"].get("schedulingGates") or ()]


def test_the_api_server_gates_new_pods_with_claims_in_process(api_kube: Kube, gated_namespace: str) -> None:
    namespace = gated_namespace
    # The API server reads policies and bindings from an informer: wait until it applies this one.
    first = wait_for(
        lambda: created_gates(api_kube, namespace, pod_body()) == [GATE_NAME],
        30,
        "a pod with a claim created with our gate",
        0.2,
    )
    assert first
    assert created_gates(api_kube, namespace, pod_body(gates=(OTHER_GATE,))) == [OTHER_GATE, GATE_NAME]
    assert created_gates(api_kube, namespace, pod_body(gates=(GATE_NAME,))) == [GATE_NAME], "never twice"
    assert created_gates(api_kube, namespace, pod_body(claims=False)) == []
    assert created_gates(api_kube, namespace, pod_body(node="node-a")) == [], "a bound pod cannot be gated"
    hami = pod_body(limits={"nvidia.com/gpu": "1"})
    assert created_gates(api_kube, namespace, hami) == [], "HAMi's resources stay the webhook's"


def test_namespaces_outside_the_selector_are_left_alone(
    api_kube: Kube, gated_namespace: str, api_namespace: str
) -> None:
    wait_for(
        lambda: created_gates(api_kube, gated_namespace, pod_body()) == [GATE_NAME], 30, "policy active", 0.2
    )
    other = f"{api_namespace}-x"
    api_kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": other}})  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    api_kube.request("POST", f"/api/v1/namespaces/{other}/serviceaccounts", account)
    assert created_gates(api_kube, other, pod_body()) == []
