"""MIG instances placed by the policy chain (issue 37, static MIG): which existing instance a claim gets.

A card in MIG mode is published as its MIG devices, never whole nor as shares; each instance is
given out whole (its limits are the hardware's). Which free instance a request gets is decided
here, by the same chain as whole cards, read for instances:

* **binpack** prefers the card with the most instances already in use (untouched cards stay
  whole for large profiles); **spread** the card with the fewest; **numa** the lowest NUMA node;
  in the chain's order, as for cards (``engine/place.py``). The card's score is its number of
  instances in use.
* **mutex** takes instances only of cards with no instance in use (for MIG on demand: no
  placement another claim holds).
* **numaBind** keeps a request for several instances on cards of one NUMA node: NUMA nodes with
  enough eligible instances are tried best first, and where one card's placements overlap so that
  they do not all fit together, the next NUMA node is tried.
* Then the instance whose taking keeps its card's **largest free placement** intact wins: the
  memory slices left free (not covered by an instance in use) are cut into aligned blocks of 8, 4,
  2 and 1 slices (MIG's placement grid on A100/H100/H200: a profile of ``n`` memory slices starts
  at a multiple of ``n``); the candidate that shrinks its card's largest block least wins, then
  the one leaving the larger blocks (compared largest first). Three 1g pods on a card of 1g
  instances take slices 0, 1 and 2, leaving slices 4-7 whole: with static instances every other
  instance stays usable whatever is taken, so this is what keeps a card easy to re-partition (the
  admin destroys four free 1g instances for a 3g), and what on-demand MIG will need.
* **MIG on demand** (``on_demand`` instances: possible placements of a card, created at prepare):
  placements of one card overlap, so one is taken (``MigPlacementTaken``) while an instance in
  use covers any of its memory slices or its card has too few compute slices left; the rest is
  the same, so binpack puts three 1g slices on slices 0-2 of one card and keeps 4-7 whole for a
  3g, and a 7g goes to an untouched card. Static instances never overlap, so the rule is theirs
  too and changes nothing there.
* A request names a profile (``profile``; the controller uses CEL selectors on the ``profile``
  attribute instead) or a memory size: then the smallest instance with that much memory is taken
  before any policy key, so a 10 GiB request does not take a 3g slice while a 1g one is free.

Nodes are ranked by the node policy on the same count (instances in use on the node), ties by name;
the first node with enough eligible instances wins, as for cards. The answer is an ordinary
:class:`~dra_driver.engine.model.Decision`: each candidate names its instance (``device``), its
card's score and, in ``note``, where it sits and what it leaves free, so ``explain`` and
``simulate`` show why it won or lost.

An instance is known to the engine by a synthetic index (:func:`mig_index`: parent card, GPU and
compute instance ids, above :data:`MIG_INDEX_BASE`) so that a placement maps back to its device
like a card's, without ever being confused with one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from dra_driver.engine.model import CandidateCard, Decision, DeviceShare, NodeOutcome, Placement
from dra_driver.engine.place import unplaced
from dra_driver.engine.policy import DEFAULT_NODE_POLICY, NodePolicy, Policy, PolicyChain, parse_policy_chain
from dra_driver.engine.reasons import Reason, format_reasons

#: Memory slices of a MIG-capable card; placements are aligned blocks within 0..7.
MEMORY_SLICES = 8
#: Compute slices of such a card: ``7g`` is all of it.
COMPUTE_SLICES = 7
#: Engine indexes of MIG instances start here: far above any card index (a GPU's minor number).
MIG_INDEX_BASE = 1 << 20
_BLOCK_SIZES = (8, 4, 2, 1)
_UNKNOWN_NUMA = 1 << 30


def mig_index(parent: int, gpu_instance: int, compute_instance: int) -> int:
    """The engine's index of a MIG instance: unique per node, stable while the instance exists."""
    return MIG_INDEX_BASE + parent * 128 + gpu_instance * 8 + compute_instance


def is_mig_index(index: int) -> bool:
    return index >= MIG_INDEX_BASE


