"""Read what a pod refers to: its ResourceClaims and ResourceClaimTemplates, and DeviceClasses.

Requests go through the controller's thin REST layer (``dra_driver.controller.kube``). The
admission logic only needs "which device classes do this claim's requests use, with what
capacity requests" and "is this class ours"; ``Lookup`` is that small interface. ``KubeLookup``
implements it with the real ``kubernetes`` client, reading plain dicts (no generated models, so
new API fields never break us) and caching DeviceClasses briefly since they rarely change.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from dra_driver.config.classes import is_driver_class
from dra_driver.controller.kube import Kube, KubeError

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"


class Lookup(Protocol):
    def claim_spec(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ResourceClaim's ``spec`` (None when it does not exist)."""

    def template_spec(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ResourceClaimTemplate's ``spec.spec`` (the claim spec it stamps out)."""

    def is_our_class(self, name: str) -> bool | None:
        """Whether the DeviceClass is ours; None when it does not exist."""


@runtime_checkable
class TemplateWriter(Protocol):
    def ensure_template(self, template: Mapping[str, Any]) -> None:
        """Create the ResourceClaimTemplate unless one of ours with that name exists already."""


class KubeLookup:
    """``Lookup`` over the API server; DeviceClass answers are cached for ``class_ttl`` seconds."""

    def __init__(
        self, api_client: Any, driver: str, class_ttl: float = 30.0, request_timeout: float = 3.0
    ) -> None:
        # Well under the API server's webhook timeout (10 s by default): a hung read becomes an
        # error, which gates the pod, instead of a timed-out review the failurePolicy may reject.
        # urllib3 would retry a read timeout three times (4x the timeout), so reads are not retried.
        self._kube = Kube(_without_read_retries(api_client), request_timeout=request_timeout)
        self._driver = driver
        self._ttl = class_ttl
        self._classes: dict[str, tuple[float, bool | None]] = {}
        self._lock = threading.Lock()

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self._kube.request("GET", path)
        except KubeError as err:
            if err.not_found:
                return None
            raise
        return result

    def claim_spec(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        obj = self._get(
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaims/{name}"
        )
        return None if obj is None else obj.get("spec") or {}

    def template_spec(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        path = (
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaimtemplates/{name}"
        )
        obj = self._get(path)
        return None if obj is None else (obj.get("spec") or {}).get("spec") or {}

    def is_our_class(self, name: str) -> bool | None:
        now = time.monotonic()
        with self._lock:
            cached = self._classes.get(name)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
        obj = self._get(f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/deviceclasses/{name}")
        answer = None if obj is None else is_driver_class(obj, self._driver)
        with self._lock:
            self._classes[name] = (now, answer)
        return answer

    def ensure_template(self, template: Mapping[str, Any]) -> None:
        """Concurrent admissions of one shape race to create it: AlreadyExists is success when the
        existing template is one this webhook made (same label), and an error otherwise."""
        from dra_driver.webhook.hami_resources import TEMPLATE_LABEL, TranslationError

        meta = template["metadata"]
        path = (
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{meta['namespace']}/resourceclaimtemplates"
        )
        try:
            self._kube.request("POST", path, dict(template))
            return
        except KubeError as err:
            if not err.conflict:
                raise
        existing = self._get(f"{path}/{meta['name']}") or {}
        label = ((existing.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_LABEL)
        if label != meta["labels"][TEMPLATE_LABEL]:
            raise TranslationError(
                f"a ResourceClaimTemplate {meta['namespace']}/{meta['name']} exists that hami-dra did not "
                f"create (no {TEMPLATE_LABEL} label); rename or delete it"
            )


def _without_read_retries(api_client: Any) -> Any:
    """A client like ``api_client`` whose requests retry a failed connection once but never a read."""
    from kubernetes import client
    from urllib3.util.retry import Retry

    configuration = copy.copy(api_client.configuration)
    configuration.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
    return client.ApiClient(configuration)
