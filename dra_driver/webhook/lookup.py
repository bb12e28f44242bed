"""Read what a pod refers to: its ResourceClaims and ResourceClaimTemplates, and DeviceClasses.

Requests go through the controller's thin REST layer (``dra_driver.kube.api``). The
admission logic only needs "which device classes do this claim's requests use, with what
capacity requests" and "is this class ours"; ``Lookup`` is that small interface. ``KubeLookup``
implements it with the real ``kubernetes`` client, reading plain dicts (no generated models, so
new API fields never break us) and caching DeviceClasses briefly since they rarely change. For
``/mutate-hami`` it also reads Namespace labels (the opt-in) and creates templates.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlencode

from dra_driver.config.classes import is_driver_class
from dra_driver.kube.api import Kube
from dra_driver.kube.errors import KubeError
from dra_driver.resource.refs import RequestRef, claim_request_refs, template_request_refs
from dra_driver.webhook.optin import MAX_TEMPLATES_PER_NAMESPACE

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
T = TypeVar("T")


class Lookup(Protocol):
    def claim_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        """A ResourceClaim's requests (None when it does not exist)."""

    def template_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        """The requests of the claims a ResourceClaimTemplate stamps out (its ``spec.spec``)."""

    def is_our_class(self, name: str) -> bool | None:
        """Whether the DeviceClass is ours; None when it does not exist."""


@runtime_checkable
class TemplateWriter(Protocol):
    def ensure_template(self, template: Mapping[str, Any]) -> None:
        """Create the ResourceClaimTemplate unless one of ours with that name exists already."""


class TtlCache(Generic[T]):
    """Answers kept for ``ttl`` seconds, at most ``size`` of them (the oldest go first).

    Bounded because keys can come from the request: a caller sending reviews for made-up
    namespaces must not grow the webhook's memory.
    """

    def __init__(self, ttl: float, size: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, load: Callable[[], T]) -> T:
        """The cached answer for ``key``, or ``load()``'s (which may raise; errors are not cached)."""
        now = self._clock()
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
        value = load()
        with self._lock:
            self._entries[key] = (now, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return value


class KubeLookup:
    """``Lookup`` over the API server; DeviceClass answers are cached for ``class_ttl`` seconds,
    Namespace labels for ``namespace_ttl`` (so an opt-out may take that long to be seen)."""

    def __init__(
        self,
        api_client: Any,
        driver: str,
        class_ttl: float = 30.0,
        request_timeout: float = 3.0,
        *,
        namespace_ttl: float = 10.0,
        max_templates_per_namespace: int = MAX_TEMPLATES_PER_NAMESPACE,
    ) -> None:
        # Well under the API server's webhook timeout (10 s by default): a hung read becomes an
        # error, which gates the pod, instead of a timed-out review the failurePolicy may reject.
        # urllib3 would retry a read timeout three times (4x the timeout), so reads are not retried.
        self._kube = Kube(_without_read_retries(api_client), request_timeout=request_timeout)
        self._driver = driver
        self._classes: TtlCache[bool | None] = TtlCache(class_ttl)
        self._namespaces: TtlCache[dict[str, str] | None] = TtlCache(namespace_ttl)
        self.max_templates_per_namespace = max_templates_per_namespace

    def _get(self, path: str, name: str = "") -> dict[str, Any] | None:
        """GET ``path`` (ending in ``name``); None when it does not exist.

        Mutating admission runs before the API server validates the pod, so a claim or template
        name in it may be anything ("../../secrets/x", "a/status"): a name that is not a DNS
        subdomain names no object, and is never put into a request path.
        """
        if name and not _OBJECT_NAME.match(name):
            return None
        try:
            result: dict[str, Any] = self._kube.request("GET", path)
        except KubeError as err:
            if err.not_found:
                return None
            raise
        return result

    def claim_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        obj = self._get(
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaims/{name}", name
        )
        return None if obj is None else claim_request_refs(obj)

    def template_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        path = (
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaimtemplates/{name}"
        )
        obj = self._get(path, name)
        return None if obj is None else template_request_refs(obj)

    def is_our_class(self, name: str) -> bool | None:
        def load() -> bool | None:
            obj = self._get(f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/deviceclasses/{name}", name)
            return None if obj is None else is_driver_class(obj, self._driver)

        return self._classes.get(name, load)

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        def load() -> dict[str, str] | None:
            obj = self._get(f"/api/v1/namespaces/{name}", name)
            return None if obj is None else dict((obj.get("metadata") or {}).get("labels") or {})

        return self._namespaces.get(name, load)

    def ensure_template(self, template: Mapping[str, Any]) -> None:
        """Create the template unless ours exists, within the per-namespace cap.

        Most admissions reuse a shape, so the template is read first (one GET). A new shape is
        created only while the namespace holds fewer than ``max_templates_per_namespace`` templates
        of ours: every distinct memory size is a shape and nothing deletes templates, so without a
        cap a tenant could have the webhook write objects without end. Two replicas racing may
        overshoot the cap by one or two. Concurrent admissions of one shape race to create it:
        AlreadyExists is success when the existing template is one this webhook made (same label).
        """
        from dra_driver.webhook.hami_resources import TEMPLATE_LABEL, TranslationError

        meta = template["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        path = f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaimtemplates"
        existing = self._get(f"{path}/{name}")
        if existing is None:
            self._check_template_cap(path, namespace, name)
            try:
                self._kube.request("POST", path, dict(template))
                return
            except KubeError as err:
                if not err.conflict:
                    raise
            existing = self._get(f"{path}/{name}") or {}
        label = ((existing.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_LABEL)
        if label != meta["labels"][TEMPLATE_LABEL]:
            raise TranslationError(
                f"a ResourceClaimTemplate {namespace}/{name} exists that hami-dra did not "
                f"create (no {TEMPLATE_LABEL} label); rename or delete it"
            )

    def _check_template_cap(self, path: str, namespace: str, name: str) -> None:
        from dra_driver.webhook.hami_resources import TEMPLATE_LABEL, TranslationError

        cap = self.max_templates_per_namespace
        query = urlencode({"labelSelector": TEMPLATE_LABEL, "limit": cap})
        items = self._kube.request("GET", f"{path}?{query}").get("items") or []
        if len(items) >= cap:
            raise TranslationError(
                f"namespace {namespace} already holds {len(items)} ResourceClaimTemplates made by "
                f"hami-dra (the limit, --hami-max-templates-per-namespace) and {name} would be a new "
                f"shape; reuse an existing shape (kubectl get resourceclaimtemplates -n {namespace} "
                f"-l {TEMPLATE_LABEL}) or delete templates no pod uses"
            )


#: A path segment the webhook may request: an API group/version or an object name (DNS subdomain).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _without_read_retries(api_client: Any) -> Any:
    """A client like ``api_client`` whose requests retry a failed connection once but never a read."""
    from kubernetes import client
    from urllib3.util.retry import Retry

    configuration = copy.copy(api_client.configuration)
    configuration.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
    return client.ApiClient(configuration)
