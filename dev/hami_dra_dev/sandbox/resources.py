"""The resource types the sandbox API server serves, described once.

Everything that differs between resources (URL name, kind, scope, status subresource, which field
selectors Kubernetes supports, short names for kubectl) lives in one table here, so the HTTP layer,
discovery, validation and the store all agree and adding a resource is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dra_driver.kube.events import V1_FIELD_LABELS, core_from_v1, v1_from_core
from dra_driver.quota import crd as gpu_quota_crd

#: Field selectors every resource supports (apimachinery's Default{Cluster,Namespace}ScopedAttr).
COMMON_FIELDS: tuple[str, ...] = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    """One REST resource (e.g. ``resource.k8s.io/v1 resourceclaims``)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    #: Extra field-selector labels beyond metadata.name/namespace, as the real API server supports them.
    fields: tuple[str, ...] = ()
    #: ``spec`` (or equivalent) may never change after creation.
    immutable_spec: bool = False
    #: the status subresource clears status on create (strategy.PrepareForCreate resets it).
    reset_status_on_create: bool = False
    verbs: tuple[str, ...] = field(
        default=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    )
    #: A custom resource's ``openAPIV3Schema`` (validated by :mod:`structural`); None: built-in.
    crd_schema: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    #: A custom resource's ``additionalPrinterColumns`` (``kubectl get`` columns).
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), hash=False, compare=False)
    #: The store key of the resource whose objects this one shows in another shape (the API
    #: server's conversion: ``events.k8s.io/v1`` events are core/v1 events); "" for its own.
    storage: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Store key: ``<plural>.<group>`` (``pods`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """How Kubernetes names the kind in error messages: ``ResourceClaim.resource.k8s.io``, ``Pod``."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def qualified_resource(self) -> str:
        """How Kubernetes names the resource in error messages: ``resourceclaims.resource.k8s.io``."""
        return self.key

    @property
    def storage_key(self) -> str:
        """Where the objects live in the store (the viewed resource's key for a view)."""
        return self.storage or self.key

    @property
    def returns_deleted_object(self) -> bool:
        """DELETE answers with the object (the registry's ReturnDeletedObject) rather than a Status."""
        return self.group == "resource.k8s.io" or self.key == "pods"

    def supports_field(self, label: str) -> bool:
        return label in COMMON_FIELDS or label in self.fields


CORE = ""
RESOURCE = "resource.k8s.io"
COORDINATION = "coordination.k8s.io"
EVENTS_GROUP = "events.k8s.io"
ADMISSION = "admissionregistration.k8s.io"

RESOURCE_TYPES: tuple[ResourceType, ...] = (
    ResourceType(
        CORE,
        "v1",
        "namespaces",
        "Namespace",
        False,
        has_status=True,
        short_names=("ns",),
        fields=("status.phase",),
    ),
    ResourceType(
        CORE,
        "v1",
        "nodes",
        "Node",
        False,
        has_status=True,
        short_names=("no",),
        fields=("spec.unschedulable",),
    ),
    ResourceType(
        CORE,
        "v1",
        "pods",
        "Pod",
        True,
        has_status=True,
        short_names=("po",),
        categories=("all",),
        fields=(
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    ),
    ResourceType(
        CORE,
        "v1",
        "events",
        "Event",
        True,
        short_names=("ev",),
        fields=(
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
    ),
    # The same Events in the events.k8s.io/v1 shape (note, regarding, series), with that API's
    # field labels (pkg/apis/events/v1/conversion.go); conversions in dra_driver/kube/events.py.
    ResourceType(
        EVENTS_GROUP,
        "v1",
        "events",
        "Event",
        True,
        short_names=("ev",),
        fields=tuple(V1_FIELD_LABELS),
        storage="events",
    ),
    ResourceType(RESOURCE, "v1", "deviceclasses", "DeviceClass", False),
    ResourceType(
        RESOURCE, "v1", "resourceslices", "ResourceSlice", False, fields=("spec.nodeName", "spec.driver")
    ),
    ResourceType(
        RESOURCE,
        "v1",
        "resourceclaims",
        "ResourceClaim",
        True,
        has_status=True,
        immutable_spec=True,
        reset_status_on_create=True,
    ),
    ResourceType(
        RESOURCE, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True, immutable_spec=True
    ),
    ResourceType(
        CORE, "v1", "resourcequotas", "ResourceQuota", True, has_status=True, short_names=("quota",)
    ),
    ResourceType(COORDINATION, "v1", "leases", "Lease", True),
    # Our CRD, served from the same definition the chart installs.
    ResourceType(
        gpu_quota_crd.GROUP,
        gpu_quota_crd.VERSION,
        gpu_quota_crd.PLURAL,
        gpu_quota_crd.KIND,
        True,
        has_status=True,
        short_names=gpu_quota_crd.SHORT_NAMES,
        categories=("hami-dra",),
        reset_status_on_create=True,
        crd_schema=gpu_quota_crd.schema(),
        printer_columns=tuple(gpu_quota_crd.manifest()["spec"]["versions"][0]["additionalPrinterColumns"]),
    ),
    ResourceType(
        ADMISSION,
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        categories=("api-extensions",),
    ),
    ResourceType(
        ADMISSION,
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        categories=("api-extensions",),
    ),
)

_BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in RESOURCE_TYPES
}
_BY_KEY: dict[str, ResourceType] = {r.key: r for r in RESOURCE_TYPES}
_BY_KIND: dict[tuple[str, str], ResourceType] = {(r.api_version, r.kind): r for r in RESOURCE_TYPES}


#: For each view (``storage`` set): stored object -> view, view -> stored object.
_CONVERSIONS: dict[
    str, tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[dict[str, Any]], dict[str, Any]]]
] = {
    "events.events.k8s.io": (v1_from_core, core_from_v1),
}


def to_view(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """A stored object as ``rt`` shows it (unchanged unless ``rt`` is a view)."""
    return _CONVERSIONS[rt.key][0](obj) if rt.storage else obj


def to_storage(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """An object of ``rt`` as the store keeps it (unchanged unless ``rt`` is a view)."""
    return _CONVERSIONS[rt.key][1](obj) if rt.storage else obj


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    """The resource served at ``/apis/<group>/<version>/<plural>`` (group ``""`` for ``/api/v1``)."""
    return _BY_PATH.get((group, version, plural))


def require(group: str, version: str, plural: str) -> ResourceType:
    """Like :func:`lookup` for resources known to exist (module constants); KeyError otherwise."""
    rt = lookup(group, version, plural)
    if rt is None:
        raise KeyError(f"{group}/{version}/{plural}")
    return rt


def by_key(key: str) -> ResourceType:
    """The resource for a store key such as ``resourceclaims.resource.k8s.io``; KeyError if unknown."""
    return _BY_KEY[key]


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return _BY_KIND.get((api_version, kind))


def groups() -> dict[str, list[str]]:
    """API groups (core excluded) and their served versions, in a stable order."""
    out: dict[str, list[str]] = {}
    for r in RESOURCE_TYPES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def in_group_version(group: str, version: str) -> list[ResourceType]:
    return [r for r in RESOURCE_TYPES if r.group == group and r.version == version]
