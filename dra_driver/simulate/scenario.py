"""Scenario files for ``hami-dra simulate``: schema, loading and conversion to engine inputs.

The keys are documented in the README ("Scenario files") and must stay stable so scenario files
remain portable. Every error names the file, the path inside it and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.contract import SHARES_ENFORCED, DeviceId
from dra_driver.engine import (
    KNOWN_POLICY_NAMES,
    ClusterState,
    DeviceShare,
    GpuCard,
    Placement,
    PlacementRequest,
    ScoringWeights,
    WeightsError,
    parse_node_policy,
    parse_policy_chain,
    parse_scoring_weights,
)
from dra_driver.quantity import QuantityError, parse_bytes
from dra_driver.quota import Charge, Limits, Quota


def simulated_device(node: str, index: int) -> DeviceId:
    """The DRA name our plugin would publish for card ``index`` of ``node`` (pool = node)."""
    return DeviceId(DEFAULT_DRIVER_NAME, node, f"gpu-{index}")


class ScenarioError(Exception):
    """A scenario file that cannot be used; the message is ready to print."""


def _memory(value: Any) -> int:
    try:
        memory = parse_bytes(value)
    except QuantityError as err:
        raise ValueError(str(err)) from None
    if memory and memory < 1024 * 1024:
        raise ValueError(f"{value!r} is less than 1Mi; memory is in bytes (did you mean {value}Mi?)")
    return memory


Memory = Annotated[int, BeforeValidator(_memory)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class AllocationSpec(_Strict):
    """An existing tenant on a card (a pod HAMi or our controller already placed there)."""

    memory: Memory = 0
    cores: int = Field(default=0, ge=0, le=100)
    #: The tenant's namespace: what it counts against that namespace's quotas.
    namespace: str = "default"


class GpuSpec(_Strict):
    index: int = Field(ge=0)
    product_name: str = Field(default="", alias="productName")
    memory: Memory
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    uuid: str = ""
    cores: int = Field(default=100, gt=0)
    slots: int = Field(default=10, gt=0)
    healthy: bool = True
    #: As the slice attribute says (``dra_driver/contract.py``): on ``none`` shares are refused
    #: (CardSharesNotEnforced) unless the request's class opts in.
    isolation: Literal["hami-core", "none", "simulated"] = "hami-core"
    #: NVLink pair scores to other GPUs of the node by index, for ``topology-aware``.
    links: dict[int, int] = Field(default_factory=dict)
    allocations: list[AllocationSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fits(self) -> GpuSpec:
        used_memory = sum(allocation.memory for allocation in self.allocations)
        used_cores = sum(allocation.cores for allocation in self.allocations)
        if used_memory > self.memory:
            raise ValueError(
                f"allocations use {used_memory} bytes of memory, over the card's ({self.memory})"
            )
        if used_cores > self.cores:
            raise ValueError(f"allocations use {used_cores} cores, more than the card's {self.cores}")
        if len(self.allocations) > self.slots:
            raise ValueError(f"{len(self.allocations)} allocations exceed the card's {self.slots} slots")
        return self


class NodeSpec(_Strict):
    name: str = Field(min_length=1)
    gpus: list[GpuSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_indexes(self) -> NodeSpec:
        indexes = [gpu.index for gpu in self.gpus]
        duplicates = sorted({index for index in indexes if indexes.count(index) > 1})
        if duplicates:
            raise ValueError(f"GPU index listed twice: {duplicates}")
        return self


def _policy_names(value: Any) -> Any:
    if isinstance(value, str):
        unknown = parse_policy_chain(value).unknown
        if unknown:
            raise ValueError(
                f"unknown policy name(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(KNOWN_POLICY_NAMES)}"
            )
    return value


def _node_policy(value: Any) -> Any:
    if isinstance(value, str):
        parse_node_policy(value)
    return value


PolicyText = Annotated[str, BeforeValidator(_policy_names)]
NodePolicyText = Annotated[str, BeforeValidator(_node_policy)]


def _weights(value: Any) -> Any:
    try:
        if isinstance(value, str):
            return parse_scoring_weights(value)
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"slot", "core", "memory"})
            if unknown:
                raise ValueError(f"unknown weight(s) {unknown}; expected slot, core and memory")
            return ScoringWeights(**value)
    except WeightsError as err:
        raise ValueError(str(err)) from None
    return value


Weights = Annotated[ScoringWeights, BeforeValidator(_weights)]


class Defaults(_Strict):
    policy: PolicyText = "spread"
    node_policy: NodePolicyText = Field(default="binpack", alias="nodePolicy")


def _non_negative_count(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole, non-negative number")
    return value


class QuotaLimitsSpec(_Strict):
    memory: Memory | None = None
    cores: Annotated[int, BeforeValidator(_non_negative_count)] | None = None
    devices: Annotated[int, BeforeValidator(_non_negative_count)] | None = None

    @model_validator(mode="after")
    def _some(self) -> QuotaLimitsSpec:
        if self.memory is None and self.cores is None and self.devices is None:
            raise ValueError("give at least one of memory, cores, devices")
        return self


class QuotaSpec(_Strict):
    """A namespace quota, as a ``GpuQuota`` would set it (README, "GPU quotas")."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    hard: QuotaLimitsSpec

    def quota(self) -> Quota:
        limits = Limits(memory=self.hard.memory, cores=self.hard.cores, devices=self.hard.devices)
        return Quota(self.namespace, self.name, limits)


