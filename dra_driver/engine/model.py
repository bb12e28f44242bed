"""The engine's input and output types: plain dataclasses, no Kubernetes objects.

Units: memory in bytes, cores in percent of one card (100 = the whole card), slots = how many
tenants may share a card (HAMi's split count). A ``GpuCard`` is static inventory; its mutable
``CardUsage`` is owned by ``ClusterState`` so inventory can be shared and hashed freely.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dra_driver.engine.policy import DEFAULT_NODE_POLICY, NodePolicy, PolicyChain, parse_policy_chain
from dra_driver.engine.reasons import Reason
from dra_driver.engine.weights import DEFAULT_WEIGHTS, ScoringWeights
from dra_driver.quantity import MIB as MIB  # re-exported: the unit of every memory amount here

DEFAULT_SLOTS = 10
FULL_CORES = 100

_EMPTY_LINKS: Mapping[int, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuCard:
    """One physical GPU as the engine sees it."""

    node: str
    index: int
    memory: int
    product_name: str = ""
    uuid: str = ""
    numa_node: int | None = None
    cores: int = FULL_CORES
    slots: int = DEFAULT_SLOTS
    healthy: bool = True
    #: Whether a share's memory/cores limits are enforced on this card (HAMi-core on its node).
    shares_enforced: bool = True
    #: Only whole-card requests fit, whatever the class allows: its compute mode (NVML's
    #: Exclusive_Process, Prohibited) lets no two tenants' processes use it.
    whole_only: bool = False
    #: NVLink/topology pair scores to other cards of the node, by their index (``topology-aware``).
    links: Mapping[int, int] = field(default_factory=lambda: _EMPTY_LINKS, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"{self.node}/gpu index must be >= 0, got {self.index}")
        if self.memory <= 0:
            raise ValueError(f"{self.node}/gpu-{self.index}: memory must be positive")
        if self.cores <= 0:
            raise ValueError(f"{self.node}/gpu-{self.index}: cores must be positive")
        if self.slots <= 0:
            raise ValueError(f"{self.node}/gpu-{self.index}: slots must be positive")

    @property
    def name(self) -> str:
        """The device name in our ResourceSlices."""
        return f"gpu-{self.index}"


@dataclass(slots=True)
class CardUsage:
    """Current usage of a card: tenants (allocations sharing it), used memory and cores.

    ``scores`` memoises the usage score per weights; whoever changes the usage must clear it
    (``ClusterState`` does), so repeated placements do not recompute unchanged cards.
    """

    tenants: int = 0
    used_memory: int = 0
    used_cores: int = 0
    scores: dict[ScoringWeights, float] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """What one allocation takes from one card; adding and removing it must balance exactly."""

    index: int
    memory: int
    cores: int
    tenants: int = 1


@dataclass(frozen=True, slots=True)
class Placement:
    """An allocation of one request on one node (what ``ClusterState.allocate`` records)."""

    node: str
    devices: tuple[DeviceShare, ...]


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """A request for ``count`` GPUs with a slice of each (one DRA claim request, one HAMi container)."""

    name: str = "request"
    count: int = 1
    #: Memory per GPU in bytes; ``None`` with ``memory_percent`` ``None`` means the whole card.
    memory: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    policy: PolicyChain = field(default_factory=lambda: parse_policy_chain(None))
    node_policy: NodePolicy = DEFAULT_NODE_POLICY
    weights: ScoringWeights = DEFAULT_WEIGHTS
    numa_bind: bool = False
    #: HAMi's use-gputype / nouse-gputype: case-insensitive substrings of the product name.
    include_products: tuple[str, ...] = ()
    exclude_products: tuple[str, ...] = ()
    #: HAMi's use-gpuuuid / nouse-gpuuuid: exact UUIDs.
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()
    #: Nodes the workload may run on (taints, affinity, ... decided by the caller); ``None`` = all.
    allowed_nodes: frozenset[str] | None = None
    #: Cards the request may use as ``(node, index)``, e.g. those matching DRA CEL selectors and
    #: tolerated taints; ``None`` = every card. Others fail with ``DeviceSelectorMismatch``.
    allowed_devices: frozenset[tuple[str, int]] | None = None
    #: Shares may go to cards that cannot enforce them (a DeviceClass opted in).
    unenforced_shares: bool = False

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"{self.name}: count must be at least 1, got {self.count}")
        if self.memory is not None and self.memory_percent is not None:
            raise ValueError(f"{self.name}: give memory or memoryPercent, not both")
        if self.memory is not None and self.memory < 0:
            raise ValueError(f"{self.name}: memory must not be negative")
        if self.memory_percent is not None and not 1 <= self.memory_percent <= 100:
            raise ValueError(f"{self.name}: memoryPercent must be within 1..100, got {self.memory_percent}")
        if not 0 <= self.cores <= FULL_CORES:
            raise ValueError(f"{self.name}: cores must be within 0..100, got {self.cores}")

    def shares_card(self, card: GpuCard) -> bool:
        """Whether this takes less than the whole ``card``: a share, whose limits need enforcing."""
        return self.memory_on(card) < card.memory or self.cores < card.cores

    def memory_on(self, card: GpuCard) -> int:
        """Bytes this request takes on ``card``."""
        return self.memory_for(card.memory)

    def memory_for(self, total_memory: int) -> int:
        """Bytes taken on a card of ``total_memory``; percentages floor to whole MiB like HAMi."""
        if self.memory is not None:
            return self.memory
        percent = 100 if self.memory_percent is None else self.memory_percent
        return (total_memory // MIB) * percent // 100 * MIB


@dataclass(frozen=True, slots=True)
class CandidateCard:
    """How one card fared for a request: its score before placement, eligibility and reason."""

    node: str
    index: int
    product_name: str
    numa_node: int | None
    tenants: int
    used_memory: int
    used_cores: int
    total_memory: int
    score: float
    eligible: bool
    chosen: bool
    reason: Reason | None
    #: The published device name where it is not ``gpu-<index>`` (a MIG instance, ``engine/mig.py``).
    device: str = ""
    #: What else decided its place (a MIG instance: its placement and what taking it leaves free).
    note: str = ""


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """One node's result: its score and, when the request did not fit, HAMi's reason string."""

    node: str
    score: float
    fits: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer for one request, with everything needed to explain it."""

    request: str
    policy: PolicyChain
    node_policy: NodePolicy
    placement: Placement | None
    reason: str | None
    candidates: tuple[CandidateCard, ...]
    nodes: tuple[NodeOutcome, ...]

    @property
    def allocated(self) -> bool:
        return self.placement is not None

    @property
    def node(self) -> str | None:
        return None if self.placement is None else self.placement.node
