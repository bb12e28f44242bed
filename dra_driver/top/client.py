"""Reach the cluster as kubectl does and read what ``top`` needs, failing in one line.

Configuration follows kubectl, because ``top`` is also run as ``kubectl hami-dra top``:
``--kubeconfig``, else ``$KUBECONFIG`` (several files joined by ``:`` are merged), else
``~/.kube/config``, else the pod's service account; ``--context`` picks a context; the
namespace defaults to the context's, else the service account's, else ``default``. The
configuration is never written back (refreshed tokens stay in memory).

Reads are lists only (ResourceSlices by ``spec.driver``, ResourceClaims and Pods of one namespace
or all), paged so a large cluster is never one giant response, as raw JSON so fields newer than
the client survive. API errors become :class:`~dra_driver.cli.UsageError` (one line, exit 2):
an unreachable server, missing permissions and a cluster without ``resource.k8s.io/v1`` each say
what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.cli import UsageError
from dra_driver.kube.config import load_api_client

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PAGE_SIZE = 500
#: (connect, read) seconds: an unreachable server fails in seconds, not minutes.
REQUEST_TIMEOUT = (10, 60)


@dataclass(frozen=True, slots=True)
class Connection:
    api_client: Any
    #: The namespace of the selected context (or service account), ``default`` when it names none.
    namespace: str
    server: str


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    """Raw API objects, handed to :mod:`dra_driver.top.objects` to parse."""

    slices: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    if kubeconfig:
        return kubeconfig
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """An API client and default namespace from kubectl's sources (see the module docstring)."""
    from kubernetes import client, config

    path = _kubeconfig_path(kubeconfig)
    if path is None:
        if context:
            raise UsageError(f"--context {context}: no kubeconfig (pass --kubeconfig or set KUBECONFIG)")
        api_client = load_api_client(None)
        namespace = "default"
        if SERVICE_ACCOUNT_NAMESPACE.is_file():
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or namespace
        return Connection(api_client, namespace, str(api_client.configuration.host))
    if os.pathsep not in path and not Path(path).expanduser().is_file():
        raise UsageError(f"kubeconfig {path} does not exist (pass --kubeconfig or set KUBECONFIG)")
    configuration = client.Configuration()
    try:
        contexts, current = config.list_kube_config_contexts(path)  # type: ignore[no-untyped-call,unused-ignore]
        chosen = current
        if context:
            chosen = next((c for c in contexts if c.get("name") == context), None)
            if chosen is None:
                names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
                raise UsageError(f"context {context!r} not in {path} (contexts: {names})")
        config.load_kube_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, OSError, ValueError) as err:
        raise UsageError(f"cannot load Kubernetes config from {path}: {err}") from None
    # No silent retries: each would log a warning line before the one-line error.
    configuration.retries = 0
    namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")
    return Connection(client.ApiClient(configuration), namespace, str(configuration.host))


def _list_all(call: Callable[..., Any], what: str, server: str, **kwargs: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = _request(call, what, server, limit=PAGE_SIZE, _continue=token, **kwargs)
        items.extend(page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _request(call: Callable[..., Any], what: str, server: str, **kwargs: Any) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = call(_preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data: dict[str, Any] = json.loads(response.data)
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


def fetch(connection: Connection, driver: str, namespace: str | None) -> ClusterObjects:
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
