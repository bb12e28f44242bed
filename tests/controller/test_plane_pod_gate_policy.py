"""Pods gated by the API server's pod gate policy (dra_driver/webhook/pod_gate.py, the chart's
``webhook.podGate: policy``) on the real control plane: the policy cannot read templates, so it
gates every pod with claims, and the controller must do what the webhook did at admission. A pod of
another driver's class is released (its gate lifted, nothing of ours written); a pod whose
containers break HAMi-core's per-container limits is held pending with the reason instead of being
refused; a pod of ours is allocated and bound as usual. Pods are created ungated: every gate seen
was added by kube-apiserver (1.36+; skipped where it does not serve the policy API)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.controller import FINALIZER
from dra_driver.controller.reasons import Reason
from dra_driver.kube.api import Kube
from dra_driver.kube.errors import KubeError
from dra_driver.webhook.pod_gate import pod_gate_policy
from dra_driver.webhook.policy import API_VERSION, BINDING_KIND, PLURALS, POLICY_KIND
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import (
    DRIVER,
    GATE,
    NS,
    Harness,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)

NAME = "hami-dra-test-pod-gate"
OTHER_DRIVER = "other.example.com"
CONDITION = "gpu.hami.io/Allocated"


def _apply(kube: Kube, bodies: list[dict[str, Any]]) -> None:
    for body in bodies:
        kube.request("POST", f"/apis/{API_VERSION}/{PLURALS[body['kind']]}", body)


def _remove(kube: Kube) -> None:
    for kind in (BINDING_KIND, POLICY_KIND):
        try:
            kube.request("DELETE", f"/apis/{API_VERSION}/{PLURALS[kind]}/{NAME}")
        except KubeError as err:
            if not err.not_found:
                raise


def gates(h: Harness, name: str) -> list[str]:
    return [g["name"] for g in h.get_pod(name)["spec"].get("schedulingGates") or ()]


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane) as h:
        listing = h.kube.request("GET", f"/apis/{API_VERSION}")
        if not any(r.get("name") == PLURALS[POLICY_KIND] for r in listing.get("resources") or ()):
            pytest.skip(f"this kube-apiserver does not serve {API_VERSION} MutatingAdmissionPolicy (1.36+)")
        selector = {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NS]}]
        }
        _apply(h.kube, pod_gate_policy(NAME, selector))
        try:
            h.publish("node-1", "t4", 2)
            h.create_class(device_class(DRIVER))
            h.create_class(device_class("other-gpu", selectors=[f'device.driver == "{OTHER_DRIVER}"']))
            # The API server reads policies from an informer: wait until it gates a probe pod.
            probes = iter(range(1000))

            def policy_active() -> bool:
                name = f"probe-{next(probes)}"
                created = h.create_pod(pod(name, {"gpu": "template:none"}, gated=False))
                h.delete_pod(name)
                return [g["name"] for g in created["spec"].get("schedulingGates") or ()] == [GATE]

            wait_for(policy_active, 30, "the pod gate policy applied by kube-apiserver")
            yield h
        finally:
            _remove(h.kube)


def test_a_pod_of_another_drivers_class_is_gated_then_released(harness: Harness) -> None:
    harness.create_template("foreign", request(klass="other-gpu"))
    created = harness.create_pod(pod("foreign-pod", {"gpu": "template:foreign"}, gated=False))
    assert [g["name"] for g in created["spec"]["schedulingGates"]] == [GATE], "gated by the API server"
    harness.start_controller()
    wait_for(lambda: not gates(harness, "foreign-pod"), what="the controller lifting the gate")
    claim = harness.pod_claim("foreign-pod")
    assert not (claim.get("status") or {}).get("allocation"), "nothing of ours allocated"
    assert FINALIZER not in (claim["metadata"].get("finalizers") or [])


def test_a_pod_breaking_hami_core_limits_is_held_pending_with_the_reason(harness: Harness) -> None:
    harness.create_template("limited", request(memory="1Gi"))
    harness.create_template("whole", request())
    body = pod("conflict-pod", {"gpu": "template:limited", "more": "template:whole"}, gated=False)
    harness.create_pod(body)  # the webhook would have refused it; the policy cannot tell
    harness.start_controller()

    def reported() -> dict[str, Any] | None:
        conditions = (harness.get_pod("conflict-pod").get("status") or {}).get("conditions") or ()
        return next((c for c in conditions if c["type"] == CONDITION and c["status"] == "False"), None)

    condition = wait_for(reported, what="the pod's pending condition")
    assert condition["reason"] == Reason.LIMITS_CONFLICT.value
    assert "memory/cores limits together with another GPU" in condition["message"]
    assert any("together with another GPU" in event for event in harness.events("conflict-pod"))
    assert gates(harness, "conflict-pod") == [GATE], "kept gated: no share nothing enforces"
    assert not harness.pod_claim("conflict-pod", "gpu").get("status", {}).get("allocation")


def test_a_pod_of_ours_is_allocated_and_bound(harness: Harness) -> None:
    harness.create_template("ours", request(memory="1Gi"))
    harness.create_pod(pod("our-pod", {"gpu": "template:ours"}, gated=False))
    harness.start_controller()
    assert wait_for(lambda: harness.bound_node("our-pod"), what="our pod bound") == "node-1"
    assert harness.pod_claim("our-pod")["status"]["allocation"]["devices"]["results"][0]["driver"] == DRIVER
