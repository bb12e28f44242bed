"""Typed views of the Pods, ResourceClaims and DeviceClasses the controller decides on, parsed once.

Like kopf's typed bodies, a view *is* the object the API sent (a read-only ``Mapping`` over it,
so a write starts from ``dict(view)`` and the informer's copy is never mutated) with the fields
the controller branches on parsed into attributes once: keys, UIDs, resourceVersions,
finalizers, gates, claim references, CPU/memory requests, where the pod may run, allocation,
reservations, configs, constraints and the device uses an allocation records. A view is made where
an object enters the controller: an informer event (``ClusterCache.apply_event``) or the object a
write returned; past that boundary the controller reads attributes, not
``metadata``/``spec``/``status`` dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

from dra_driver.config.classes import is_driver_class, is_mig_class
from dra_driver.contract import ALLOCATED_CONDITION, FINALIZER, GATE_NAME
from dra_driver.kube.api import Obj, ObjView
from dra_driver.resource.constraints import DeviceConstraint, parse_constraints
from dra_driver.resource.nodes import quantity_or_zero
from dra_driver.resource.refs import (
    AllocationResult,
    ContainerView,
    PodClaimEntry,
    RequestRef,
    allocation_results,
    container_view,
    pod_claim_entries,
    request_refs,
)
from dra_driver.resource.uses import Use, uses_of

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
TERMINAL_PHASES = ("Succeeded", "Failed")
#: Pod fields that differ between pods of one workload without changing where they fit.
_SHAPE_IGNORED_POD_FIELDS = frozenset({"resourceClaims", "schedulingGates", "hostname", "subdomain"})


#: ``spec.preemptionPolicy``'s default (an unset policy preempts, as kube-scheduler reads it).
PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"


def pod_priority(spec: Mapping[str, Any]) -> int:
    """``spec.priority`` (an int32 the API server validated); 0 when unset, as for a pod no
    PriorityClass applies to. Anything else (a hand-made object) counts as 0 rather than failing
    the pod's every read."""
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _version(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def pod_requests(pod: ObjView) -> dict[str, float]:
    """Effective CPU/memory requests: max(sum of containers, largest init container) + overhead."""
    spec = pod.get("spec") or {}
    totals = {"cpu": 0.0, "memory": 0.0}
    for container in spec.get("containers") or ():
        for name in totals:
            totals[name] += quantity_or_zero(
                ((container.get("resources") or {}).get("requests") or {}).get(name, 0)
            )
    for container in spec.get("initContainers") or ():
        for name in totals:
            init = quantity_or_zero(((container.get("resources") or {}).get("requests") or {}).get(name, 0))
            totals[name] = max(totals[name], init)
    for name in totals:
        totals[name] += quantity_or_zero((spec.get("overhead") or {}).get(name, 0))
    return totals


def pod_active(pod: ObjView) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def pod_claim_names(pod: ObjView) -> list[tuple[str, str | None]]:
    """(pod claim name, ResourceClaim name or None when its template claim does not exist yet)."""
    statuses = {
        entry.get("name"): entry.get("resourceClaimName")
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    names: list[tuple[str, str | None]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("resourceClaimName"):
            names.append((str(entry["name"]), str(entry["resourceClaimName"])))
        else:
            claim = statuses.get(entry.get("name"))
            names.append((str(entry["name"]), str(claim) if claim else None))
    return names


def pinned_node(allocation: ObjView | None) -> str | None:
    """The single node an allocation's nodeSelector pins (our and the scheduler's form), if any."""
    if not allocation:
        return None
    terms: list[Any] = list((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ())
    if len(terms) != 1:
        return None
    for requirement in terms[0].get("matchFields") or ():
        values: list[Any] = list(requirement.get("values") or ())
        if (
            requirement.get("key") == "metadata.name"
            and requirement.get("operator") == "In"
            and len(values) == 1
        ):
            return str(values[0])
    return None


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

    #: The apiVersion and kind of the objects the view reads (a list's items carry neither).
    API_VERSION: ClassVar[str] = "v1"
    KIND: ClassVar[str] = ""

    def reference(self) -> Obj:
        """The object as an Event's ``regarding`` names it: apiVersion, kind, name, namespace, uid."""
        return {
            "apiVersion": str(self.raw.get("apiVersion") or self.API_VERSION),
            "kind": str(self.raw.get("kind") or self.KIND),
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }

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

    KIND = "Pod"

    __slots__ = (
        "active",
        "allocated_condition",
        "bound_to",
        "claim_entries",
        "claim_keys",
        "claim_names",
        "containers",
        "gated",
        "init_containers",
        "node_name",
        "node_selector",
        "other_gates",
        "placement_spec",
        "preemption_policy",
        "priority",
        "requests",
        "required_affinity",
        "tolerations",
    )

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
        #: ``spec.resourceClaims`` as written (a claim's name, or the template it is made from).
        self.claim_entries: tuple[PodClaimEntry, ...] = pod_claim_entries(spec)
        #: ``spec.containers`` in order (the HAMi annotation keeps their places) and init containers.
        self.containers: tuple[ContainerView, ...] = tuple(
            container_view(container) for container in spec.get("containers") or ()
        )
        self.init_containers: tuple[ContainerView, ...] = tuple(
            container_view(container) for container in spec.get("initContainers") or ()
        )
        #: ``spec.priority``: the Priority admission plugin writes its PriorityClass's value there
        #: when the pod is created (the global default class's, or 0, for a pod naming none). The
        #: pod queue plans higher values first (``retries.fair_order``).
        self.priority: int = pod_priority(spec)
        #: ``spec.preemptionPolicy`` as admission resolved it (kube-scheduler reads an unset one as
        #: ``PreemptLowerPriority``): whether this pod may have lower ones preempted for it.
        self.preemption_policy: str = str(spec.get("preemptionPolicy") or PREEMPT_LOWER_PRIORITY)
        #: Effective CPU/memory requests (``pod_requests``).
        self.requests: Mapping[str, float] = pod_requests(raw)
        #: Our condition's status ("True" allocated, "False" pending), None while it has none.
        self.allocated_condition: str | None = next(
            (
                str(condition.get("status"))
                for condition in (raw.get("status") or {}).get("conditions") or ()
                if condition.get("type") == ALLOCATED_CONDITION
            ),
            None,
        )
        # What the node filter reads (``dra_driver/controller/nodefit.py``).
        self.node_name = self.bound_to
        self.node_selector: Mapping[str, str] = {
            str(key): str(value) for key, value in (spec.get("nodeSelector") or {}).items()
        }
        affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        self.required_affinity: ObjView | None = affinity.get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        self.tolerations: tuple[ObjView, ...] = tuple(spec.get("tolerations") or ())
        #: The spec without what differs between pods of one workload without changing where
        #: they fit (names, gates, claims): equal for pods the allocator places alike.
        self.placement_spec: ObjView = {
            key: value for key, value in spec.items() if key not in _SHAPE_IGNORED_POD_FIELDS
        }

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

    API_VERSION = "resource.k8s.io/v1"
    KIND = "ResourceClaim"

    __slots__ = (
        "allocation",
        "config",
        "constraints",
        "finalizers",
        "owner_uids",
        "owners",
        "pinned_node",
        "request_classes",
        "request_refs",
        "reserved_pods",
        "reserved_uids",
        "results",
        "spec",
        "uses",
    )

    def __init__(self, raw: Mapping[str, Any], driver: str) -> None:
        super().__init__(raw)
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        self.finalizers: tuple[str, ...] = tuple(str(item) for item in meta.get("finalizers") or ())
        self.allocation: Mapping[str, Any] | None = status.get("allocation") or None
        #: The node the allocation pins (its ``nodeSelector``'s ``metadata.name``), if any.
        self.pinned_node: str | None = pinned_node(self.allocation)
        #: The claim's spec as written (requests are parsed where they are planned:
        #: ``dra_driver/resource/requests.py``).
        self.spec: ObjView = raw.get("spec") or {}
        devices = self.spec.get("devices") or {}
        #: ``spec.devices.config`` entries (opaque configs, each for some or all requests).
        self.config: tuple[ObjView, ...] = tuple(devices.get("config") or ())
        #: ``spec.devices.constraints``, typed (``matchAttribute`` / ``distinctAttribute`` per requests).
        self.constraints: tuple[DeviceConstraint | None, ...] = parse_constraints(devices.get("constraints"))
        reserved = status.get("reservedFor") or ()
        self.reserved_uids: tuple[str, ...] = tuple(str(entry.get("uid")) for entry in reserved)
        #: (uid, name) of each pod the claim is reserved for.
        self.reserved_pods: tuple[tuple[str, str], ...] = tuple(
            (str(entry.get("uid")), str(entry.get("name") or entry.get("uid")))
            for entry in reserved
            if entry.get("resource") == "pods"
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
        #: Its requests and the DeviceClass each names, for every driver.
        self.request_refs: tuple[RequestRef, ...] = request_refs(self.spec)
        #: Request name -> DeviceClass name (``gpu/small`` for a firstAvailable entry).
        self.request_classes: Mapping[str, str] = {ref.key: ref.class_name for ref in self.request_refs}
        #: The allocation's results, every driver's (none while unallocated).
        self.results: tuple[AllocationResult, ...] = allocation_results(self.allocation)
        #: What the allocation takes from our driver's devices (none while unallocated).
        self.uses: tuple[Use, ...] = uses_of(self.results, driver, self.namespace, self.request_classes)

    @classmethod
    def parse(cls, obj: Mapping[str, Any], driver: str) -> ClaimView:
        """``obj`` as a view (itself when it already is one)."""
        return obj if isinstance(obj, ClaimView) else cls(obj, driver)

    @property
    def ours(self) -> bool:
        """Carries our finalizer: a claim of our classes (given it at admission since issue 35, or
        by the controller before it allocates), whose allocation the controller answers for and
        must release, whoever wrote it."""
        return FINALIZER in self.finalizers

    @property
    def reserved(self) -> bool:
        return bool(self.reserved_uids)


def template_claim(template: Mapping[str, Any], driver: str) -> ClaimView:
    """The claim a ResourceClaimTemplate stamps out (its ``spec.spec``), as a view of its own."""
    spec = (template.get("spec") or {}).get("spec") or {}
    return ClaimView({"metadata": template.get("metadata") or {}, "spec": spec}, driver)


class DeviceClassView(ObjectView):
    """A DeviceClass: whether it is one of ours (its name, config or selectors name our driver).

    Its selectors stay in the mapping: the planner's Matcher reads them with the class's other CEL
    sources (``dra_driver/config/classes.py``, ``dra_driver/controller/eligibility.py``).
    """

    API_VERSION = "resource.k8s.io/v1"
    KIND = "DeviceClass"

    __slots__ = ("config", "extended_resource_name", "mig", "ours")

    def __init__(self, raw: Mapping[str, Any], driver: str) -> None:
        super().__init__(raw)
        self.ours = is_driver_class(raw, driver)
        #: A class of MIG instances (a selector pins ``type == "mig"``): placed by ``engine/mig.py``.
        self.mig = self.ours and is_mig_class(raw, driver)
        spec = raw.get("spec") or {}
        #: ``spec.config``: the class's opaque configs, given to every request of the class.
        self.config: tuple[ObjView, ...] = tuple(spec.get("config") or ())
        #: ``spec.extendedResourceName``: the extended resource (``nvidia.com/gpu``) kube-scheduler
        #: serves through this class; None when it maps none.
        name = spec.get("extendedResourceName")
        self.extended_resource_name: str | None = str(name) if name else None
