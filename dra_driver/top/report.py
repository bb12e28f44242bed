"""Typed records -> the ``top`` report: cards with their tenants and usage, nodes, pending pods.

Pure (no I/O), so every rule is tested with plain objects. A card's usage is the sum of what its
tenants take, a whole-card tenant taking every capacity of the card; ``used`` may exceed
``total`` on an overcommitted card and is reported as it is, never clamped. A tenant's pods are
those the claim is reserved for, else the pod that owns it (a claim generated from a template
before the scheduler reserves it), else the pods that reference it by name.

With a namespace scope (``-n``) the tenants, pods and pending pods listed are that namespace's,
but a card's usage is still the card's: every namespace's claims are counted (``7.5Gi/15Gi`` on a
card where the namespace holds 5Gi), and the tenants of other namespaces are only counted
(``otherTenants``). Only when the user may not list claims of every namespace is usage the
namespace's share, and the report says so (``usage_namespace``).
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
    #: Tenants of namespaces out of scope: counted in usage, not listed.
    other_tenants: int = 0
    #: A MIG instance: its profile and its card's device name (None for a card).
    mig_profile: str | None = None
    mig_parent: str | None = None
    #: An instance of MIG on demand: one of its card's possible placements, allocated.
    mig_on_demand: bool = False

    @property
    def in_use(self) -> bool:
        """Some tenant takes part of it (admin access takes nothing)."""
        return self.memory.used > 0 or self.slots.used > 0 or self.cores.used > 0

    @property
    def health(self) -> str:
        if self.healthy is False or self.unhealthy_taint:
            return UNHEALTHY
        return HEALTHY if self.healthy else UNKNOWN


@dataclass(frozen=True, slots=True)
class OnDemandCard:
    """A card offering MIG on demand. Its slice publishes every possible placement as a device, but
    only an allocated one is an instance (the plugin creates it at prepare): a placement nobody
    holds is no device of the node's, so it is counted here, never listed or summed as a card."""

    node: str
    device: str
    #: Placements offered (published), allocated or not.
    placements: int
    #: What the whole card holds: its largest placement's memory and cores (7g: all of it).
    memory: int
    cores: int


@dataclass(frozen=True, slots=True)
class NodeSummary:
    name: str
    cards: tuple[Card, ...]
    on_demand: tuple[OnDemandCard, ...] = ()

    def _unplaced(self, of: str) -> Usage:
        """The capacity of the on-demand cards that no instance holds (free for new placements)."""
        total = 0
        for card in self.on_demand:
            held = sum(
                getattr(c, of).total for c in self.cards if c.mig_on_demand and c.mig_parent == card.device
            )
            total += max(0, getattr(card, of) - held)
        return Usage(0, total)

    @property
    def memory(self) -> Usage:
        return sum((card.memory for card in self.cards), self._unplaced("memory"))

    @property
    def cores(self) -> Usage:
        return sum((card.cores for card in self.cards), self._unplaced("cores"))

    @property
    def slots(self) -> Usage:
        return sum((card.slots for card in self.cards), Usage(0, 0))

    @property
    def gpus(self) -> int:
        """Physical GPUs: the cards published whole, and each card in MIG mode once."""
        whole = sum(1 for card in self.cards if card.mig_parent is None)
        parents = {card.mig_parent for card in self.cards if card.mig_parent is not None}
        return whole + len(parents | {card.device for card in self.on_demand})

    @property
    def mig_instances(self) -> int:
        return sum(1 for card in self.cards if card.mig_parent is not None)

    @property
    def healthy_cards(self) -> int:
        return sum(card.health == HEALTHY for card in self.cards)

    @property
    def tenants(self) -> int:
        """Distinct claims listed (of the namespace in scope) with an allocation on this node."""
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
    #: Usage counts only this namespace's claims (claims of all namespaces could not be listed);
    #: None: usage counts every namespace's claims.
    usage_namespace: str | None = None

    @property
    def cards(self) -> tuple[Card, ...]:
        return tuple(card for node in self.nodes for card in node.cards)

    def mig_cards(self) -> list[MigCard]:
        """The cards in MIG mode with their instances, by node and card (a card offering MIG on
        demand with no instance yet too)."""
        groups: dict[tuple[str, str], list[Card]] = {}
        offered: dict[tuple[str, str], int] = {}
        for node in self.nodes:
            for on_demand in node.on_demand:
                groups.setdefault((on_demand.node, on_demand.device), [])
                offered[(on_demand.node, on_demand.device)] = on_demand.placements
        for card in self.cards:
            if card.mig_parent is not None:
                groups.setdefault((card.node, card.mig_parent), []).append(card)
        return [
            MigCard(node, parent, tuple(sorted(cards, key=_instance_ids)), offered.get((node, parent)))
            for (node, parent), cards in sorted(groups.items())
        ]


