"""Reach the cluster as kubectl does and read what ``top`` needs, failing in one line.

The client follows kubectl (:func:`dra_driver.kube.config.load_kubectl_client`), because ``top``
is also run as ``kubectl hami-dra top``; the namespace defaults to the context's.

Reads are lists only (ResourceSlices by ``spec.driver``, ResourceClaims of all namespaces, which
a card's usage needs, falling back to one namespace's when those are forbidden, and Pods of one
namespace or all), paged so a large cluster is never one giant response, as raw JSON so fields newer than
the client survive. API errors become :class:`~dra_driver.cli.UsageError` (one line, exit 2):
an unreachable server, missing permissions and a cluster without ``resource.k8s.io/v1`` each say
what to do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.cli import UsageError
from dra_driver.kube.api import Obj
from dra_driver.kube.config import CLI_REQUEST_TIMEOUT as REQUEST_TIMEOUT
from dra_driver.kube.config import KubectlClient, is_connection_error, unreachable

PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    """Raw API objects, handed to :mod:`dra_driver.top.objects` to parse."""

    slices: list[Obj]
    claims: list[Obj]
    pods: list[Obj]
    #: ``claims`` are only this namespace's: listing every namespace's was forbidden.
    claims_namespace: str | None = None


class Forbidden(UsageError):
    """The credentials may not list something (401 or 403)."""


def _list_all(call: Callable[..., Any], what: str, server: str, **kwargs: Any) -> list[Obj]:
    items: list[Obj] = []
    token: str | None = None
    while True:
        page = _request(call, what, server, limit=PAGE_SIZE, _continue=token, **kwargs)
        items.extend(page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _request(call: Callable[..., Any], what: str, server: str, **kwargs: Any) -> Obj:
    from kubernetes.client.exceptions import ApiException

    try:
        response = call(_preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data: Obj = json.loads(response.data)
        return data
    except ApiException as err:
        error = Forbidden if err.status in (401, 403) else UsageError
        raise error(_api_error(err, what, server)) from None
    except Exception as err:
        if is_connection_error(err):
            raise unreachable(server, err) from None
        raise


def _api_error(err: Any, what: str, server: str) -> str:
    message = ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = str(json.loads(err.body).get("message") or "")
    if err.status in (401, 403):
        hint = "; -n NAMESPACE reads one namespace" if what.endswith("all namespaces") else ""
        return f"forbidden: cannot list {what} ({message or err.reason}){hint}"
    if err.status == 404:
        return f"{server} does not serve {what} (resource.k8s.io/v1 needs Kubernetes 1.34+)"
    return f"listing {what} failed: {err.status} {message or err.reason}"


def fetch(connection: KubectlClient, driver: str, namespace: str | None) -> ClusterObjects:
    """Our driver's slices, the claims of every namespace (of ``namespace`` when the others are
    forbidden) and the pods of ``namespace`` (None: all namespaces)."""
    from kubernetes import client

    resource = client.ResourceV1Api(connection.api_client)
    core = client.CoreV1Api(connection.api_client)
    server = connection.server
    slices = _list_all(
        resource.list_resource_slice, "resourceslices", server, field_selector=f"spec.driver={driver}"
    )
    every_claim = (resource.list_resource_claim_for_all_namespaces, "resourceclaims in all namespaces")
    if namespace is None:
        claims = _list_all(*every_claim, server)
        pods = _list_all(core.list_pod_for_all_namespaces, "pods in all namespaces", server)
        return ClusterObjects(slices, claims, pods)
    where = f"in namespace {namespace}"
    pods = _list_all(core.list_namespaced_pod, f"pods {where}", server, namespace=namespace)
    try:
        return ClusterObjects(slices, _list_all(*every_claim, server), pods)
    except Forbidden:  # a tenant's Role: usage becomes the namespace's share, and says so
        claims = _list_all(
            resource.list_namespaced_resource_claim, f"resourceclaims {where}", server, namespace=namespace
        )
        return ClusterObjects(slices, claims, pods, claims_namespace=namespace)
