"""A thin REST layer: plain dicts in and out over the real ``kubernetes`` client.

Objects stay dicts (no generated models) so that fields newer than the client (consumable
capacity, shareID, device taints) round-trip untouched. Errors become the ``KubeError`` subclass of their
HTTP status (dra_driver/kube/errors.py): a ``Conflict`` is re-read and retried, a ``Gone`` watch relists.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from dra_driver.kube.errors import KubeError
from dra_driver.kube.transport import RestTransport

#: A Kubernetes object as JSON, one this code builds or changes (what it sends, what a call returns).
Obj = dict[str, Any]
#: The same, read only: what a function that only reads an object takes (any mapping will do).
ObjView = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
EVENTS = Resource("", "v1", "events", "Event", True)
#: The same Events as ``events.k8s.io/v1`` (``note``, ``regarding``, ``series``): dra_driver/kube/events.py.
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", "Event", True)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota", True)
GPU_QUOTAS = Resource("gpu.hami.io", "v1alpha1", "gpuquotas", "GpuQuota", True)


def patch_content_type(patch: Any, *, strategic: bool = False) -> str:
    """The PATCH body's type: a list of ops is a JSON patch (RFC 6902), a map a JSON merge patch
    (RFC 7386) or, with ``strategic``, Kubernetes' strategic merge patch."""
    if isinstance(patch, list):
        return "application/json-patch+json"
    return "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"


class KubeApi(Protocol):
    """What the controller needs from the API: ``Kube`` in production, an in-memory fake in the
    controller's unit tests (tests/controller/fake_kube.py)."""

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj: ...

    def list(
        self,
        resource: Resource,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
    ) -> Obj: ...

    def create(self, resource: Resource, namespace: str | None, obj: Obj) -> Obj: ...

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj: ...

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        status: bool = False,
        strategic: bool = False,
    ) -> Obj: ...

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> Iterator[Obj]: ...


class Kube:
    """REST calls on a ``kubernetes.client.ApiClient``'s connection pool, with its auth, TLS and
    proxy from kubeconfig (dra_driver/kube/transport.py)."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        self.api_client = api_client
        self.transport = RestTransport(api_client)
        self.timeout = request_timeout

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | None = None,
    ) -> Any:
        from urllib3.exceptions import HTTPError

        try:
            response = self.transport.request(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                timeout=timeout or self.timeout,
                stream=stream,
            )
        except (HTTPError, OSError) as err:
            raise KubeError(0, f"{method} {path}: {err}") from None
        status = int(response.status)
        if not 200 <= status <= 299:
            data = response.data
            message = data.decode(errors="replace")[:500] if data else str(response.reason)
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(data).get("message", message)
            raise KubeError(status, message)
        if stream:
            return response
        data = response.data
        return json.loads(data) if data else {}

    def request(
        self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None
    ) -> Obj:
        """A raw call for paths without a helper (deletes, other resources); JSON in and out."""
        result: Obj = self._call(method, path, body=body, query=query)
        return result

    def delete(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return self.request("DELETE", resource.path(namespace, name))

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        result: Obj = self._call("GET", resource.path(namespace, name))
        return result

    def list(
        self,
        resource: Resource,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
    ) -> Obj:
        """One list call; with ``limit``, one page of at most that many items, whose
        ``metadata.continue`` token (``continue_from``) asks for the next (dra_driver/kube/pager.py)."""
        query: dict[str, Any] = {}
        if field_selector:
            query["fieldSelector"] = field_selector
        if limit:
            query["limit"] = str(limit)
        if continue_from:
            query["continue"] = continue_from
        result: Obj = self._call("GET", resource.path(), query=query)
        return result

    def create(self, resource: Resource, namespace: str | None, obj: Obj) -> Obj:
        result: Obj = self._call("POST", resource.path(namespace), body=obj)
        return result

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
        meta = obj["metadata"]
        path = resource.path(meta.get("namespace"), meta["name"], "status" if status else None)
        result: Obj = self._call("PUT", path, body=obj)
        return result

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        status: bool = False,
        strategic: bool = False,
    ) -> Obj:
        """A JSON patch (``patch`` a list of ops), else a JSON merge patch, or with ``strategic`` a
        strategic merge patch (lists with a merge key, a pod's conditions by type, merge by it)."""
        path = resource.path(namespace, name, "status" if status else None)
        kind = patch_content_type(patch, strategic=strategic)
        result: Obj = self._call("PATCH", path, body=patch, content_type=kind)
        return result

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> Iterator[Obj]:
        """Watch events (``type``, ``object``) from ``resource_version``, until the server ends the stream.

        An ``ERROR`` event with a 410 status raises ``KubeError(410)`` so the caller relists.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if field_selector:
            query["fieldSelector"] = field_selector
        from urllib3.exceptions import HTTPError

        response = self._call("GET", resource.path(), query=query, stream=True, timeout=timeout_seconds + 30)
        try:
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                # Every whole line of the chunk at once: splitting one line off at a time copied
                # the rest of a 64 KiB chunk for each of its events.
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event: Obj = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise KubeError(
                            int(status.get("code") or 0), str(status.get("message", "watch error"))
                        )
                    yield event
        except (OSError, ValueError, HTTPError) as err:
            raise KubeError(0, f"watch {resource.plural}: {err}") from None
        finally:
            response.release_conn()
