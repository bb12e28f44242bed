"""The per-card and per-claim samples, kept in pieces and recomputed only where something changed.

A card's series depend on its node's engine state and devices and on the claims using that node;
a claim's on its uses, the cards they are on, and who holds it (the claim object and its pods).
Samples are kept per node (the cards' families) and per holder (the per-claim families, summed over
the claims labelled alike); ``update`` recomputes the pieces the ledger's and the cache's change
notes name, ``full`` all of them. ``chunks`` hands out copies of the piece maps: the pieces
themselves are never changed once made, so a scrape reading an older copy sees one whole snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dra_driver.controller.inventory import Device
from dra_driver.controller.ledger import Ledger, LedgerChanges
from dra_driver.engine.mig import COMPUTE_SLICES, MEMORY_SLICES, MigInstance
from dra_driver.metrics_page import Piece, Sample

Who = tuple[str, str, str]
CLAIM_MEMORY = "hami_dra_claim_allocated_memory_bytes"
CLAIM_CORES = "hami_dra_claim_allocated_cores"


class TenantLike(Protocol):
    """Who holds a claim (``metrics.Tenant``): its namespace and name, and its pods' names."""

    @property
    def namespace(self) -> str: ...
    @property
    def claim(self) -> str: ...
    @property
    def pod(self) -> str: ...


#: Claim uid -> who holds it (None: a claim not seen yet, labelled with its namespace only).
TenantOf = Callable[[str], TenantLike | None]
#: Claim uid -> the uids of the pods its holder names (whose coming or going changes it).
PodsOf = Callable[[str], Iterable[str]]


class _ClaimPart:
    """One claim's contribution: (labels, memory, cores) per use on a known card, and what it read."""

    __slots__ = ("nodes", "samples", "whos")

    def __init__(self, samples: list[tuple[Who, tuple[str, ...], float, float]], nodes: set[str]) -> None:
        self.samples = samples
        self.whos = {who for who, _, _, _ in samples}
        self.nodes = nodes