class ClaimSpec(_Strict):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, arbitrary_types_allowed=True
    )

    name: str = Field(min_length=1)
    namespace: str = "default"
    policy: PolicyText | None = None
    node_policy: NodePolicyText | None = Field(default=None, alias="nodePolicy")
    weights: Weights | None = None
    numa_bind: bool = Field(default=False, alias="numaBind")
    count: int = Field(default=1, ge=1)
    memory: Memory | None = None
    memory_percent: int | None = Field(default=None, alias="memoryPercent", ge=1, le=100)
    cores: int = Field(default=0, ge=0, le=100)
    product_names: list[str] = Field(default_factory=list, alias="productNames")
    exclude_product_names: list[str] = Field(default_factory=list, alias="excludeProductNames")
    uuids: list[str] = Field(default_factory=list)
    exclude_uuids: list[str] = Field(default_factory=list, alias="excludeUuids")

    @model_validator(mode="after")
    def _one_memory(self) -> ClaimSpec:
        if self.memory is not None and self.memory_percent is not None:
            raise ValueError("give memory or memoryPercent, not both")
        return self


class Scenario(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    nodes: list[NodeSpec] = Field(min_length=1)
    claims: list[ClaimSpec] = Field(default_factory=list)
    quotas: list[QuotaSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> Scenario:
        for kind, names in (
            ("node", [n.name for n in self.nodes]),
            ("claim", [c.name for c in self.claims]),
            ("quota", [f"{q.namespace}/{q.name}" for q in self.quotas]),
        ):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"{kind} name listed twice: {duplicates}")
        return self

    def cluster_state(self) -> ClusterState:
        """The cluster with every GPU's existing allocations recorded."""
        state = ClusterState(
            GpuCard(
                node=node.name,
                index=gpu.index,
                memory=gpu.memory,
                product_name=gpu.product_name,
                uuid=gpu.uuid,
                numa_node=gpu.numa_node,
                cores=gpu.cores,
                slots=gpu.slots,
                healthy=gpu.healthy,
                shares_enforced=gpu.isolation in SHARES_ENFORCED,
                links=dict(gpu.links),
            )
            for node in self.nodes
            for gpu in node.gpus
        )
        for node in self.nodes:
            for gpu in node.gpus:
                for allocation in gpu.allocations:
                    share = DeviceShare(index=gpu.index, memory=allocation.memory, cores=allocation.cores)
                    state.allocate(Placement(node=node.name, devices=(share,)))
        return state

    def requests(self) -> list[PlacementRequest]:
        return [self._request(claim) for claim in self.claims]

    def existing_charges(self) -> dict[str, list[Charge]]:
        """What the listed allocations already charge each namespace's quotas."""
        charges: dict[str, list[Charge]] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                for allocation in gpu.allocations:
                    charge = Charge(
                        "", simulated_device(node.name, gpu.index), allocation.memory, allocation.cores
                    )
                    charges.setdefault(allocation.namespace, []).append(charge)
        return charges

    def _request(self, claim: ClaimSpec) -> PlacementRequest:
        return PlacementRequest(
            name=claim.name,
            count=claim.count,
            memory=claim.memory,
            memory_percent=claim.memory_percent,
            cores=claim.cores,
            policy=parse_policy_chain(claim.policy if claim.policy is not None else self.defaults.policy),
            node_policy=parse_node_policy(claim.node_policy or self.defaults.node_policy),
            weights=claim.weights or ScoringWeights(),
            numa_bind=claim.numa_bind,
            include_products=tuple(claim.product_names),
            exclude_products=tuple(claim.exclude_product_names),
            include_uuids=tuple(claim.uuids),
            exclude_uuids=tuple(claim.exclude_uuids),
        )


def _location(data: Any, loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location with the names users wrote (``claims[0](latency-tier).memory``)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and item < len(node):
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label += f"({node['name']})"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + item)
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ScenarioError(f"{source}: expected a mapping with 'nodes' and 'claims', got {kind}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        lines = []
        for error in err.errors():
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {_location(data, tuple(error['loc']))}: {message}")
        raise ScenarioError("\n".join(lines)) from None


def load_scenario(path: Path) -> Scenario:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read scenario file: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse_scenario(data, str(path))
