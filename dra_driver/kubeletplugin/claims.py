"""ResourceClaims as the kubelet plugin sees them: read through the API, reduced to our results.

kubelet sends only (namespace, name, uid); the allocation must be read from the API server. We
read the raw JSON rather than the client's model objects: it is several times faster on the hot
prepare path and keeps field names exactly as in the API (``consumedCapacity``, ``shareID``),
which is what the rest of the plugin works with. The read goes straight on the client's connection
pool with its auth and TLS (dra_driver/kube/transport.py), not through the generated
``read_namespaced_resource_claim``, whose argument validation (pydantic) and response wrapping
were a tenth of the plugin's CPU per prepare for a call whose arguments we build ourselves.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from dra_driver.kube.transport import RestTransport
from dra_driver.quantity import QuantityError, parse_bytes
from dra_driver.resource.capacity import Consumption, consumption
from dra_driver.resource.refs import allocation_results


class ClaimError(Exception):
    """A claim cannot be prepared on this node; the message goes back to kubelet verbatim."""


class ClaimNotFound(ClaimError):
    """The claim no longer exists in the API server."""


@dataclass(frozen=True)
class ClaimRef:
    """What kubelet sends for a claim."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def problem(self) -> str | None:
        """Why kubelet could not have sent this reference (None when it is well formed).

        Every path the plugin builds for a claim (CDI spec, HAMi-core directory) comes from the
        UID, so a UID that is not a Kubernetes UID (empty, ``..``, a path) is refused before any
        file is touched; name and namespace must be what the API server accepts.
        """
        if not is_kubernetes_uid(self.uid):
            return f"uid {self.uid[:64]!r} is not a Kubernetes UID"
        if not (len(self.namespace) <= 63 and _DNS_LABEL.fullmatch(self.namespace)):
            return f"namespace {self.namespace[:64]!r} is not a valid namespace name"
        if not (len(self.name) <= 253 and _DNS_SUBDOMAIN.fullmatch(self.name)):
            return f"name {self.name[:64]!r} is not a valid ResourceClaim name"
        return None


_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_kubernetes_uid(uid: str) -> bool:
    """A UID as kube-apiserver assigns them (a UUID), hence safe as one path component."""
    return bool(_UID.fullmatch(uid))


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of our driver in our pool."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    consumed: dict[str, int] = field(default_factory=dict)
    admin_access: bool = False

    @property
    def base_request(self) -> str:
        """``req/sub`` (prioritised list) -> ``req``: kubelet matches containers on base names."""
        return self.request.split("/", 1)[0]

    @functools.cached_property
    def consumption(self) -> Consumption:
        """What the result takes of its GPU (``dra_driver/resource/capacity.py``'s rule).

        Cached: the capacity check sums it over every prepared entry on each prepare, and
        parsing the quantities was a tenth of the plugin's CPU per prepare.
        """
        return consumption(self.share_id, self.consumed, admin_access=self.admin_access)

    @property
    def exclusive(self) -> bool:
        """A result without shareID takes the whole device (consumable-capacity semantics)."""
        return self.consumption.whole_device

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"request": self.request, "pool": self.pool, "device": self.device}
        if self.share_id is not None:
            data["shareID"] = self.share_id
        if self.consumed:
            data["consumed"] = dict(self.consumed)
        if self.admin_access:
            data["adminAccess"] = True
        return data


def devices_for_node(claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str) -> list[AllocatedDevice]:
    """Our driver's allocation results in our pool, after the checks the Go helper does.

    Raises ClaimError when the claim was replaced (UID differs), is not allocated, or was
    allocated to our driver on another node: preparing it here would hand out devices that this
    node does not own.
    """
    metadata = claim.get("metadata") or {}
    if metadata.get("uid") != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {metadata.get('uid')!r}, kubelet asked for {ref.uid!r}: "
            "the claim was deleted and re-created"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    ours = [r for r in allocation_results(allocation) if r.device.driver == driver]
    if not ours:
        raise ClaimError(f"ResourceClaim {ref} has no devices allocated by driver {driver}")
    elsewhere = sorted({r.device.pool for r in ours if r.device.pool != pool})
    if elsewhere:
        raise ClaimError(
            f"ResourceClaim {ref} is allocated to pool(s) {', '.join(elsewhere)} of driver {driver}, "
            f"not to this node's pool {pool}"
        )
    devices = []
    for result in ours:
        consumed: dict[str, int] = {}
        for name, quantity in (result.raw.get("consumedCapacity") or {}).items():
            try:
                consumed[str(name)] = parse_bytes(quantity)
            except QuantityError as err:
                raise ClaimError(f"ResourceClaim {ref}: consumedCapacity {name}: {err}") from err
        devices.append(
            AllocatedDevice(
                request=result.request,
                pool=pool,
                device=result.device.device,
                share_id=result.raw.get("shareID") or None,
                consumed=consumed,
                admin_access=result.admin_access,
            )
        )
    return devices


class ClaimSource(Protocol):
    """Where claims come from (the API server in production and in the sandbox tests).

    Reads one claim at a time: the plugin's ServiceAccount may ``get`` ResourceClaims, not list
    them (a node has no business seeing every tenant's claims).
    """

    def get(self, ref: ClaimRef) -> dict[str, Any]: ...

    def exists(self, namespace: str, name: str, uid: str) -> bool: ...


#: Connections kept to the API server: kubelet prepares claims of several pods concurrently, and
#: the client's default (5 per CPU) would make a 1-CPU node open and drop connections (a new TLS
#: handshake each, and "Connection pool is full" warnings) beyond 5 concurrent calls.
MIN_POOL_SIZE = 16


class ApiClaimSource:
    """Reads claims through the real ``kubernetes`` client (resource.k8s.io/v1)."""

    def __init__(self, api_client: Any) -> None:
        self._transport = RestTransport(api_client)
        pool_kw = getattr(api_client.rest_client.pool_manager, "connection_pool_kw", None)
        if isinstance(pool_kw, dict) and int(pool_kw.get("maxsize") or 1) < MIN_POOL_SIZE:
            # Read when urllib3 creates a host's pool: the plugin builds us before its first request.
            pool_kw["maxsize"] = MIN_POOL_SIZE

    def get(self, ref: ClaimRef) -> dict[str, Any]:
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{quote(ref.namespace, safe='')}"
            f"/resourceclaims/{quote(ref.name, safe='')}"
        )
        try:
            response = self._transport.request("GET", path, timeout=20)
            status, reason, body = int(response.status), response.reason, response.data
        except Exception as err:  # urllib3 connection errors and the like
            raise ClaimError(f"reading ResourceClaim {ref}: {err}") from err
        if status == 404:
            raise ClaimNotFound(f"ResourceClaim {ref} not found")
        if not 200 <= status <= 299:
            raise ClaimError(f"reading ResourceClaim {ref}: HTTP {status} {reason or ''}".strip())
        try:
            data = json.loads(body)
        except ValueError as err:
            raise ClaimError(f"reading ResourceClaim {ref}: the answer is not JSON: {err}") from err
        if not isinstance(data, dict):
            raise ClaimError(f"reading ResourceClaim {ref}: the answer is not a JSON object")
        return data

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        """False only when the API says so (404 or another UID); API errors raise ClaimError."""
        try:
            claim = self.get(ClaimRef(namespace, name, uid))
        except ClaimNotFound:
            return False
        return bool((claim.get("metadata") or {}).get("uid") == uid)
