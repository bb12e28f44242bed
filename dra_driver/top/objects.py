"""API objects -> typed records: the only place ``top`` reads raw ResourceSlice/Claim/Pod dicts.

Everything after this module works on the frozen dataclasses below, so a field missing from an
object (an older plugin without the ``isolation`` attribute, a claim allocated by someone else
without ``consumedCapacity``) is decided once, here, and never re-guessed by the report or the
renderers. Objects are read as the API server sends them (plain JSON, not the client's models),
because the generated models of older clients drop newer fields (``consumedCapacity``,
``shareID``, device taints).

Rules, the same ones the controller's ledger and the kubelet plugin apply:

* only the newest ``pool.generation`` of each (node, pool) counts: older slices are being replaced;
* a result with a ``shareID`` and ``consumedCapacity`` takes what it lists (missing amounts count
  as 0 memory, 0 cores, 1 slot, as in the ledger); a result without either takes the whole card;
  ``adminAccess`` results take nothing (they are shown, not counted);
* a quantity is rounded up to a whole number (our request policies only allow whole steps);
* a pod is pending for our controller when it carries our scheduling gate or our condition
  (``gpu.hami.io/Allocated``) with status ``False``; its reason is the condition's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import CORES, GATE_NAME, ISOLATION_ATTRIBUTE, MEMORY, SLOTS
from dra_driver.controller.reconciler import CONDITION_TYPE
from dra_driver.quantity import QuantityError, parse_quantity

Obj = Mapping[str, Any]

#: Shown when a device does not publish the ``isolation`` attribute (a plugin older than it).
ISOLATION_UNKNOWN = "unknown"
#: Pending reason of a gated pod our controller has not written a condition for yet.
AWAITING_CONTROLLER = "AwaitingController"
_DEVICE_INDEX = re.compile(r"^gpu-(\d+)$")


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


def _quantity(value: Any) -> int | None:
    """A quantity rounded up to a whole number; None when absent or unparsable."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return math.ceil(parse_quantity(value if isinstance(value, int) else str(value)))
    except QuantityError:
        return None


def _attribute(attributes: Obj, name: str) -> Any:
    value = attributes.get(name)
    if isinstance(value, Mapping):
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return value[kind]
    return None


def _device(node: str, pool: str, entry: Obj) -> PublishedDevice:
    name = str(entry.get("name", ""))
    attributes: Obj = entry.get("attributes") or {}
    capacity: Obj = entry.get("capacity") or {}
    index = _attribute(attributes, "index")
    if not isinstance(index, int) or isinstance(index, bool):
        match = _DEVICE_INDEX.match(name)
        index = int(match.group(1)) if match else None
    healthy = _attribute(attributes, "healthy")
    isolation = _attribute(attributes, ISOLATION_ATTRIBUTE)

    def amount(key: str) -> int:
        return _quantity((capacity.get(key) or {}).get("value")) or 0

    return PublishedDevice(
        node=node,
        pool=pool,
        name=name,
        index=index,
        uuid=str(_attribute(attributes, "uuid") or ""),
        product_name=str(_attribute(attributes, "productName") or ""),
        isolation=str(isolation) if isolation else ISOLATION_UNKNOWN,
        healthy=healthy if isinstance(healthy, bool) else None,
        taints=tuple(
            DeviceTaint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in entry.get("taints") or ()
        ),
        memory=amount(MEMORY),
        cores=amount(CORES),
        slots=amount(SLOTS),
    )


def parse_slices(slices: Iterable[Obj], driver: str) -> list[PublishedDevice]:
    """Our driver's devices, from the newest generation of each (node, pool), in slice order."""
    newest: dict[tuple[str, str], int] = {}
    ours: list[tuple[tuple[str, str], int, Obj]] = []
    for item in slices:
        spec: Obj = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool: Obj = spec.get("pool") or {}
        key = (str(spec.get("nodeName") or ""), str(pool.get("name", "")))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(generation, newest.get(key, generation))
        ours.append((key, generation, spec))
    return [
        _device(key[0], key[1], entry)
        for key, generation, spec in ours
        if generation == newest[key]
        for entry in spec.get("devices") or ()
    ]


def _result(entry: Obj) -> AllocatedResult:
    consumed: Obj | None = entry.get("consumedCapacity")
    share_id = str(entry["shareID"]) if entry.get("shareID") else None
    admin = bool(entry.get("adminAccess"))
    memory = cores = slots = None
    if share_id is not None and consumed is not None and not admin:
        memory = _quantity(consumed.get(MEMORY)) or 0
        cores = _quantity(consumed.get(CORES)) or 0
        slots = _quantity(consumed.get(SLOTS)) or 1
    return AllocatedResult(
        request=str(entry.get("request", "")),
        pool=str(entry.get("pool", "")),
        device=str(entry.get("device", "")),
        share_id=share_id,
        admin_access=admin,
        memory=memory,
        cores=cores,
        slots=slots,
    )


def parse_claim(claim: Obj, driver: str) -> AllocatedClaim | None:
    """The claim's allocation for our driver; None when it has no result of ours."""
    status: Obj = claim.get("status") or {}
    allocation: Obj = status.get("allocation") or {}
    results = tuple(
        _result(entry)
        for entry in (allocation.get("devices") or {}).get("results") or ()
        if entry.get("driver") == driver
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
