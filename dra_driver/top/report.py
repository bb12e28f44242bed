"""Typed records -> the ``top`` report: cards with their tenants and usage, nodes, pending pods.

Pure (no I/O), so every rule is tested with plain objects. A card's usage is the sum of what its
tenants take, a whole-card tenant taking every capacity of the card; ``used`` may exceed
``total`` on an overcommitted card and is reported as it is, never clamped. A tenant's pods are
those the claim is reserved for, else the pod that owns it (a claim generated from a template
before the scheduler reserves it), else the pods that reference it by name. With a namespace
scope only that namespace's claims and pods are read, so usage is that namespace's share.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.contract import unhealthy_taint_key
from dra_driver.top.objects import (
    AllocatedClaim,
    AllocatedResult,
    DeviceTaint,
    PodRecord,
    PublishedDevice,
)

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Usage:
    used: int
    total: int

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.used + other.used, self.total + other.total)


@dataclass(frozen=True, slots=True)
class Tenant:
    """One allocation result of a claim on one card."""

    namespace: str
    claim: str
    pods: tuple[str, ...]
    request: str
    share_id: str | None
    whole_card: bool
    admin_access: bool
    memory: int
    cores: int
    slots: int
    #: One of its pods exists and has not started running yet (allocated, waiting to start).
    starting: bool

    @property
    def label(self) -> str:
        """``namespace/pod/claim`` (``pod-a+pod-b`` for a shared claim, ``-`` before any pod)."""
        return f"{self.namespace}/{'+'.join(self.pods) or '-'}/{self.claim}"


@dataclass(frozen=True, slots=True)
class Card:
    node: str
    pool: str
    device: str
    index: int | None
    uuid: str
    product_name: str
    isolation: str
    #: The ``healthy`` attribute (None: not published).
    healthy: bool | None
    #: The device carries the driver's ``<driver>/unhealthy`` taint.
    unhealthy_taint: bool
    taints: tuple[DeviceTaint, ...]
    memory: Usage
    cores: Usage
    slots: Usage
    tenants: tuple[Tenant, ...]
    #: The ``healthMonitored`` attribute (False: nothing watches its health; None: not published).
    health_monitored: bool | None = None

    @property
    def health(self) -> str:
        if self.healthy is False or self.unhealthy_taint:
            return UNHEALTHY
        return HEALTHY if self.healthy else UNKNOWN


@dataclass(frozen=True, slots=True)
class NodeSummary:
    name: str
    cards: tuple[Card, ...]

    @property
    def memory(self) -> Usage:
        return sum((card.memory for card in self.cards), Usage(0, 0))

    @property
    def cores(self) -> Usage:
        return sum((card.cores for card in self.cards), Usage(0, 0))

    @property
    def slots(self) -> Usage:
        return sum((card.slots for card in self.cards), Usage(0, 0))

    @property
    def healthy_cards(self) -> int:
        return sum(card.health == HEALTHY for card in self.cards)

    @property
    def tenants(self) -> int:
        """Distinct claims with an allocation on this node."""
        return len({(t.namespace, t.claim) for card in self.cards for t in card.tenants})

    @property
    def starting(self) -> int:
        """Distinct claims on this node whose pod has not started running yet."""
        return len({(t.namespace, t.claim) for card in self.cards for t in card.tenants if t.starting})


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    message: str
    gated: bool


@dataclass(frozen=True, slots=True)
class PendingGroup:
    reason: str
    pods: tuple[PendingPod, ...]


@dataclass(frozen=True, slots=True)
class UnpublishedUse:
    """A tenant on a device no current slice publishes (node gone, plugin republishing)."""

    pool: str
    device: str
    tenant: Tenant


@dataclass(frozen=True, slots=True)
class TopReport:
    driver: str
    #: The namespace read; None for all namespaces (``-A``).
    namespace: str | None
    nodes: tuple[NodeSummary, ...]
    pending: tuple[PendingGroup, ...]
    unpublished: tuple[UnpublishedUse, ...]

    @property
    def cards(self) -> tuple[Card, ...]:
        return tuple(card for node in self.nodes for card in node.cards)


def _tenant(claim: AllocatedClaim, result: AllocatedResult, pods: Sequence[PodRecord]) -> Tenant:
    names = claim.reserved_for or claim.owner_pods
    if not names:
        names = tuple(pod.name for pod in pods if claim.name in pod.claims)
    starting = any(pod.name in names and pod.phase == "Pending" for pod in pods)
    return Tenant(
        namespace=claim.namespace,
        claim=claim.name,
        pods=tuple(sorted(names)),
        request=result.request,
        share_id=result.share_id,
        whole_card=result.whole_card,
        admin_access=result.admin_access,
        memory=result.memory or 0,
        cores=result.cores or 0,
        slots=result.slots or 0,
        starting=starting,
    )


def _card(device: PublishedDevice, tenants: Iterable[Tenant], driver: str) -> Card:
    # A whole-card tenant takes every capacity of the card it sits on.
    placed = sorted(
        (
            replace(t, memory=device.memory, cores=device.cores, slots=device.slots) if t.whole_card else t
            for t in tenants
        ),
        key=lambda t: (t.label, t.request),
    )
    charged = [t for t in placed if not t.admin_access]
    unhealthy_key = unhealthy_taint_key(driver)
    return Card(
        node=device.node,
        pool=device.pool,
        device=device.name,
        index=device.index,
        uuid=device.uuid,
        product_name=device.product_name,
        isolation=device.isolation,
        healthy=device.healthy,
        unhealthy_taint=any(taint.key == unhealthy_key for taint in device.taints),
        taints=device.taints,
        memory=Usage(sum(t.memory for t in charged), device.memory),
        cores=Usage(sum(t.cores for t in charged), device.cores),
        slots=Usage(sum(t.slots for t in charged), device.slots),
        tenants=tuple(placed),
        health_monitored=device.health_monitored,
    )


def _pending(pods: Iterable[PodRecord]) -> tuple[PendingGroup, ...]:
    groups: dict[str, list[PendingPod]] = {}
    for pod in pods:
        reason = pod.pending_reason
        if reason is not None:
            message = pod.condition.message if pod.condition is not None else ""
            groups.setdefault(reason, []).append(PendingPod(pod.namespace, pod.name, message, pod.gated))
    return tuple(
        PendingGroup(reason, tuple(sorted(members, key=lambda p: (p.namespace, p.name))))
        for reason, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    )


def build_report(
    devices: Iterable[PublishedDevice],
    claims: Iterable[AllocatedClaim],
    pods: Iterable[PodRecord],
    *,
    driver: str = DEFAULT_DRIVER_NAME,
    namespace: str | None = None,
) -> TopReport:
    """Join cards, allocations and pods; ``namespace`` None reads every namespace."""
    in_scope_pods = [pod for pod in pods if namespace is None or pod.namespace == namespace]
    pods_by_namespace: dict[str, list[PodRecord]] = {}
    for pod in in_scope_pods:
        pods_by_namespace.setdefault(pod.namespace, []).append(pod)
    published = {(device.pool, device.name): device for device in devices}
    on_device: dict[tuple[str, str], list[Tenant]] = {key: [] for key in published}
    unpublished: list[UnpublishedUse] = []
    for claim in claims:
        if namespace is not None and claim.namespace != namespace:
            continue
        for result in claim.results:
            tenant = _tenant(claim, result, pods_by_namespace.get(claim.namespace, ()))
            key = (result.pool, result.device)
            if key in on_device:
                on_device[key].append(tenant)
            else:
                unpublished.append(UnpublishedUse(result.pool, result.device, tenant))
    cards_by_node: dict[str, list[Card]] = {}
    for key, device in published.items():
        cards_by_node.setdefault(device.node, []).append(_card(device, on_device[key], driver))
    nodes = tuple(
        NodeSummary(
            name,
            tuple(sorted(cards, key=lambda c: (c.index is None, c.index or 0, c.pool, c.device))),
        )
        for name, cards in sorted(cards_by_node.items())
    )
    return TopReport(
        driver=driver,
        namespace=namespace,
        nodes=nodes,
        pending=_pending(in_scope_pods),
        unpublished=tuple(sorted(unpublished, key=lambda u: (u.pool, u.device, u.tenant.label))),
    )
