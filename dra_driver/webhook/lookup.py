"""Read what a pod refers to: its ResourceClaims and ResourceClaimTemplates, and DeviceClasses.

Requests go through the controller's thin REST layer (``dra_driver.kube.api``). The
admission logic only needs "which device classes do this claim's requests use, with what
capacity requests" and "is this class ours"; ``Lookup`` is that small interface. ``KubeLookup``
implements it with the real ``kubernetes`` client, reading plain dicts (no generated models, so
new API fields never break us) and caching DeviceClasses and ResourceClaimTemplates briefly (a
class rarely changes, a template's spec never does). A claim is read from the API server's watch
cache (``resourceVersion=0``: no etcd read per admitted pod) and, only when that misses (a claim
created a moment before its pod may not be there yet), read again from etcd. Neither cache can
make a pod of ours skip the controller: a stale answer either gates a pod that is not ours (the
controller lifts its gate) or leaves one of ours ungated, whose claim kube-scheduler cannot
allocate (the scheduler fence on our classes) and the controller places as it does any ungated
pod with an unallocated claim of ours. It never writes: ``/mutate-hami`` answers from the review
alone, and the controller creates the templates it names (webhook/hami_resources.py).
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from dra_driver.config.classes import is_driver_class
from dra_driver.kube.api import Kube
from dra_driver.kube.errors import KubeError
from dra_driver.resource.refs import RequestRef, claim_request_refs, template_request_refs

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
    """``Lookup`` over the API server; DeviceClass answers are cached for ``class_ttl`` seconds."""

    def __init__(
        self,
        api_client: Any,
        driver: str,
        class_ttl: float = 30.0,
        request_timeout: float = 3.0,
    ) -> None:
        # Well under the API server's webhook timeout (10 s by default): a hung read becomes an
        # error, which gates the pod, instead of a timed-out review the failurePolicy may reject.
        # urllib3 would retry a read timeout three times (4x the timeout), so reads are not retried.
        self._kube = Kube(_without_read_retries(api_client), request_timeout=request_timeout)
        self._driver = driver
        self._classes: TtlCache[bool | None] = TtlCache(class_ttl)
        self._templates: TtlCache[tuple[RequestRef, ...] | None] = TtlCache(class_ttl)

    def _get(self, path: str, name: str = "", *, cached: bool = False) -> dict[str, Any] | None:
        """GET ``path`` (ending in ``name``); None when it does not exist.

        Mutating admission runs before the API server validates the pod, so a claim or template
        name in it may be anything ("../../secrets/x", "a/status"): a name that is not a DNS
        subdomain names no object, and is never put into a request path.

        ``cached``: from the API server's watch cache first (``resourceVersion=0``), from etcd
        only when the cache does not have it (yet).
        """
        if name and not _OBJECT_NAME.match(name):
            return None
        if cached:
            try:
                found: dict[str, Any] = self._kube.request("GET", path, query=WATCH_CACHE)
                return found
            except KubeError as err:
                if not err.not_found:
                    raise
        try:
            result: dict[str, Any] = self._kube.request("GET", path)
        except KubeError as err:
            if err.not_found:
                return None
            raise
        return result

    def claim_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        obj = self._get(
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaims/{name}",
            name,
            cached=True,
        )
        return None if obj is None else claim_request_refs(obj)

    def template_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        path = (
            f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/namespaces/{namespace}/resourceclaimtemplates/{name}"
        )

        def load() -> tuple[RequestRef, ...] | None:
            obj = self._get(path, name, cached=True)
            return None if obj is None else template_request_refs(obj)

        return self._templates.get(f"{namespace}/{name}", load)

    def is_our_class(self, name: str) -> bool | None:
        def load() -> bool | None:
            obj = self._get(f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/deviceclasses/{name}", name)
            return None if obj is None else is_driver_class(obj, self._driver)

        return self._classes.get(name, load)


#: A GET served from the API server's watch cache (any version it holds) instead of etcd.
WATCH_CACHE = {"resourceVersion": "0"}
#: A path segment the webhook may request: an API group/version or an object name (DNS subdomain).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _without_read_retries(api_client: Any) -> Any:
    """A client like ``api_client`` whose requests retry a failed connection once but never a read."""
    from kubernetes import client
    from urllib3.util.retry import Retry

    configuration = copy.copy(api_client.configuration)
    configuration.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
    return client.ApiClient(configuration)
