"""The webhook's lookups against a real kube-apiserver that fails: an API blip must not reject pods.

The shared real API server tier (tests/apiserver_fixtures.py): the claims are in this test's own
namespace, the foreign DeviceClass is named after it. A real server answers no 500 on demand: that
fault is raised by the client (the lookup's ``Kube.request``, as ``FakeKube`` injects them); a hung
server is a real one, the loopback proxy holding every byte (``tests/api_proxy.py``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from dra_driver.kube.api import DEVICE_CLASSES, RESOURCE_CLAIMS, Kube, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.webhook import GATE_NAME
from dra_driver.webhook.admission import mutate_pod
from dra_driver.webhook.lookup import KubeLookup
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.api_proxy import ApiFaultProxy, proxied_kubeconfig


@dataclass(frozen=True)
class World:
    lookup: KubeLookup
    namespace: str
    driver: str
    foreign_class: str


@pytest.fixture
def world(apiserver_client: Any, api_kube: Kube, api_namespace: str, api_driver: str) -> World:
    """A claim ``nic`` of another driver's class, and a lookup for ours (``api_driver``)."""
    foreign = f"{api_namespace}.other.example.com"
    api_kube.create(
        DEVICE_CLASSES,
        None,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": foreign},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{foreign}"'}}]},
        },
    )
    api_kube.create(
        RESOURCE_CLAIMS,
        api_namespace,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "nic", "namespace": api_namespace},
            "spec": {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": foreign}}]}},
        },
    )
    return World(KubeLookup(apiserver_client, api_driver), api_namespace, api_driver, foreign)


def _review(namespace: str, pod_claims: list[dict[str, Any]]) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"resourceClaims": pod_claims, "containers": [{"name": "c", "image": "x"}]},
    }
    return {
        "uid": "u-1",
        "kind": {"kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": pod,
    }


def test_foreign_claim_is_left_alone_when_readable(world: World) -> None:
    verdict = mutate_pod(_review(world.namespace, [{"name": "n", "resourceClaimName": "nic"}]), world.lookup)
    assert verdict.allowed and verdict.patch is None


def _failing(lookup: KubeLookup, pattern: str) -> None:
    """Every GET of a path matching ``pattern`` answers 500, as an API server in trouble would."""
    real = lookup._kube.request

    def failing(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if method == "GET" and re.search(pattern, path):
            raise KubeError(500, "Internal error occurred: etcdserver: request timed out")
        return real(method, path, *args, **kwargs)

    lookup._kube.request = failing  # type: ignore[method-assign]


@pytest.mark.parametrize("failing", ["claim", "class"])
def test_api_error_while_looking_up_gates_instead_of_rejecting(world: World, failing: str) -> None:
    """A 500 from the API server must not deny the pod (whatever the failurePolicy says): the pod is
    gated as if its claim were not readable yet, and the controller lifts the gate if it is not ours."""
    path = (
        r"/resourceclaims/nic$" if failing == "claim" else f"/deviceclasses/{re.escape(world.foreign_class)}$"
    )
    _failing(world.lookup, path)
    verdict = mutate_pod(_review(world.namespace, [{"name": "n", "resourceClaimName": "nic"}]), world.lookup)
    assert verdict.allowed, verdict.message
    assert verdict.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE_NAME}]}]


@pytest.fixture
def hung_server(apiserver: ControlPlane, tmp_path: Path) -> Iterator[tuple[ApiFaultProxy, Any]]:
    """A client of the real server through the loopback proxy, and the proxy."""
    host, _, port = apiserver.server_url.removeprefix("https://").rpartition(":")
    proxy = ApiFaultProxy((host, int(port)))
    kubeconfig = proxied_kubeconfig(apiserver.kubeconfig_path, proxy.port, tmp_path / "proxied.kubeconfig")
    client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield proxy, client
    finally:
        client.close()
        proxy.stop()


def test_slow_api_answers_within_the_admission_timeout(
    world: World, hung_server: tuple[ApiFaultProxy, Any]
) -> None:
    """A hung lookup must not outlast the API server's webhook timeout (10 s by default, when the
    failurePolicy rejects the pod): each lookup gives up after a few seconds and the pod is gated."""
    proxy, client = hung_server
    lookup = KubeLookup(client, world.driver)
    assert lookup.claim_requests(world.namespace, "nic") is not None  # through the proxy, answered
    proxy.delay = 8.0
    proxy.cut()  # the next request opens a new connection, held byte by byte
    started = time.monotonic()
    verdict = mutate_pod(_review(world.namespace, [{"name": "n", "resourceClaimName": "nic"}]), lookup)
    elapsed = time.monotonic() - started
    assert verdict.allowed and verdict.patch is not None
    assert elapsed < 5.0, f"lookup took {elapsed:.1f}s"


@pytest.mark.parametrize(
    "name", ["../../../api/v1/namespaces/kube-system/secrets/x", "a/b", "UPPER", "x?watch=1"]
)
def test_a_name_that_is_no_object_name_never_reaches_a_request_path(world: World, name: str) -> None:
    """Mutating admission sees the pod before the API server validates its claim names."""
    lookup, namespace = world.lookup, world.namespace
    requested: list[str] = []
    real = lookup._kube.request

    def recording(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        requested.append(path)
        return real(method, path, *args, **kwargs)

    lookup._kube.request = recording  # type: ignore[method-assign]
    assert lookup.claim_requests(namespace, name) is None
    assert lookup.template_requests(namespace, name) is None
    assert lookup.is_our_class(name) is None
    assert requested == []
    assert lookup.claim_requests(namespace, "nic") is not None  # a valid name is requested
    assert requested == [f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/nic"]


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


def test_a_claim_is_read_from_the_watch_cache_and_from_etcd_only_when_it_misses(world: World) -> None:
    lookup, namespace = world.lookup, world.namespace
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/nic"
    requested = _recording(lookup)
    assert lookup.claim_requests(namespace, "nic") is not None
    assert requested == [(path, {"resourceVersion": "0"})]
    requested = _recording(lookup, miss_cache=True)
    assert lookup.claim_requests(namespace, "nic") is not None, "a cache miss is read again from etcd"
    assert requested == [(path, {"resourceVersion": "0"}), (path, {})]
    assert lookup.claim_requests(namespace, "absent") is None


TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True)


def test_a_template_is_read_once_per_ttl(world: World, api_kube: Kube) -> None:
    lookup, namespace, driver = world.lookup, world.namespace, world.driver
    api_kube.create(
        TEMPLATES,
        namespace,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": namespace},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": driver}}]}}
            },
        },
    )
    requested = _recording(lookup)
    first = lookup.template_requests(namespace, "t")
    assert first is not None and [ref.class_name for ref in first] == [driver]
    assert lookup.template_requests(namespace, "t") == first
    assert len(requested) == 1, "the second pod of a template costs no read"
