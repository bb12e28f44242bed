"""The controller's finalizer on new claims of our classes at admission, on real kube-apiserver:
by the MutatingAdmissionPolicy where it serves one (1.36+), by the webhook's ``claims`` entry
otherwise (``make test-cluster KUBERNETES_VERSION=1.34.4``); a claim of another driver's class is
left alone, and deleting a finalized claim removes it (the controller's releaser)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.controller import FINALIZER
from hami_dra_dev.cluster.driver import serves_mutating_policies
from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = manifests.DRIVER
OURS = "finalizer-test.gpu.hami.io"
OTHER = "finalizer-test.other.example.com"


def device_class(name: str, driver: str) -> dict[str, Any]:
    selectors = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": selectors}}  # fmt: skip


def claim(name: str, class_name: str) -> dict[str, Any]:
    requests = [{"name": "g", "exactly": {"deviceClassName": class_name}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": requests}}}  # fmt: skip


def create(cluster: RealCluster, body: dict[str, Any]) -> dict[str, Any]:
    """``kubectl create``: the object as the API server stored it (admission included)."""
    out = cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(body))
    created: dict[str, Any] = json.loads(out)
    return created


def finalizers(obj: dict[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def test_a_claim_of_our_class_is_created_with_our_finalizer_and_deleted_without_it(
    real_cluster: RealCluster, driver: DriverUnderTest
) -> None:
    mechanism = "policy" if serves_mutating_policies(real_cluster.api_client) else "webhook"
    create(real_cluster, device_class(OURS, DRIVER))
    create(real_cluster, device_class(OTHER, "other.example.com"))
    made: list[str] = []
    try:
        # The policy's parameters (DeviceClasses) come from an informer of the API server's: a
        # claim admitted before it saw the new class is finalized later by the controller instead.
        def admitted() -> dict[str, Any] | None:
            created = create(real_cluster, claim(f"fin-{len(made)}", OURS))
            made.append(created["metadata"]["name"])
            return created if FINALIZER in finalizers(created) else None

        ours = wait_for(admitted, 30, f"a claim of {OURS} admitted with {FINALIZER} ({mechanism})", 0.5)
        assert finalizers(ours) == [FINALIZER]
        other = create(real_cluster, claim("fin-other", OTHER))
        made.append("fin-other")
        assert finalizers(other) == [], "another driver's claim is left alone"
        real_cluster.kubectl("delete", "resourceclaim", "-n", "default", *made, "--wait=false")

        def gone() -> bool:
            claims = real_cluster.get("resourceclaims", "-n", "default")["items"]
            return not [c for c in claims if c["metadata"]["name"] in made]

        wait_for(gone, 60, "the finalized claims deleted (the controller removed the finalizer)")
    finally:
        real_cluster.kubectl("delete", "deviceclass", OURS, OTHER, "--ignore-not-found", "--wait=true")