def _instance_ids(card: Card) -> tuple[int, ...]:
    """``gpu-1-mig-13-0`` -> (13, 0): instances in GPU instance order (NVML numbers them by span)."""
    ids = card.device.rpartition("-mig-")[2].split("-")
    return tuple(int(part) if part.isdigit() else 0 for part in ids)


@dataclass(frozen=True, slots=True)
class MigCard:
    """A card in MIG mode: its instances, each a device of its own (``Card`` with ``mig_profile``)."""

    node: str
    device: str
    instances: tuple[Card, ...]
    #: MIG on demand: the placements the card offers (its instances are those allocated); None for
    #: a card whose instances an admin made.
    placements: int | None = None

    @property
    def in_use(self) -> int:
        return sum(1 for instance in self.instances if instance.in_use)


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


def _card(
    device: PublishedDevice, tenants: Iterable[Tenant], driver: str, namespace: str | None = None
) -> Card:
    """The card with every tenant charged; those of ``namespace`` (None: all) listed."""
    # A whole-card tenant takes every capacity of the card it sits on.
    placed = sorted(
        (
            replace(t, memory=device.memory, cores=device.cores, slots=device.slots) if t.whole_card else t
            for t in tenants
        ),
        key=lambda t: (t.label, t.request),
    )
    charged = [t for t in placed if not t.admin_access]
    listed = tuple(t for t in placed if namespace is None or t.namespace == namespace)
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
        tenants=listed,
        health_monitored=device.health_monitored,
        other_tenants=len(placed) - len(listed),
        mig_profile=device.mig_profile,
        mig_parent=device.mig_parent,
        mig_on_demand=device.mig_on_demand,
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
    usage_namespace: str | None = None,
) -> TopReport:
    """Join cards, allocations and pods; ``namespace`` None lists every namespace's tenants and
    pending pods, else that namespace's. Usage counts every claim given: pass ``usage_namespace``
    when the claims are only that namespace's (the others could not be read), so the report says so.
    """
    in_scope_pods = [pod for pod in pods if namespace is None or pod.namespace == namespace]
    pods_by_namespace: dict[str, list[PodRecord]] = {}
    for pod in in_scope_pods:
        pods_by_namespace.setdefault(pod.namespace, []).append(pod)
    published = {(device.pool, device.name): device for device in devices}
    on_device: dict[tuple[str, str], list[Tenant]] = {key: [] for key in published}
    unpublished: list[UnpublishedUse] = []
    for claim in claims:
        in_scope = namespace is None or claim.namespace == namespace
        for result in claim.results:
            tenant = _tenant(claim, result, pods_by_namespace.get(claim.namespace, ()))
            key = (result.pool, result.device)
            if key in on_device:
                on_device[key].append(tenant)
            elif in_scope:
                unpublished.append(UnpublishedUse(result.pool, result.device, tenant))
    cards_by_node: dict[str, list[Card]] = {}
    placements: dict[tuple[str, str], list[PublishedDevice]] = {}
    for key, device in published.items():
        cards_by_node.setdefault(device.node, [])
        if device.mig_on_demand and device.mig_parent is not None:
            placements.setdefault((device.node, device.mig_parent), []).append(device)
            if not on_device[key]:
                continue  # a placement nobody holds: no instance exists
        cards_by_node[device.node].append(_card(device, on_device[key], driver, namespace))
    on_demand: dict[str, list[OnDemandCard]] = {}
    for (node, parent), offered in sorted(placements.items()):
        on_demand.setdefault(node, []).append(
            OnDemandCard(
                node, parent, len(offered), max(d.memory for d in offered), max(d.cores for d in offered)
            )
        )
    nodes = tuple(
        NodeSummary(
            name,
            tuple(sorted(cards, key=lambda c: (c.index is None, c.index or 0, c.pool, c.device))),
            tuple(on_demand.get(name, ())),
        )
        for name, cards in sorted(cards_by_node.items())
    )
    return TopReport(
        driver=driver,
        namespace=namespace,
        nodes=nodes,
        pending=_pending(in_scope_pods),
        unpublished=tuple(sorted(unpublished, key=lambda u: (u.pool, u.device, u.tenant.label))),
        usage_namespace=usage_namespace,
    )
