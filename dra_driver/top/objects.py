"""API objects -> typed records: the only place ``top`` reads raw ResourceSlice/Claim/Pod dicts.

Everything after this module works on the frozen dataclasses below, so a field missing from an
object (an older plugin without the ``isolation`` attribute, a claim allocated by someone else
without ``consumedCapacity``) is decided once, here, and never re-guessed by the report or the
renderers. Objects are read as the API server sends them (plain JSON, not the client's models),
because the generated models of older clients drop newer fields (``consumedCapacity``,
``shareID``, device taints).

Rules, the same code the controller's inventory and ledger and the kubelet plugin run:

* which slices count and how a device reads: ``dra_driver/resource/slices.py`` (each pool's newest
  ``generation``, only when complete, of the node that owns it: older slices are being replaced);
* what a result takes: ``dra_driver/resource/capacity.py`` (a result with a ``shareID`` takes its
  ``consumedCapacity``, rounded up, missing amounts counting as 0 memory, 0 cores, 1 slot; a
  result without one takes the whole card; ``adminAccess`` results take nothing: they are shown,
  not counted);
* a pod is pending for our controller when it carries our scheduling gate or our condition
  (``gpu.hami.io/Allocated``) with status ``False``; its reason is the condition's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import ALLOCATED_CONDITION as CONDITION_TYPE
from dra_driver.contract import GATE_NAME
from dra_driver.resource.capacity import result_consumption
from dra_driver.resource.refs import AllocationResult, allocation_results
from dra_driver.resource.slices import (
    MIG_ON_DEMAND_ATTRIBUTE,
    MIG_PROFILE_ATTRIBUTE,
    MIG_TYPE,
    TYPE_ATTRIBUTE,
    SliceDevice,
    attribute,
    current_devices,
)

Obj = Mapping[str, Any]

#: Shown when a device does not publish the ``isolation`` attribute (a plugin older than it).
ISOLATION_UNKNOWN = "unknown"
#: Pending reason of a gated pod our controller has not written a condition for yet.
AWAITING_CONTROLLER = "AwaitingController"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One GPU as its node's ResourceSlice publishes it (capacities in bytes, percent, tenants)."""

    node: str
    pool: str
    name: str
    index: int | None
    uuid: str
    product_name: str
    isolation: str
    #: The ``healthy`` attribute; None when the device does not publish it.
    healthy: bool | None
    taints: tuple[DeviceTaint, ...]
    memory: int
    cores: int
    slots: int
    #: The ``healthMonitored`` attribute (False: nothing watches its health); None when not published.
    health_monitored: bool | None = None
    #: A MIG instance (``type: mig``): its CUDA profile and its card's published name (``gpu-1``).
    mig_profile: str | None = None
    mig_parent: str | None = None
    #: A possible placement of MIG on demand (``onDemand``): an instance only once allocated.
    mig_on_demand: bool = False


@dataclass(frozen=True, slots=True)
class AllocatedResult:
    """One ``status.allocation.devices.results[]`` entry of our driver."""

    request: str
    pool: str
    device: str
    share_id: str | None
    admin_access: bool
    #: None for all three: the result takes the whole card.
    memory: int | None
    cores: int | None
    slots: int | None

    @property
    def whole_card(self) -> bool:
        return not self.admin_access and self.memory is None


@dataclass(frozen=True, slots=True)
class AllocatedClaim:
    """An allocated ResourceClaim with at least one result of our driver."""

    namespace: str
    name: str
    #: Pods in ``status.reservedFor`` (names, in the claim's namespace).
    reserved_for: tuple[str, ...]
    #: Pods owning the claim (a claim generated from a pod's template, before it is reserved).
    owner_pods: tuple[str, ...]
    results: tuple[AllocatedResult, ...]


