"""Who names what: a claim's requests and the DeviceClasses they name, a pod's containers and the
claims they consume, an allocation's results. Parsed once, read by the controller and the webhook.

These are the references between objects, not what the requests ask of a device (that is
``requests.py``, for our classes only): the webhook and the controller's HAMi-core rules
(``dra_driver/controller/containers.py``) need them for every driver's classes, the typed claim
(``objects.ClaimView``) keys its request -> class map by them, and the HAMi annotation and the
device uses (``uses.py``) read the allocation results here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import LIMITED_CAPACITIES, DeviceId
from dra_driver.kube.api import ObjView


@dataclass(frozen=True, slots=True)
class RequestRef:
    """One request of a claim (``exactly``), or one ``firstAvailable`` alternative of it."""

    request: str
    #: The alternative's name in ``firstAvailable``; None for an ``exactly`` request.
    alternative: str | None
    class_name: str
    #: The capacity names the request asks for (``capacity.requests`` keys).
    capacity_names: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        """The name allocation results carry: ``gpu``, or ``gpu/small`` for an alternative."""
        return self.request if self.alternative is None else f"{self.request}/{self.alternative}"

    @property
    def asks_limits(self) -> bool:
        """Asks for memory/cores: HAMi-core limits apply to its GPUs (when the class is ours)."""
        return not self.capacity_names.isdisjoint(LIMITED_CAPACITIES)


def _ref(request: str, alternative: str | None, body: ObjView) -> RequestRef:
    requested = (body.get("capacity") or {}).get("requests") or {}
    names = frozenset(str(name) for name in requested)
    return RequestRef(request, alternative, str(body.get("deviceClassName") or ""), names)


def request_refs(claim_spec: ObjView) -> tuple[RequestRef, ...]:
    """The requests of a ResourceClaim's ``spec`` (or a template's ``spec.spec``), in order."""
    refs = []
    for request in (claim_spec.get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly"):
            refs.append(_ref(name, None, request["exactly"]))
        for body in request.get("firstAvailable") or ():
            refs.append(_ref(name, str(body.get("name", "")), body))
    return tuple(refs)


def claim_request_refs(claim: ObjView) -> tuple[RequestRef, ...]:
    """The requests of a ResourceClaim."""
    return request_refs(claim.get("spec") or {})


def template_request_refs(template: ObjView) -> tuple[RequestRef, ...]:
    """The requests of the claims a ResourceClaimTemplate stamps out (its ``spec.spec``)."""
    return request_refs((template.get("spec") or {}).get("spec") or {})


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One ``resources.claims`` entry of a container: a pod claim, all of it or one request."""

    name: str
    request: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerView:
    """A container's name, the pod claims it consumes and the extended-resource GPUs it asks for."""

    name: str
    claims: tuple[ClaimRef, ...]
    #: ``*/gpu`` names in its limits or requests (a device plugin's GPU, e.g. ``nvidia.com/gpu``).
    extended_gpus: tuple[str, ...] = ()


def container_view(container: ObjView) -> ContainerView:
    resources = container.get("resources") or {}
    refs = tuple(
        ClaimRef(str(ref.get("name", "")), str(ref["request"]) if ref.get("request") else None)
        for ref in resources.get("claims") or ()
    )
    names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    gpus = tuple(sorted(str(name) for name in names if str(name).endswith("/gpu")))
    return ContainerView(str(container.get("name", "?")), refs, gpus)


@dataclass(frozen=True, slots=True)
class PodClaimEntry:
    """One ``spec.resourceClaims`` entry: a claim by name, or one made from a template."""

    name: str
    claim: str | None = None
    template: str | None = None


def pod_claim_entries(pod_spec: ObjView) -> tuple[PodClaimEntry, ...]:
    return tuple(
        PodClaimEntry(
            str(entry.get("name", "")),
            str(entry["resourceClaimName"]) if entry.get("resourceClaimName") else None,
            str(entry["resourceClaimTemplateName"]) if entry.get("resourceClaimTemplateName") else None,
        )
        for entry in pod_spec.get("resourceClaims") or ()
    )


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """One ``status.allocation.devices.results[]`` entry; ``raw`` is the entry as written."""

    request: str
    device: DeviceId
    admin_access: bool
    raw: Mapping[str, Any]

    def for_request(self, request: str | None) -> bool:
        """Whether a container consuming ``request`` (None: the whole claim) gets this device."""
        return request is None or self.request == request or self.request.split("/", 1)[0] == request


def allocation_results(allocation: ObjView | None) -> tuple[AllocationResult, ...]:
    """The results of a claim's ``status.allocation`` (none while unallocated), in order."""
    return tuple(
        AllocationResult(
            str(result.get("request", "")),
            DeviceId(*(str(result.get(key, "")) for key in ("driver", "pool", "device"))),
            bool(result.get("adminAccess")),
            result,
        )
        for result in ((allocation or {}).get("devices") or {}).get("results") or ()
    )
