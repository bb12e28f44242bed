"""Reach the cluster as kubectl does and read what ``top`` needs, failing in one line.

The client follows kubectl (:func:`dra_driver.kube.config.load_kubectl_client`), because ``top``
is also run as ``kubectl hami-dra top``; the namespace defaults to the context's.

Reads are lists only (ResourceSlices by ``spec.driver``, ResourceClaims and Pods of one namespace
or all), paged so a large cluster is never one giant response, as raw JSON so fields newer than
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
from dra_driver.kube.config import KubectlClient

PAGE_SIZE = 500
#: (connect, read) seconds: an unreachable server fails in seconds, not minutes.
REQUEST_TIMEOUT = (10, 60)


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    """Raw API objects, handed to :mod:`dra_driver.top.objects` to parse."""

    slices: list[Obj]
    claims: list[Obj]
    pods: list[Obj]


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
    from urllib3.exceptions import HTTPError

    try:
        response = call(_preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data: Obj = json.loads(response.data)
        return data
    except ApiException as err:
        raise UsageError(_api_error(err, what, server)) from None
    except (HTTPError, OSError) as err:
        # urllib3 prefixes the connection's repr ("HTTPSConnection(host=...): Failed to ..."); drop it.
        reason = str(getattr(err, "reason", None) or err).split("): ", 1)[-1]
        raise UsageError(f"cannot reach the API server at {server}: {reason}") from None


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
    """Our driver's slices, and the claims and pods of ``namespace`` (None: all namespaces)."""
    from kubernetes import client

    resource = client.ResourceV1Api(connection.api_client)
    core = client.CoreV1Api(connection.api_client)
    server = connection.server
    slices = _list_all(
        resource.list_resource_slice, "resourceslices", server, field_selector=f"spec.driver={driver}"
    )
    if namespace is None:
        claims = _list_all(
            resource.list_resource_claim_for_all_namespaces, "resourceclaims in all namespaces", server
        )
        pods = _list_all(core.list_pod_for_all_namespaces, "pods in all namespaces", server)
    else:
        where = f"in namespace {namespace}"
        claims = _list_all(
            resource.list_namespaced_resource_claim, f"resourceclaims {where}", server, namespace=namespace
        )
        pods = _list_all(core.list_namespaced_pod, f"pods {where}", server, namespace=namespace)
    return ClusterObjects(slices, claims, pods)