class GpuSeries:
    """Node -> card samples, holder -> claim samples; recomputed piece by piece."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.nodes: dict[str, Piece] = {}
        self.holders: dict[Who, Piece] = {}
        self._parts: dict[str, _ClaimPart] = {}  # claim uid -> its contribution
        self._members: dict[Who, set[str]] = {}  # holder -> claim uids contributing
        self._on_node: dict[str, set[str]] = {}  # node -> claim uids whose samples name it
        self._pods: dict[str, set[str]] = {}  # pod uid -> claim uids whose holder named it
        self._claim_pods: dict[str, tuple[str, ...]] = {}  # claim uid -> the pod uids it named

    def full(self, ledger: Ledger, tenant_of: TenantOf, pods_of: PodsOf) -> None:
        """Every piece from scratch."""
        self._reset()
        nodes = set(ledger.state.nodes) | set(ledger.mig_state.nodes)
        self._refresh(ledger, nodes, set(ledger.claims()), tenant_of, pods_of)

    def update(
        self,
        ledger: Ledger,
        changes: LedgerChanges,
        claims: Iterable[str],
        pods: Iterable[str],
        tenant_of: TenantOf,
        pods_of: PodsOf,
    ) -> None:
        """Recompute what ``changes`` (the ledger's), ``claims`` (claim uids whose object changed)
        and ``pods`` (pod uids that came or went) may have changed."""
        nodes = changes.nodes | changes.inventory_nodes
        dirty = set(changes.claims) | set(claims)
        for pod in pods:
            dirty |= self._pods.get(pod, set())
        for node in changes.inventory_nodes:  # labels and charges read the node's cards
            dirty |= self._on_node.get(node, set()) | ledger.claims_on(node)
        self._refresh(ledger, nodes, dirty, tenant_of, pods_of)

    def _refresh(
        self,
        ledger: Ledger,
        nodes: set[str],
        claims: set[str],
        tenant_of: TenantOf,
        pods_of: PodsOf,
    ) -> None:
        for node in nodes:
            piece = _node_piece(ledger, node)
            if piece is None:
                self.nodes.pop(node, None)
            else:
                self.nodes[node] = piece
        holders: set[Who] = set()
        for uid in claims:
            holders |= self._forget(uid)
            part = _claim_part(ledger, uid, tenant_of)
            if part is None:
                continue
            self._parts[uid] = part
            for who in part.whos:
                self._members.setdefault(who, set()).add(uid)
            for node in part.nodes:
                self._on_node.setdefault(node, set()).add(uid)
            holders |= part.whos
            named = tuple(pods_of(uid))
            if named:
                self._claim_pods[uid] = named
                for pod in named:
                    self._pods.setdefault(pod, set()).add(uid)
        for who in holders:
            piece = self._holder_piece(who)
            if piece is None:
                self.holders.pop(who, None)
            else:
                self.holders[who] = piece

    def _forget(self, uid: str) -> set[Who]:
        """Take the claim's contribution out of the indexes; the holders it was counted under."""
        for pod in self._claim_pods.pop(uid, ()):
            _discard(self._pods, pod, uid)
        part = self._parts.pop(uid, None)
        if part is None:
            return set()
        for who in part.whos:
            _discard(self._members, who, uid)
        for node in part.nodes:
            _discard(self._on_node, node, uid)
        return set(part.whos)

    def _holder_piece(self, who: Who) -> Piece | None:
        memory: dict[tuple[str, ...], float] = {}
        cores: dict[tuple[str, ...], float] = {}
        for uid in sorted(self._members.get(who, ())):
            for holder, labels, taken_memory, taken_cores in self._parts[uid].samples:
                if holder == who:
                    memory[labels] = memory.get(labels, 0.0) + taken_memory
                    cores[labels] = cores.get(labels, 0.0) + taken_cores
        if not memory:
            return None
        return {CLAIM_MEMORY: tuple(memory.items()), CLAIM_CORES: tuple(cores.items())}


def _discard(index: dict[Any, set[str]], key: object, uid: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(uid)
        if not members:
            del index[key]


def gpu_labels(device: Device) -> tuple[str, str, str, str]:
    return (device.node, device.name, device.card.uuid, device.card.product_name)


def _claim_part(ledger: Ledger, uid: str, tenant_of: TenantOf) -> _ClaimPart | None:
    uses = ledger.claims().get(uid)
    if not uses:
        return None
    tenant = tenant_of(uid)
    samples: list[tuple[Who, tuple[str, ...], float, float]] = []
    nodes = set()
    for use in uses:
        device = ledger.device(use.device)
        if device is None:
            continue  # its slice is not published (yet): no card to count it on
        charge = ledger.charge(use)
        who = (tenant.namespace, tenant.claim, tenant.pod) if tenant else (use.namespace, "", "")
        samples.append((who, (*who, *gpu_labels(device)), float(charge.memory), float(charge.cores)))
        nodes.add(device.node)
    return _ClaimPart(samples, nodes) if samples else None


def _node_piece(ledger: Ledger, name: str) -> Piece | None:
    node = ledger.state.nodes.get(name)
    mig = _mig_samples(ledger, name)
    if node is None:
        return mig or None
    results: Counter[int] = Counter()
    claims = ledger.claims()
    for uid in ledger.claims_on(name):
        for use in claims.get(uid, ()):
            device = ledger.device(use.device)
            if device is not None and device.node == name:
                results[device.card.index] += 1
    # Capacity held for a nominated preemptor is in the engine state but allocated to nobody.
    held: dict[int, list[int]] = {}
    for share in ledger.held_on(name):
        amounts = held.setdefault(share.index, [0, 0, 0])
        amounts[0] += share.memory
        amounts[1] += share.cores
        amounts[2] += share.tenants
    samples: dict[str, list[Sample]] = {}
    for card in node.cards:
        labels = (name, ledger.device_name(name, card.index), card.uuid, card.product_name)
        usage = node.usage[card.index]
        memory, cores, tenants = held.get(card.index, (0, 0, 0))
        for metric, value in (
            ("hami_dra_gpu_memory_capacity_bytes", card.memory),
            ("hami_dra_gpu_cores_capacity", card.cores),
            ("hami_dra_gpu_slots_capacity", card.slots),
            ("hami_dra_gpu_allocated_memory_bytes", usage.used_memory - memory),
            ("hami_dra_gpu_allocated_cores", usage.used_cores - cores),
            ("hami_dra_gpu_allocated_slots", usage.tenants - tenants),
            ("hami_dra_gpu_tenants", results[card.index]),
        ):
            samples.setdefault(metric, []).append((labels, float(value)))
    return {**{metric: tuple(values) for metric, values in samples.items()}, **mig}


def _mig_samples(ledger: Ledger, name: str) -> dict[str, tuple[Sample, ...]]:
    """The node's MIG instances: each one's memory, and whether a claim holds it. A card in MIG on
    demand has instances only where a claim holds a placement (the others are possible, not
    made: as ``top`` shows them), and its free memory and compute slices (``kind``) instead."""
    state = ledger.mig_state
    memory: list[Sample] = []
    held: list[Sample] = []
    on_demand: dict[int, list[MigInstance]] = {}
    for instance in state.instances(name):
        in_use = state.in_use(name, instance.index)
        if instance.on_demand:
            cards = on_demand.setdefault(instance.parent, [])
            if not in_use:
                if not cards:
                    cards.append(instance)  # the card's identity, for its free-slice series
                continue
            cards.append(instance)
        labels = (
            name,
            instance.name,
            instance.uuid,
            instance.product_name,
            instance.profile,
            instance.parent_name,
        )
        memory.append((labels, float(instance.memory)))
        held.append((labels, 1.0 if in_use else 0.0))
    samples: dict[str, tuple[Sample, ...]] = {}
    if memory:
        samples["hami_dra_mig_instance_memory_bytes"] = tuple(memory)
        samples["hami_dra_mig_instance_allocated"] = tuple(held)
    if on_demand:
        free: list[Sample] = []
        for members in on_demand.values():
            first = members[0]
            used = [i for i in members if state.in_use(name, i.index)]
            card = (name, first.parent_name, first.parent_uuid, first.product_name)
            covered = {s for i in used for s in i.span}
            free.append(((*card, "memory"), float(MEMORY_SLICES - len(covered))))
            free.append(((*card, "compute"), float(COMPUTE_SLICES - sum(i.slices for i in used))))
        samples["hami_dra_mig_on_demand_free_slices"] = tuple(free)
    return samples