@dataclass(frozen=True, slots=True)
class ControllerCondition:
    """Our controller's condition on a pod."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class PodRecord:
    namespace: str
    name: str
    phase: str
    node_name: str
    gated: bool
    condition: ControllerCondition | None
    #: Names of the ResourceClaims the pod uses (direct references and generated ones).
    claims: tuple[str, ...]
    deleting: bool

    @property
    def pending_reason(self) -> str | None:
        """Why our controller holds the pod, or None when it does not."""
        if self.phase in ("Succeeded", "Failed") or self.deleting:
            return None
        if self.condition is not None and self.condition.status == "False":
            return self.condition.reason or "Unknown"
        if self.gated and self.condition is None:
            return AWAITING_CONTROLLER
        return None


def _device(node: str, pool: str, device: SliceDevice) -> PublishedDevice:
    attributes: Obj = device.entry.get("attributes") or {}
    mig = attribute(attributes, TYPE_ATTRIBUTE) == MIG_TYPE
    profile = attribute(attributes, MIG_PROFILE_ATTRIBUTE) if mig else None
    return PublishedDevice(
        node=node,
        pool=pool,
        name=device.name,
        index=device.index,
        uuid=device.uuid or "",
        product_name=device.product_name or "",
        isolation=device.isolation or ISOLATION_UNKNOWN,
        healthy=device.healthy,
        taints=tuple(
            DeviceTaint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in device.taints
        ),
        memory=device.memory or 0,
        cores=device.cores or 0,
        slots=device.slots or 0,
        health_monitored=device.health_monitored,
        mig_profile=str(profile) if mig and profile else None,
        mig_parent=device.name.split("-mig-", 1)[0] if mig else None,
        mig_on_demand=mig and attribute(attributes, MIG_ON_DEMAND_ATTRIBUTE) is True,
    )


def parse_slices(slices: Iterable[Obj], driver: str) -> list[PublishedDevice]:
    """Our driver's devices, from the current slices of each pool (as the controller sees them)."""
    return [_device(node, pool, device) for node, pool, device in current_devices(slices, driver)]


def _result(result: AllocationResult) -> AllocatedResult:
    """One result of ours, as the typed model reads it, with what it takes of its card."""
    taken = result_consumption(result.raw)
    whole = taken.whole_device
    share_id = result.raw.get("shareID")
    return AllocatedResult(
        request=result.request,
        pool=result.device.pool,
        device=result.device.device,
        share_id=str(share_id) if share_id else None,
        admin_access=result.admin_access,
        memory=None if whole else taken.memory,
        cores=None if whole else taken.cores,
        slots=None if whole else taken.slots,
    )


def parse_claim(claim: Obj, driver: str) -> AllocatedClaim | None:
    """The claim's allocation for our driver; None when it has no result of ours.

    The one walk of a claim: its results are read by the typed model's parser
    (``dra_driver/resource/refs.py``); reservations and owners here, because ``top`` counts only
    core-group pods (``ClaimView`` keeps every pod reservation and only template owners).
    """
    status: Obj = claim.get("status") or {}
    results = tuple(
        _result(result)
        for result in allocation_results(status.get("allocation"))
        if result.device.driver == driver
    )
    if not results:
        return None
    meta: Obj = claim.get("metadata") or {}
    return AllocatedClaim(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        reserved_for=tuple(
            str(ref.get("name", ""))
            for ref in status.get("reservedFor") or ()
            if ref.get("resource") == "pods" and not ref.get("apiGroup")
        ),
        owner_pods=tuple(
            str(ref.get("name", ""))
            for ref in meta.get("ownerReferences") or ()
            if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1"
        ),
        results=results,
    )


def parse_pod(pod: Obj) -> PodRecord:
    """The one walk of a pod. Not the typed ``PodView``: ``top`` reads thousands of pods and needs
    none of the placement fields that view parses (requests, affinity, tolerations), but it does
    need the phase and the condition's reason and message, which the view does not keep."""
    meta: Obj = pod.get("metadata") or {}
    spec: Obj = pod.get("spec") or {}
    status: Obj = pod.get("status") or {}
    condition = next(
        (
            ControllerCondition(
                str(entry.get("status", "")), str(entry.get("reason") or ""), str(entry.get("message") or "")
            )
            for entry in status.get("conditions") or ()
            if entry.get("type") == CONDITION_TYPE
        ),
        None,
    )
    claims = [
        str(entry["resourceClaimName"])
        for entry in (*(spec.get("resourceClaims") or ()), *(status.get("resourceClaimStatuses") or ()))
        if entry.get("resourceClaimName")
    ]
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        phase=str(status.get("phase") or "Pending"),
        node_name=str(spec.get("nodeName") or ""),
        gated=any(gate.get("name") == GATE_NAME for gate in spec.get("schedulingGates") or ()),
        condition=condition,
        claims=tuple(dict.fromkeys(claims)),
        deleting=bool(meta.get("deletionTimestamp")),
    )
