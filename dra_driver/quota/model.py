"""``Quota``: one namespace's limits, read from a ``GpuQuota`` or from a HAMi-style ResourceQuota.

HAMi users cap GPU memory with a plain ResourceQuota on ``limits.nvidia.com/gpumem`` (MiB) and
``limits.nvidia.com/gpucores`` (percent of a GPU); under DRA Kubernetes no longer counts those, so
such a ResourceQuota is honoured as a ``GpuQuota`` with the same limits (README, "GPU quotas").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.quantity import MIB, QuantityError, format_bytes, parse_bytes, parse_quantity
from dra_driver.quota.crd import KIND, RESOURCES

#: HAMi's ResourceQuota names and what each limits (memory counted in MiB, as HAMi does).
HAMI_QUOTA_NAMES = {
    "limits.nvidia.com/gpumem": "memory",
    "limits.nvidia.com/gpucores": "cores",
}


class QuotaError(ValueError):
    """A quota object that cannot be read (it is then ignored, with this message logged)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Amounts per resource; ``None`` means not limited (or, for usage, nothing to report)."""

    memory: int | None = None  # bytes
    cores: int | None = None  # percent of one GPU
    devices: int | None = None  # distinct GPUs

    def get(self, resource: str) -> int | None:
        value: int | None = getattr(self, resource)
        return value


def format_amount(resource: str, value: int) -> str:
    """How messages and ``status.used`` show an amount: memory as a quantity, the rest as numbers."""
    return format_bytes(value) if resource == "memory" and value else str(value)


@dataclass(frozen=True, slots=True)
class Quota:
    namespace: str
    name: str
    hard: Limits
    #: Only claims of these DeviceClasses count; empty: every class of ours.
    class_names: frozenset[str] = frozenset()
    #: ``GpuQuota``, or ``ResourceQuota`` for one read from HAMi's names.
    source: str = KIND

    @property
    def ref(self) -> str:
        """How messages name the quota: ``team-a/team-a``, ``team-a/gpu-quota (ResourceQuota)``."""
        suffix = "" if self.source == KIND else f" ({self.source})"
        return f"{self.namespace}/{self.name}{suffix}"

    @property
    def metric_name(self) -> str:
        return self.name if self.source == KIND else f"resourcequota/{self.name}"

    def counts(self, class_name: str) -> bool:
        return not self.class_names or class_name in self.class_names


@dataclass(frozen=True, slots=True)
class QuotaObject:
    """A ``GpuQuota`` or ResourceQuota object as the controller keeps it, read once.

    Its ``spec`` is kept as published: a change there may change the limits, while one of the
    status alone (ours, or kube-controller-manager's) lets no refused pod in. ``used`` is the
    ``status.used`` last written, so an unchanged usage is not written again; ``raw`` is the object
    itself, which a status write starts from (fields newer than our model round-trip untouched).
    """

    raw: Mapping[str, Any]
    #: ``spec`` as published (None when absent), compared whole.
    spec: Mapping[str, Any] | None
    #: ``status.used`` as last written (None before the first write).
    used: Mapping[str, Any] | None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> QuotaObject:
        return cls(raw=obj, spec=obj.get("spec"), used=(obj.get("status") or {}).get("used"))

    @staticmethod
    def same_limits(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether two versions of a quota publish the same ``spec`` (only their status differs)."""
        return QuotaObject.parse(old).spec == QuotaObject.parse(new).spec


def _meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _count(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except QuantityError as err:
        raise QuotaError(f"{where}: {err}") from None
    if amount < 0 or amount.denominator != 1:
        raise QuotaError(f"{where}: {value!r} is not a whole, non-negative number")
    return amount.numerator


def quota_from_gpu_quota(obj: Mapping[str, Any]) -> Quota:
    """A ``GpuQuota`` object (already checked by the API server's schema) as a ``Quota``."""
    namespace, name = _meta(obj)
    spec = obj.get("spec") or {}
    hard = spec.get("hard") or {}
    unknown = sorted(set(hard) - set(RESOURCES))
    if unknown:
        raise QuotaError(f"GpuQuota {namespace}/{name}: unknown resource(s) {unknown} in spec.hard")
    try:
        memory = parse_bytes(hard["memory"]) if "memory" in hard else None
    except QuantityError as err:
        raise QuotaError(f"GpuQuota {namespace}/{name}: spec.hard.memory: {err}") from None
    where = f"GpuQuota {namespace}/{name}: spec.hard"
    limits = Limits(
        memory=memory,
        cores=_count(hard["cores"], f"{where}.cores") if "cores" in hard else None,
        devices=_count(hard["devices"], f"{where}.devices") if "devices" in hard else None,
    )
    classes = frozenset(str(item) for item in spec.get("deviceClassNames") or ())
    return Quota(namespace, name, limits, classes)


def quota_from_resource_quota(obj: Mapping[str, Any]) -> Quota | None:
    """The HAMi limits of a ResourceQuota as a ``Quota``; ``None`` when it names none of them."""
    namespace, name = _meta(obj)
    hard = (obj.get("spec") or {}).get("hard") or {}
    found = {resource: hard[key] for key, resource in HAMI_QUOTA_NAMES.items() if key in hard}
    if not found:
        return None
    where = f"ResourceQuota {namespace}/{name}"
    memory = cores = None
    if "memory" in found:
        memory = _count(found["memory"], f"{where}: limits.nvidia.com/gpumem") * MIB
    if "cores" in found:
        cores = _count(found["cores"], f"{where}: limits.nvidia.com/gpucores")
    return Quota(namespace, name, Limits(memory=memory, cores=cores), source="ResourceQuota")
