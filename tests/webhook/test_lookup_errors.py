"""The webhook against a real (sandbox) API server that fails: an API blip must not reject pods."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.kube.api import DEVICE_CLASSES, RESOURCE_CLAIMS, Kube, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.webhook import GATE_NAME
from dra_driver.webhook.admission import mutate_pod
from dra_driver.webhook.lookup import KubeLookup
from hami_dra_dev.sandbox import SandboxServer
from tests.sandbox_fixtures import sandbox  # noqa: F401

DRIVER = "gpu.hami.io"


@pytest.fixture
def lookup(sandbox: SandboxServer) -> Iterator[KubeLookup]:  # noqa: F811
    client = sandbox.api_client()
    kube = Kube(client)
    kube.create(
        DEVICE_CLASSES,
        None,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "other.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}]},
        },
    )
    kube.create(
        RESOURCE_CLAIMS,
        "default",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "nic", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "other.example.com"}}]}
            },
        },
    )
    try:
        yield KubeLookup(client, DRIVER)
    finally:
        client.close()


def _review(pod_claims: list[dict[str, Any]]) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"resourceClaims": pod_claims, "containers": [{"name": "c", "image": "x"}]},
    }
    return {
        "uid": "u-1",
        "kind": {"kind": "Pod"},
        "namespace": "default",
        "operation": "CREATE",
        "object": pod,
    }


def test_foreign_claim_is_left_alone_when_readable(lookup: KubeLookup) -> None:
    verdict = mutate_pod(_review([{"name": "n", "resourceClaimName": "nic"}]), lookup)
    assert verdict.allowed and verdict.patch is None


@pytest.mark.parametrize("path", [r"/resourceclaims/nic$", r"/deviceclasses/other\.example\.com$"])
def test_api_error_while_looking_up_gates_instead_of_rejecting(
    sandbox: SandboxServer,  # noqa: F811
    lookup: KubeLookup,
    path: str,
) -> None:
    """A 500 from the API server must not deny the pod (whatever the failurePolicy says): the pod is
    gated as if its claim were not readable yet, and the controller lifts the gate if it is not ours."""
    sandbox.faults.inject(path, status=500, count=None, methods={"GET"})
    verdict = mutate_pod(_review([{"name": "n", "resourceClaimName": "nic"}]), lookup)
    assert verdict.allowed, verdict.message
    assert verdict.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE_NAME}]}]


def test_slow_api_answers_within_the_admission_timeout(sandbox: SandboxServer) -> None:  # noqa: F811
    """A hung lookup must not outlast the API server's webhook timeout (10 s by default, when the
    failurePolicy rejects the pod): each lookup gives up after a few seconds and the pod is gated."""
    client = sandbox.api_client()
    try:
        lookup = KubeLookup(client, DRIVER)
        sandbox.faults.inject(r"/resourceclaims/slow$", delay=8.0, count=None, methods={"GET"})
        started = time.monotonic()
        verdict = mutate_pod(_review([{"name": "n", "resourceClaimName": "slow"}]), lookup)
        elapsed = time.monotonic() - started
    finally:
        sandbox.faults.clear()
        client.close()
    assert verdict.allowed and verdict.patch is not None
    assert elapsed < 5.0, f"lookup took {elapsed:.1f}s"


@pytest.mark.parametrize(
    "name", ["../../../api/v1/namespaces/kube-system/secrets/x", "a/b", "UPPER", "x?watch=1"]
)
def test_a_name_that_is_no_object_name_never_reaches_a_request_path(lookup: KubeLookup, name: str) -> None:
    """Mutating admission sees the pod before the API server validates its claim names."""
    requested: list[str] = []
    real = lookup._kube.request

    def recording(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        requested.append(path)
        return real(method, path, *args, **kwargs)

    lookup._kube.request = recording  # type: ignore[method-assign]
    assert lookup.claim_requests("default", name) is None
    assert lookup.template_requests("default", name) is None
    assert lookup.is_our_class(name) is None
    assert requested == []
    assert lookup.claim_requests("default", "nic") is not None  # a valid name is requested
    assert requested == ["/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/nic"]


def _recording(lookup: KubeLookup, miss_cache: bool = False) -> list[tuple[str, dict[str, str]]]:
    """Record the lookup's requests (path, query); ``miss_cache``: a read from the watch cache
    answers 404, as for a claim created a moment before (not in the API server's cache yet)."""
    requested: list[tuple[str, dict[str, str]]] = []
    real = lookup._kube.request

    def recording(method: str, path: str, body: Any = None, query: Any = None) -> Any:
        requested.append((path, dict(query or {})))
        if miss_cache and query:
            raise KubeError(404, "not found")
        return real(method, path, body, query)

    lookup._kube.request = recording  # type: ignore[method-assign]
    return requested


def test_a_claim_is_read_from_the_watch_cache_and_from_etcd_only_when_it_misses(lookup: KubeLookup) -> None:
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/nic"
    requested = _recording(lookup)
    assert lookup.claim_requests("default", "nic") is not None
    assert requested == [(path, {"resourceVersion": "0"})]
    requested = _recording(lookup, miss_cache=True)
    assert lookup.claim_requests("default", "nic") is not None, "a cache miss is read again from etcd"
    assert requested == [(path, {"resourceVersion": "0"}), (path, {})]
    assert lookup.claim_requests("default", "absent") is None


TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True)


def test_a_template_is_read_once_per_ttl(sandbox: SandboxServer, lookup: KubeLookup) -> None:  # noqa: F811
    Kube(sandbox.api_client()).create(
        TEMPLATES,
        "default",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "default"},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": DRIVER}}]}}
            },
        },
    )
    requested = _recording(lookup)
    first = lookup.template_requests("default", "t")
    assert first is not None and [ref.class_name for ref in first] == [DRIVER]
    assert lookup.template_requests("default", "t") == first
    assert len(requested) == 1, "the second pod of a template costs no read"