def mig_cores(slices: int) -> int:
    """An instance's compute as percent of its card (what quotas charge): ``7g`` is 100."""
    return min(100, slices * 100 // COMPUTE_SLICES)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One existing MIG device (a compute instance of a GPU instance) as the engine sees it."""

    node: str
    #: Its published device name (``gpu-1-mig-13-0``).
    name: str
    #: The parent card's index (``parentIndex``) and published name (``gpu-1``).
    parent: int
    parent_name: str
    gpu_instance: int
    compute_instance: int
    profile: str
    memory: int
    slices: int
    placement_start: int | None = None
    placement_size: int | None = None
    product_name: str = ""
    uuid: str = ""
    parent_uuid: str = ""
    numa_node: int | None = None
    healthy: bool = True
    #: A possible placement of a card in MIG on demand (no instance until prepare): it may overlap
    #: other placements of its card, and its index tells profiles of one placement apart.
    on_demand: bool = False
    #: The engine's index (:func:`mig_index`), computed once.
    index: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Two on-demand profiles may share a placement (1g.20gb and 2g.20gb at slice 2: GPU instance
        # 4 either way) but never their compute slices, which stand in for the compute instance id.
        third = self.slices if self.on_demand else self.compute_instance
        object.__setattr__(self, "index", mig_index(self.parent, self.gpu_instance, third))

    @property
    def span(self) -> range:
        """The memory slices the instance covers (none when the driver did not say)."""
        if self.placement_start is None or self.placement_size is None:
            return range(0)
        return range(self.placement_start, self.placement_start + self.placement_size)

    @property
    def where(self) -> str:
        """``slices 0-3`` / ``slice 6`` of its card, or its profile alone where unknown."""
        span = self.span
        if not span:
            return "placement unknown"
        return f"slice {span[0]}" if len(span) == 1 else f"slices {span[0]}-{span[-1]}"


def conflicts(a: MigInstance, b: MigInstance) -> bool:
    """Can ``a`` and ``b`` not both be in use? Two placements of one card whose memory slices
    overlap (never the case for two existing instances)."""
    return a.index != b.index and a.parent == b.parent and bool(set(a.span) & set(b.span))


def card_memory(card: Sequence[MigInstance]) -> int:
    """The memory of a card's instances together: their sum for static MIG; for a card in MIG on
    demand, whose placements overlap, its largest placement's (the whole card's, ``7g``)."""
    if any(instance.on_demand for instance in card):
        return max(instance.memory for instance in card)
    return sum(instance.memory for instance in card)


def placement_taken(instance: MigInstance, used: Iterable[MigInstance]) -> bool:
    """Is ``instance`` blocked by the instances ``used`` of its node (overlap, or compute slices)?"""
    card = [other for other in used if other.parent == instance.parent and other.index != instance.index]
    if any(conflicts(instance, other) for other in card):
        return True
    return instance.on_demand and sum(other.slices for other in card) + instance.slices > COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class MigRequest:
    """A request for ``count`` whole MIG instances (one DRA claim request of a MIG class)."""

    name: str = "request"
    count: int = 1
    #: CUDA's profile name the instance must have (``1g.18gb``); None: any.
    profile: str | None = None
    #: Bytes the instance must have at least; the smallest such instance is preferred.
    memory: int | None = None
    policy: PolicyChain = field(default_factory=lambda: parse_policy_chain("binpack"))
    node_policy: NodePolicy = DEFAULT_NODE_POLICY
    numa_bind: bool = False
    include_products: tuple[str, ...] = ()
    exclude_products: tuple[str, ...] = ()
    #: Instance or parent-card UUIDs (HAMi's use-gpuuuid / nouse-gpuuuid).
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    allowed_nodes: frozenset[str] | None = None
    #: Instances the request may use as ``(node, index)`` (CEL selectors, taints); None: all.
    allowed_devices: frozenset[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"{self.name}: count must be at least 1, got {self.count}")
        if self.memory is not None and self.memory < 0:
            raise ValueError(f"{self.name}: memory must not be negative")


@dataclass(slots=True)
class _NodeMig:
    instances: dict[int, MigInstance]
    used: set[int]


class MigState:
    """Every node's MIG instances and which are in use. Single owner, like ``ClusterState``."""

    def __init__(self, instances: Iterable[MigInstance] = ()) -> None:
        self._nodes: dict[str, _NodeMig] = {}
        by_node: dict[str, list[MigInstance]] = {}
        for instance in instances:
            by_node.setdefault(instance.node, []).append(instance)
        for name, items in by_node.items():
            self.set_node(name, items)

    @property
    def nodes(self) -> Sequence[str]:
        return sorted(self._nodes)

    def set_node(self, node: str, instances: Iterable[MigInstance], used: Iterable[int] = ()) -> None:
        """Replace a node's instances and the indexes in use (an index no longer there is dropped)."""
        by_index: dict[int, MigInstance] = {}
        for instance in instances:
            if instance.node != node:
                raise ValueError(f"node {node}: MIG instance {instance.name} belongs to {instance.node}")
            if instance.index in by_index:
                raise ValueError(f"node {node}: MIG instance {instance.name} is listed twice")
            by_index[instance.index] = instance
        if not by_index:
            self._nodes.pop(node, None)
            return
        self._nodes[node] = _NodeMig(by_index, {index for index in used if index in by_index})

    def remove_node(self, node: str) -> None:
        self._nodes.pop(node, None)

    def instances(self, node: str) -> Sequence[MigInstance]:
        entry = self._nodes.get(node)
        return () if entry is None else sorted(entry.instances.values(), key=lambda i: i.index)

    def in_use(self, node: str, index: int) -> bool:
        entry = self._nodes.get(node)
        return entry is not None and index in entry.used

    def allocate(self, placement: Placement, *, strict: bool = True) -> None:
        """Mark the placement's instances in use; ``strict`` refuses one already in use."""
        entry = self._node(placement.node)
        for share in placement.devices:
            if share.index not in entry.instances:
                raise ValueError(f"node {placement.node} has no MIG instance with index {share.index}")
            if strict and share.index in entry.used:
                raise ValueError(f"{placement.node}/{entry.instances[share.index].name} is in use already")
        if strict:
            taken = [entry.instances[i] for i in entry.used]
            for share in placement.devices:
                wanted = entry.instances[share.index]
                if placement_taken(wanted, taken):
                    raise ValueError(f"{placement.node}/{wanted.name} overlaps a MIG instance in use")
                taken.append(wanted)
        entry.used.update(share.index for share in placement.devices)

    def release(self, placement: Placement) -> None:
        entry = self._node(placement.node)
        for share in placement.devices:
            if share.index not in entry.used:
                raise ValueError(f"release of {placement.node}: MIG instance {share.index} is not in use")
        entry.used.difference_update(share.index for share in placement.devices)

    def _node(self, node: str) -> _NodeMig:
        entry = self._nodes.get(node)
        if entry is None:
            raise ValueError(f"unknown node {node!r} (no MIG instances)")
        return entry

    def used_on_node(self, node: str) -> int:
        entry = self._nodes.get(node)
        return 0 if entry is None else len(entry.used)

    def ranking(self, sign: int, allowed: frozenset[str] | None) -> list[tuple[int, str]]:
        """``(sign * instances in use, node)`` of the (``allowed``) nodes, sorted."""
        return sorted(
            (sign * len(entry.used), name)
            for name, entry in self._nodes.items()
            if allowed is None or name in allowed
        )

    def free_on_node(self, node: str) -> int:
        """Instances of ``node`` no claim holds (healthy or not: the cheap bound of a fit)."""
        entry = self._nodes.get(node)
        return 0 if entry is None else len(entry.instances) - len(entry.used)


def free_blocks(covered: Iterable[int]) -> tuple[int, ...]:
    """The free memory slices of a card (all but ``covered``) cut into aligned MIG blocks, largest
    first: ``(4, 2)`` for slices 2-7 free. What a candidate leaves behind is compared by this."""
    mask = 0
    for position in covered:
        mask |= 1 << position
    return _free_blocks(mask)


@lru_cache(maxsize=1 << MEMORY_SLICES)
def _free_blocks(covered_mask: int) -> tuple[int, ...]:
    """:func:`free_blocks` of a bit mask of covered slices (256 of them: each computed once)."""
    free = {position for position in range(MEMORY_SLICES) if not covered_mask >> position & 1}
    blocks = []
    for size in _BLOCK_SIZES:
        for start in range(0, MEMORY_SLICES, size):
            block = set(range(start, start + size))
            if block <= free:
                blocks.append(size)
                free -= block
    return tuple(blocks)


def _blocks_text(blocks: Sequence[int]) -> str:
    return "+".join(map(str, blocks)) if blocks else "nothing"


@dataclass(slots=True)
class _Eval:
    instance: MigInstance
    #: Instances in use on its card (the card's score) and their memory.
    card_used: int
    card_used_memory: int
    card_memory: int
    reason: Reason | None = None
    #: The card's free blocks before and after taking this instance (``free_blocks``).
    had: tuple[int, ...] = ()
    leaves: tuple[int, ...] = ()
    chosen: bool = False
    #: Instances in use on its card counting this request's earlier choices (what sorts it).
    now_used: int = 0


def _products(instance: MigInstance, request: MigRequest) -> bool:
    product = instance.product_name.upper()
    include = [t.strip().upper() for t in request.include_products if t.strip()]
    exclude = [t.strip().upper() for t in request.exclude_products if t.strip()]
    if include and not any(token in product for token in include):
        return False
    return not any(token in product for token in exclude)


def _uuids(instance: MigInstance, request: MigRequest) -> bool:
    ids = {instance.uuid, instance.parent_uuid}
    include = {t.strip() for t in request.include_uuids if t.strip()}
    exclude = {t.strip() for t in request.exclude_uuids if t.strip()}
    if include and not ids & include:
        return False
    return not ids & exclude


def check_instance(
    instance: MigInstance, in_use: bool, card_used: int, request: MigRequest, *, taken: bool = False
) -> Reason | None:
    """Why ``instance`` cannot take one device of ``request`` now (the first check it fails), or None.
    ``taken``: an instance in use blocks its placement (:func:`placement_taken`)."""
    if not instance.healthy:
        return Reason.CARD_NOT_HEALTH
    if request.allowed_devices is not None and (instance.node, instance.index) not in request.allowed_devices:
        return Reason.DEVICE_SELECTOR_MISMATCH
    if (request.include_products or request.exclude_products) and not _products(instance, request):
        return Reason.CARD_TYPE_MISMATCH
    if (request.include_uuids or request.exclude_uuids) and not _uuids(instance, request):
        return Reason.CARD_UUID_MISMATCH
    if request.profile is not None and instance.profile != request.profile:
        return Reason.MIG_PROFILE_MISMATCH
    if in_use:
        return Reason.MIG_INSTANCE_IN_USE
    if taken:
        return Reason.MIG_PLACEMENT_TAKEN
    if request.policy.mutex and card_used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if request.memory is not None and instance.memory < request.memory:
        return Reason.CARD_INSUFFICIENT_MEMORY
    return None


def _sort_key(evaluation: _Eval, request: MigRequest) -> tuple[float | int, ...]:
    """Smallest sufficient memory (memory requests), the chain's keys on the card's use, then how
    much its card's largest free block shrinks, then the larger free blocks left on the card, then
    card index and placement start."""
    instance = evaluation.instance
    parts: list[float | int] = [instance.memory if request.memory is not None else 0]
    for key in request.policy.sort_keys:
        if key is Policy.BINPACK:
            parts.append(-evaluation.now_used)
        elif key is Policy.SPREAD:
            parts.append(evaluation.now_used)
        else:
            parts.append(_UNKNOWN_NUMA if instance.numa_node is None else instance.numa_node)
    had, leaves = evaluation.had, evaluation.leaves
    parts.append((had[0] if had else 0) - (leaves[0] if leaves else 0))
    parts.extend(-size for size in leaves)
    parts.extend([0] * (MEMORY_SLICES - len(evaluation.leaves)))
    start = instance.placement_start if instance.placement_start is not None else MEMORY_SLICES
    parts.extend([instance.parent, start, instance.index])
    return tuple(parts)


class _NodeEvaluation:
    """One node's instances scored and filtered, and ``count`` of them chosen one after another
    (each choice changes what its card has in use and leaves free)."""

    def __init__(self, state: MigState, node: str, request: MigRequest) -> None:
        self.node = node
        self.request = request
        self.instances = list(state.instances(node))
        self.used = {i.index for i in self.instances if state.in_use(node, i.index)}
        self.initial_used = set(self.used)
        self.cards: dict[int, list[MigInstance]] = {}
        for instance in self.instances:
            self.cards.setdefault(instance.parent, []).append(instance)
        self._use: dict[int, tuple[int, int, int]] = {}
        self.evals = {i.index: self._eval(i) for i in self.instances}
        self.chosen: list[MigInstance] = []

    def _card_instances(self, parent: int) -> list[MigInstance]:
        return self.cards.get(parent, [])

    def _eval(self, instance: MigInstance) -> _Eval:
        used, used_memory, memory = self._card_use(instance.parent)
        evaluation = _Eval(instance, card_used=used, card_used_memory=used_memory, card_memory=memory)
        in_use = [i for i in self._card_instances(instance.parent) if i.index in self.initial_used]
        evaluation.reason = check_instance(
            instance,
            instance.index in self.initial_used,
            used,
            self.request,
            taken=placement_taken(instance, in_use),
        )
        return evaluation

    def _card_use(self, parent: int) -> tuple[int, int, int]:
        """(instances in use, their memory, all instances' memory) of card ``parent``, once per card."""
        cached = self._use.get(parent)
        if cached is None:
            card = self._card_instances(parent)
            in_use = [i for i in card if i.index in self.initial_used]
            cached = (len(in_use), sum(i.memory for i in in_use), card_memory(card))
            self._use[parent] = cached
        return cached

    def _blocks(self, instance: MigInstance) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Its card's free blocks now, and once ``instance`` is taken too."""
        covered = [s for i in self._card_instances(instance.parent) if i.index in self.used for s in i.span]
        return free_blocks(covered), free_blocks([*covered, *instance.span])

    def choose(self) -> str | None:
        """Choose the request's instances; the node's reason when they are not all there."""
        eligible = [e for e in self.evals.values() if e.reason is None]
        for evaluation in eligible:
            evaluation.had, evaluation.leaves = self._blocks(evaluation.instance)
            evaluation.now_used = evaluation.card_used
        if self.request.numa_bind and self.request.count > 1:
            return self._choose_on_one_numa_node(eligible)
        if len(eligible) < self.request.count:
            for evaluation in eligible:
                evaluation.reason = Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST
            return self._reason()
        return None if self._pick(eligible) else self._reason()

    def _choose_on_one_numa_node(self, eligible: list[_Eval]) -> str | None:
        """``numaBind``: all of the request's instances on cards of one NUMA node. Nodes with enough
        eligible instances are tried best first (by their best instance's sort key); placements
        of one card overlap, so a NUMA node with enough of them may still not fit, and the next
        is tried. Instances of NUMA nodes tried without success lose with ``NumaNotFit`` (those of
        untried ones stay eligible, as for cards)."""
        groups: dict[int | None, list[_Eval]] = {}
        for evaluation in eligible:
            groups.setdefault(evaluation.instance.numa_node, []).append(evaluation)
        fitting = sorted(
            (g for g in groups.values() if len(g) >= self.request.count),
            key=lambda g: min(_sort_key(e, self.request) for e in g),
        )
        for position, group in enumerate(fitting):
            if self._pick(group):
                for tried in fitting[:position]:
                    for evaluation in tried:
                        evaluation.reason = Reason.NUMA_NOT_FIT
                return None
        for evaluation in eligible:
            evaluation.reason = Reason.NUMA_NOT_FIT
        return self._reason()

    def _pick(self, eligible: list[_Eval]) -> bool:
        """Choose ``count`` of ``eligible`` one after another, best first; False (nothing chosen,
        those an earlier choice blocks marked ``MigPlacementTaken``) when they do not all fit."""
        pool = list(eligible)
        while len(self.chosen) < self.request.count:
            in_use = [i for i in self.instances if i.index in self.used]
            for evaluation in [e for e in pool if placement_taken(e.instance, in_use)]:
                evaluation.reason = Reason.MIG_PLACEMENT_TAKEN  # overlaps this request's earlier choice
                pool.remove(evaluation)
            if not pool:
                for evaluation in self.evals.values():
                    evaluation.chosen = False
                self.chosen.clear()
                self.used = set(self.initial_used)
                return False
            for evaluation in pool:  # what each leaves depends on what was chosen before it
                evaluation.had, evaluation.leaves = self._blocks(evaluation.instance)
                parent = evaluation.instance.parent
                evaluation.now_used = sum(1 for i in self._card_instances(parent) if i.index in self.used)
            best = min(pool, key=lambda e: _sort_key(e, self.request))
            best.chosen = True
            pool.remove(best)
            self.chosen.append(best.instance)
            self.used.add(best.instance.index)
        return True

    def _reason(self) -> str:
        evals = list(self.evals.values())
        reason = format_reasons((e.reason for e in evals), len(evals))
        if self.request.count > len(evals):
            reason = ", ".join(filter(None, (reason, Reason.NODE_INSUFFICIENT_DEVICE.value)))
        return reason or "no MIG instance"

    def candidates(self) -> list[CandidateCard]:
        result = []
        for evaluation in sorted(self.evals.values(), key=lambda e: e.instance.index):
            instance = evaluation.instance
            note = (
                f"{instance.profile} at {instance.where} of {instance.parent_name} "
                f"({evaluation.card_used} in use)"
            )
            if evaluation.reason is None or evaluation.chosen:
                note += (
                    f"; leaves free blocks {_blocks_text(evaluation.leaves)} "
                    f"(of {_blocks_text(evaluation.had)})"
                )
            result.append(
                CandidateCard(
                    node=self.node,
                    index=instance.index,
                    product_name=instance.product_name,
                    numa_node=instance.numa_node,
                    tenants=evaluation.card_used,
                    used_memory=evaluation.card_used_memory,
                    used_cores=0,
                    total_memory=evaluation.card_memory,
                    score=float(evaluation.card_used),
                    eligible=evaluation.reason is None,
                    chosen=evaluation.chosen,
                    reason=evaluation.reason,
                    device=instance.name,
                    note=note,
                )
            )
        return result


def _ranked_nodes(state: MigState, request: MigRequest) -> list[str]:
    """Nodes by instances in use (binpack: most first; spread: fewest), ties by name."""
    sign = -1 if request.node_policy is NodePolicy.BINPACK else 1
    return [name for _, name in state.ranking(sign, request.allowed_nodes)]


def place_mig(state: MigState, request: MigRequest, *, max_candidates: int = 32) -> Decision:
    """Decide which instances ``request`` gets. Pure: the state is not changed.

    The first node (in the node policy's order) with enough free instances that fits wins; only
    when none does is every node evaluated, to say why (as ``engine/place.py`` does for cards).
    """
    ranked = _ranked_nodes(state, request)
    evaluated: dict[str, tuple[_NodeEvaluation, str | None]] = {}
    for node in ranked:
        if state.free_on_node(node) < request.count:
            continue  # cannot fit: skipped without evaluating its instances
        evaluation = _NodeEvaluation(state, node, request)
        failure = evaluation.choose()
        evaluated[node] = (evaluation, failure)
        if failure is None:
            shares = tuple(DeviceShare(i.index, i.memory, mig_cores(i.slices)) for i in evaluation.chosen)
            return Decision(
                request=request.name,
                policy=request.policy,
                node_policy=request.node_policy,
                placement=Placement(node, shares),
                reason=None,
                candidates=tuple(evaluation.candidates()),
                nodes=(NodeOutcome(node, float(state.used_on_node(node)), True, None),),
            )
    outcomes: list[NodeOutcome] = []
    candidates: list[CandidateCard] = []
    reasons: list[Reason | None] = []
    total = 0
    for node in ranked:
        evaluation, failure = evaluated.get(node) or _evaluated(state, node, request)
        reason = failure or "request does not fit"
        outcomes.append(NodeOutcome(node, float(state.used_on_node(node)), False, reason))
        reasons.extend(e.reason for e in evaluation.evals.values())
        total += len(evaluation.evals)
        if len(candidates) < max_candidates:
            candidates.extend(evaluation.candidates()[: max_candidates - len(candidates)])
    return unplaced(request, "MIG instances", outcomes, reasons, total, candidates)


def _evaluated(state: MigState, node: str, request: MigRequest) -> tuple[_NodeEvaluation, str | None]:
    evaluation = _NodeEvaluation(state, node, request)
    return evaluation, evaluation.choose()


def place_mig_and_allocate(state: MigState, request: MigRequest) -> Decision:
    """``place_mig()`` and, when it succeeds, mark the instances in use."""
    decision = place_mig(state, request)
    if decision.placement is not None:
        state.allocate(decision.placement)
    return decision


def instances_by_card(instances: Iterable[MigInstance]) -> Mapping[tuple[str, int], list[MigInstance]]:
    """Instances grouped by ``(node, parent card index)``, each group by placement."""
    cards: dict[tuple[str, int], list[MigInstance]] = {}
    for instance in instances:
        cards.setdefault((instance.node, instance.parent), []).append(instance)
    for group in cards.values():
        group.sort(key=lambda i: (i.placement_start if i.placement_start is not None else 99, i.index))
    return cards
