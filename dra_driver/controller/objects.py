"""Typed views of the Pods, ResourceClaims and DeviceClasses the controller decides on, parsed once.

Like kopf's typed bodies, a view *is* the object the API sent (a read-only ``Mapping`` over it,
so a write starts from ``dict(view)`` and the informer's copy is never mutated) with the fields
the reconciler branches on parsed into attributes once: keys, UIDs, resourceVersions,
finalizers, gates, claim references, CPU/memory requests, allocation, reservations and the
device uses an allocation records. A view is made where an object enters the controller: an
informer event (``Controller._drain``) or the object a write returned; past that boundary the
reconciler reads attributes, not ``metadata``/``spec``/``status`` dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dra_driver.config.classes import is_driver_class
from dra_driver.contract import FINALIZER, GATE_NAME
from dra_driver.controller.ledger import Use, claim_uses, request_classes
from dra_driver.controller.pods import pod_active, pod_claim_names, pod_requests

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def _version(value: str) -> int | None:
    return int(value) if value.isdigit() else None


class ObjectView(Mapping[str, Any]):
    """Identity and metadata of any object; the raw object stays readable as a mapping."""

    __slots__ = (
        "annotations",
        "created",
        "deleting",
        "key",
        "name",
        "namespace",
        "raw",
        "resource_version",
        "uid",
    )

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        meta = raw.get("metadata") or {}
        self.namespace = str(meta.get("namespace") or "")
        self.name = str(meta.get("name") or "")
        self.key = f"{self.namespace}/{self.name}"
        self.uid = str(meta.get("uid") or "")
        self.resource_version = str(meta.get("resourceVersion") or "")
        self.created = str(meta.get("creationTimestamp") or "")
        self.deleting = bool(meta.get("deletionTimestamp"))
        self.annotations: Mapping[str, str] = meta.get("annotations") or {}

    def newer_than(self, other: ObjectView) -> bool:
        """Whether this copy is strictly newer than ``other`` (etcd's numeric resourceVersions;
        opaque ones never compare as newer)."""
        mine, theirs = _version(self.resource_version), _version(other.resource_version)
        return mine is not None and theirs is not None and mine > theirs

    def at_least(self, other: ObjectView) -> bool:
        """Whether this copy is as new as ``other`` or newer (opaque versions: only when equal)."""
        mine, theirs = _version(self.resource_version), _version(other.resource_version)
        if mine is not None and theirs is not None:
            return mine >= theirs
        return self.resource_version == other.resource_version

    def __getitem__(self, item: str) -> Any:
        return self.raw[item]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key}@{self.resource_version})"


class PodView(ObjectView):
    """A Pod: where it is bound, whether our gate holds it, and which claims it names."""

    __slots__ = ("active", "bound_to", "claim_keys", "claim_names", "gated", "other_gates", "requests")

    def __init__(self, raw: Mapping[str, Any]) -> None:
        super().__init__(raw)
        spec = raw.get("spec") or {}
        self.bound_to = str(spec.get("nodeName") or "")
        gates = [str(gate.get("name")) for gate in spec.get("schedulingGates") or ()]
        #: Our gate is on the pod: the controller still has to place it.
        self.gated = GATE_NAME in gates
        #: Any gate at all (ours or another component's): kube-scheduler does not look at it yet.
        self.other_gates = bool(gates)
        self.active = pod_active(raw)
        #: (pod claim name, ResourceClaim name, or None while its template claim is not created).
        self.claim_names: tuple[tuple[str, str | None], ...] = tuple(pod_claim_names(raw))
        self.claim_keys: tuple[str, ...] = tuple(
            f"{self.namespace}/{name}" for _, name in self.claim_names if name
        )
        #: Effective CPU/memory requests (``controller/pods.py`` ``pod_requests``).
        self.requests: Mapping[str, float] = pod_requests(raw)

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> PodView:
        """``obj`` as a view (itself when it already is one)."""
        return obj if isinstance(obj, PodView) else cls(obj)


def bound_requests_by_node(pods: Iterable[PodView]) -> dict[str, dict[str, float]]:
    """CPU/memory requested by the active pods bound to each node (what a new pod must fit beside)."""
    totals: dict[str, dict[str, float]] = {}
    for pod in pods:
        if not pod.bound_to or not pod.active:
            continue
        per_node = totals.setdefault(pod.bound_to, {"cpu": 0.0, "memory": 0.0})
        for resource, amount in pod.requests.items():
            per_node[resource] += amount
    return totals


class ClaimView(ObjectView):
    """A ResourceClaim: our finalizer, its allocation and reservations, what it uses of our GPUs."""

    __slots__ = (
        "allocation",
        "finalizers",
        "owner_uids",
        "owners",
        "request_classes",
        "reserved_uids",
        "uses",
    )

    def __init__(self, raw: Mapping[str, Any], driver: str) -> None:
        super().__init__(raw)
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        self.finalizers: tuple[str, ...] = tuple(str(item) for item in meta.get("finalizers") or ())
        self.allocation: Mapping[str, Any] | None = status.get("allocation") or None
        self.reserved_uids: tuple[str, ...] = tuple(
            str(entry.get("uid")) for entry in status.get("reservedFor") or ()
        )
        owners = meta.get("ownerReferences") or ()
        self.owner_uids: tuple[str, ...] = tuple(str(owner.get("uid")) for owner in owners)
        pod_claim = self.annotations.get(POD_CLAIM_ANNOTATION)
        #: (owner pod uid, pod claim name) of a claim generated from a pod's template.
        self.owners: tuple[tuple[str, str], ...] = (
            tuple((str(owner.get("uid")), str(pod_claim)) for owner in owners if owner.get("kind") == "Pod")
            if pod_claim
            else ()
        )
        #: Request name -> DeviceClass name (``gpu/small`` for a firstAvailable entry).
        self.request_classes: Mapping[str, str] = request_classes(raw)
        #: What the allocation takes from our driver's devices (none while unallocated).
        self.uses: tuple[Use, ...] = claim_uses(raw, driver)

    @classmethod
    def parse(cls, obj: Mapping[str, Any], driver: str) -> ClaimView:
        """``obj`` as a view (itself when it already is one)."""
        return obj if isinstance(obj, ClaimView) else cls(obj, driver)

    @property
    def ours(self) -> bool:
        """Carries our finalizer: we allocated it (or are about to) and must release it."""
        return FINALIZER in self.finalizers

    @property
    def reserved(self) -> bool:
        return bool(self.reserved_uids)


class DeviceClassView(ObjectView):
    """A DeviceClass: whether it is one of ours (its name, config or selectors name our driver).

    Its selectors and config stay in the mapping: the planner's Matcher and config resolution read
    them from there (``controller/requests.py``, ``dra_driver/config``).
    """

    __slots__ = ("ours",)

    def __init__(self, raw: Mapping[str, Any], driver: str) -> None:
        super().__init__(raw)
        self.ours = is_driver_class(raw, driver)
