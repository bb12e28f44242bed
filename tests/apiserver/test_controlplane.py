"""The real API server tier itself (tests/apiserver_fixtures.py): what it serves and how it runs.

Its promise is that a test sees what the local cluster's kube-apiserver would answer: the same
feature gates (a field of a gated feature that is off is dropped on write), the loopback only, and
one namespace and driver name per test.
"""

from __future__ import annotations

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import RESOURCE_SLICES, Kube
from dra_driver.resource.slice_builder import build_resource_slices
from hami_dra_dev.cluster.controlplane import LOOPBACK, ControlPlane


def test_the_dra_features_the_driver_uses_are_on(api_kube: Kube, api_driver: str) -> None:
    """Consumable capacity (shared GPUs) and device taints (the policy taint) survive a write: with
    their feature gates off, kube-apiserver would drop those fields silently."""
    node = f"{api_driver.split('.')[0]}-node"
    (body,) = build_resource_slices(
        profile_gpus("t4", node_name=node, gpus=1), node_name=node, driver_name=api_driver, policy_taint=True
    )
    written = api_kube.create(RESOURCE_SLICES, None, body)
    (device,) = written["spec"]["devices"]
    (sent,) = body["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["requestPolicy"] == sent["capacity"]["memory"]["requestPolicy"]
    kept = [{k: t[k] for k in ("key", "effect")} for t in device.get("taints") or ()]
    assert sent["taints"] and kept == sent["taints"]
    assert all(t.get("timeAdded") for t in device["taints"])  # stamped by the server, so stored


def test_it_listens_on_the_loopback_on_a_port_of_its_own(apiserver: ControlPlane) -> None:
    """Never the fixed ports a full local cluster uses (one may be up on the same machine)."""
    assert apiserver.server_url.startswith(f"https://{LOOPBACK}:")
    ports = apiserver.layout.ports
    assert 6443 not in (ports.apiserver,) and {2379, 2380}.isdisjoint({ports.etcd_client, ports.etcd_peer})
    assert [p.name for p in apiserver.components] == ["etcd", "kube-apiserver"]
    assert all(p.alive() for p in apiserver.components)


def test_each_test_gets_a_namespace_of_its_own(api_kube: Kube, api_namespace: str) -> None:
    namespace = api_kube.request("GET", f"/api/v1/namespaces/{api_namespace}")
    assert namespace["status"]["phase"] == "Active"
    assert api_kube.request("GET", f"/api/v1/namespaces/{api_namespace}/serviceaccounts/default")
    # Named after the test (readable in a failure's output), unique by a random suffix.
    assert api_namespace.startswith("each-test-gets-a-namespace") and len(api_namespace) <= 40
