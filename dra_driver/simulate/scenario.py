"""Scenario files for ``hami-dra simulate``: schema, loading and conversion to engine inputs.

The keys are documented in docs/simulate.md ("Scenario files") and must stay stable so scenario files
remain portable. Every error names the file, the path inside it and what is wrong.

A scenario may be a snapshot of a live cluster (``simulate --from-cluster``,
``dra_driver/simulate/snapshot.py``): it then has a ``snapshot`` key saying where and when it
was taken, and its allocations are what the cluster holds, recorded even where they overcommit a
card (as the controller records them); in a hand-written scenario allocations must fit their card.

Loading is built for snapshots of thousands of nodes: the document is read by
``documents.load_document`` (JSON or libyaml, not PyYAML's pure-Python parser), quantities are
parsed once per distinct text, duplicate checks are linear, and the engine state is built one
node at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.contract import SHARES_ENFORCED, DeviceId
from dra_driver.devices.mig import MigModelError, gpu_instance_id
from dra_driver.devices.mig import place as place_mig_profiles
from dra_driver.devices.mig_on_demand import placement_device_name, possible_placements
from dra_driver.devices.mig_profiles import MIG_MODELS, MigModel, MigProfile, mig_model
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
from dra_driver.engine.mig import MigInstance, MigRequest, MigState, mig_cores
from dra_driver.quantity import MIB, QuantityError, parse_bytes, parse_quantity
from dra_driver.quota import Charge, Limits, Quota
from dra_driver.quota.usage import charged_cores
from dra_driver.simulate.documents import load_document
from dra_driver.suggest import unknown_field_hint


def simulated_device(node: str, index: int) -> DeviceId:
    """The DRA name our plugin would publish for card ``index`` of ``node`` (pool = node)."""
    return DeviceId(DEFAULT_DRIVER_NAME, node, f"gpu-{index}")


class ScenarioError(Exception):
    """A scenario file that cannot be used; the message is ready to print."""


def _memory(value: Any) -> int:
    if isinstance(value, str):
        return _memory_text(value)
    return _bytes(value)


@lru_cache(maxsize=4096)
def _memory_text(value: str) -> int:
    """A memory quantity written as text, parsed once: a snapshot repeats the same few thousands of times."""
    return _bytes(value)


def _bytes(value: Any) -> int:
    try:
        memory = parse_bytes(value)
    except QuantityError as err:
        raise ValueError(str(err)) from None
    if memory and memory < 1024 * 1024:
        raise ValueError(f"{value!r} is less than 1Mi; memory is in bytes (did you mean {value}Mi?)")
    return memory


def _duplicates(names: Iterable[Any]) -> list[Any]:
    """The names listed more than once, sorted (linear: a snapshot lists thousands of nodes)."""
    return sorted(name for name, count in Counter(names).items() if count > 1)


Memory = Annotated[int, BeforeValidator(_memory)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class AllocationSpec(_Strict):
    """An existing tenant on a card (a pod HAMi or our controller already placed there)."""

    memory: Memory = 0
    cores: int = Field(default=0, ge=0)
    #: Tenant slots it takes: 1 for a share; a whole-card allocation takes all the card's.
    slots: int = Field(default=1, ge=1)
    #: The tenant's namespace: what it counts against that namespace's quotas.
    namespace: str = "default"
    #: The DeviceClass it was allocated from: quotas with ``deviceClassNames`` count only theirs.
    device_class: str = Field(default="", alias="deviceClass")
    #: Whose it is (``namespace/name`` of the ResourceClaim in a snapshot); informational only.
    claim: str = ""


def _mig_device(value: Any) -> Any:
    """``"1g.18gb"`` / ``"1g.18gb@6"`` as shorthand for ``{profile, start}``."""
    if isinstance(value, str):
        profile, _, start = value.partition("@")
        if start and not start.isdigit():
            raise ValueError(f"{value!r}: expected <profile> or <profile>@<start slot>")
        return {"profile": profile, "start": int(start) if start else None}
    return value


class MigDeviceSpec(_Strict):
    """A MIG instance of a card in MIG mode, and whether a claim holds it already.

    On a card in MIG on demand (``migOnDemand``) it is an instance that exists: held by a claim
    (``inUse``: a placement our controller gave and the plugin created), or else one this driver did
    not create (an admin's), whose slices the card does not offer, as the plugin leaves them out.
    """

    profile: str = Field(min_length=1)
    #: The memory slice it starts at (one of the profile's start slots); None: the first free one.
    start: int | None = Field(default=None, ge=0, le=7)
    in_use: bool = Field(default=False, alias="inUse")
    #: Whose it is when ``inUse``: what it counts against that namespace's quotas.
    namespace: str = "default"
    device_class: str = Field(default="", alias="deviceClass")


MigDevice = Annotated[MigDeviceSpec, BeforeValidator(_mig_device)]


def _check_held(placed: Sequence[tuple[MigProfile, int]], specs: Sequence[MigDeviceSpec]) -> None:
    """The instances claims hold on a card in MIG on demand are placements it offers: no ``+me``
    profile. (Start slots, overlaps and instance counts are checked by ``place``, which with NVML's
    tables also keeps them within the card's compute slices.)"""
    for (profile, start), spec in zip(placed, specs, strict=True):
        if spec.in_use and profile.name.endswith("+me"):
            raise ValueError(
                f"migDevices: {profile.name}@{start}: MIG on demand offers no +me profile; "
                "a claim cannot hold one (list it without inUse: an instance not ours)"
            )


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
    #: Its compute mode lets no two tenants use it (NVML's Exclusive_Process, Prohibited): only
    #: whole-card requests fit (CardComputeModeWholeOnly), whatever the class allows.
    whole_only: bool = Field(default=False, alias="wholeOnly")
    #: NVLink pair scores to other GPUs of the node by index, for ``topology-aware``.
    links: dict[int, int] = Field(default_factory=dict)
    allocations: list[AllocationSpec] = Field(default_factory=list)
    #: The card is in MIG mode with these instances (issue 37): it is never placed whole nor
    #: shared, only its instances are, by claims with ``mig``/``profile``.
    mig_devices: list[MigDevice] | None = Field(default=None, alias="migDevices")
    #: The card is in MIG on demand (chart ``kubeletPlugin.migOnDemand``): it offers every possible
    #: placement of its profiles, created when a claim gets one; ``migDevices`` then lists the
    #: instances that exist (see :class:`MigDeviceSpec`).
    mig_on_demand: bool = Field(default=False, alias="migOnDemand")

    @property
    def in_mig_mode(self) -> bool:
        return self.mig_devices is not None or self.mig_on_demand

    @model_validator(mode="after")
    def _mig(self) -> GpuSpec:
        if not self.in_mig_mode:
            return self
        if self.allocations:
            raise ValueError(
                "a card in MIG mode (migDevices, migOnDemand) has no allocations of its own: "
                "mark its instances inUse"
            )
        model = mig_model(self.product_name)
        if model is None:
            known = ", ".join(sorted(MIG_MODELS))
            field = "migOnDemand" if self.mig_on_demand else "migDevices"
            raise ValueError(
                f"{field}: productName {self.product_name!r} has no MIG profiles; known: {known}"
            )
        try:
            placed = place_mig_profiles(model, [(d.profile, d.start) for d in self.mig_devices or ()])
        except MigModelError as err:
            raise ValueError(f"migDevices: {err}") from None
        if self.mig_on_demand:
            _check_held(placed, self.mig_devices or ())
        return self

    def mig_instances(self, node: str) -> list[tuple[MigInstance, MigDeviceSpec | None]]:
        """The card's MIG instances as the engine sees them, each with its spec (None for a
        placement of a card in MIG on demand that no instance holds)."""
        model = mig_model(self.product_name)
        if not self.in_mig_mode or model is None:
            return []
        specs = self.mig_devices or []
        placed = place_mig_profiles(model, [(d.profile, d.start) for d in specs])
        if self.mig_on_demand:
            return self._placements(node, model, list(zip(placed, specs, strict=True)))
        result: list[tuple[MigInstance, MigDeviceSpec | None]] = []
        for spec, (profile, start) in zip(specs, placed, strict=True):
            gi = gpu_instance_id(start, profile.placement_size)
            result.append((self._instance(node, f"gpu-{self.index}-mig-{gi}-0", profile, start, gi), spec))
        return result

    def _placements(
        self, node: str, model: MigModel, placed: list[tuple[tuple[MigProfile, int], MigDeviceSpec]]
    ) -> list[tuple[MigInstance, MigDeviceSpec | None]]:
        """A card in MIG on demand: every possible placement but those overlapping an instance no
        claim holds (as the plugin publishes it), each held one with its spec."""
        foreign = [profile.spans(start) for (profile, start), spec in placed if not spec.in_use]
        held = {(profile.name, start): spec for (profile, start), spec in placed if spec.in_use}
        result: list[tuple[MigInstance, MigDeviceSpec | None]] = []
        for placement in possible_placements(model, foreign):
            name = placement_device_name(f"gpu-{self.index}", placement)
            instance = self._instance(
                node, name, placement.profile, placement.start, placement.gpu_instance, on_demand=True
            )
            result.append((instance, held.get((placement.profile.name, placement.start))))
        return result

    def _instance(
        self, node: str, name: str, profile: MigProfile, start: int, gi: int, *, on_demand: bool = False
    ) -> MigInstance:
        return MigInstance(
            node=node,
            name=name,
            parent=self.index,
            parent_name=f"gpu-{self.index}",
            gpu_instance=gi,
            compute_instance=0,
            profile=profile.name,
            memory=profile.memory_mib * MIB,
            slices=profile.slices,
            placement_start=start,
            placement_size=profile.placement_size,
            product_name=self.product_name,
            uuid="" if on_demand else f"{self.uuid or node}/mig-{gi}-0",
            parent_uuid=self.uuid,
            numa_node=self.numa_node,
            healthy=self.healthy,
            on_demand=on_demand,
        )

    @model_validator(mode="after")
    def _fits(self, info: ValidationInfo) -> GpuSpec:
        if not self.allocations or (info.context or {}).get(_OBSERVED):
            return self
        used_memory = sum(allocation.memory for allocation in self.allocations)
        used_cores = sum(allocation.cores for allocation in self.allocations)
        used_slots = sum(allocation.slots for allocation in self.allocations)
        if used_memory > self.memory:
            raise ValueError(
                f"allocations use {used_memory} bytes of memory, over the card's ({self.memory})"
            )
        if used_cores > self.cores:
            raise ValueError(f"allocations use {used_cores} cores, more than the card's {self.cores}")
        if used_slots > self.slots:
            raise ValueError(f"allocations take {used_slots} slots, more than the card's {self.slots}")
        return self

    def shares(self) -> list[DeviceShare]:
        return [
            DeviceShare(index=self.index, memory=a.memory, cores=a.cores, tenants=a.slots)
            for a in self.allocations
        ]


class NodeSpec(_Strict):
    name: str = Field(min_length=1)
    gpus: list[GpuSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_indexes(self) -> NodeSpec:
        duplicates = _duplicates(gpu.index for gpu in self.gpus)
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
    #: Only allocations and claims of these DeviceClasses count (empty: all), as in a GpuQuota.
    device_class_names: list[str] = Field(default_factory=list, alias="deviceClassNames")

    def quota(self) -> Quota:
        limits = Limits(memory=self.hard.memory, cores=self.hard.cores, devices=self.hard.devices)
        return Quota(self.namespace, self.name, limits, frozenset(self.device_class_names))


def _quantity(value: Any) -> str:
    """A Kubernetes quantity (``500m``, ``4Gi``), kept as written for the pod's requests."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a quantity")
    try:
        amount = parse_quantity(value)
    except QuantityError as err:
        raise ValueError(str(err)) from None
    if amount < 0:
        raise ValueError(f"{value!r} is negative")
    return str(value)


Quantity = Annotated[str, BeforeValidator(_quantity)]


class TolerationSpec(_Strict):
    """A pod toleration, as in a Pod's ``spec.tolerations``."""

    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    def to_object(self) -> dict[str, str]:
        toleration: dict[str, str] = {"operator": self.operator}
        for name, value in (("key", self.key), ("value", self.value), ("effect", self.effect)):
            if value:
                toleration[name] = value
        return toleration


class PodFitSpec(_Strict):
    """What a claim's pod asks of its node (``simulate --from-cluster`` only: node fit needs the
    cluster's Node objects; a scenario file has none, so ``simulate FILE`` ignores it)."""

    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    #: The pod's container requests.
    cpu: Quantity | None = None
    memory: Quantity | None = None

    def requests(self) -> dict[str, str]:
        return {
            name: value for name, value in (("cpu", self.cpu), ("memory", self.memory)) if value is not None
        }


class GangSpec(_Strict):
    """The gang a claim's pod belongs to (``simulate --from-cluster`` only): the pod group of the
    scheduler-plugins coscheduling label, with its minimum as the controller reads it from the
    min-member annotation; placed all together or not at all (docs/policies.md, "Gangs")."""

    name: str = Field(min_length=1)
    min_member: int = Field(alias="minMember", ge=1)


class ClaimSpec(_Strict):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, arbitrary_types_allowed=True
    )

    name: str = Field(min_length=1)
    namespace: str = "default"
    #: What quotas with ``deviceClassNames`` see it as (empty: only quotas without them count it).
    device_class: str = Field(default="", alias="deviceClass")
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
    #: A claim of MIG instances (the chart's ``mig.<driver>`` class): of this profile
    #: (``1g.18gb``), or any with ``memory`` at least (the smallest such first).
    mig: bool = False
    profile: str | None = None
    #: What its pod asks of the node (node fit), for ``--from-cluster``.
    pod: PodFitSpec | None = None
    #: Its pod's priority (``spec.priority``, the value admission resolves from its
    #: PriorityClass; default 0), ``priorityClassName`` (recorded on the pod) and
    #: ``preemptionPolicy``; its gang. ``--from-cluster`` only: claims are then planned in
    #: priority order and may preempt pods of lower priority, gangs all together.
    priority: int | None = None
    priority_class_name: str | None = Field(default=None, alias="priorityClassName", min_length=1)
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = Field(
        default=None, alias="preemptionPolicy"
    )
    gang: GangSpec | None = None

    @model_validator(mode="after")
    def _one_memory(self) -> ClaimSpec:
        if self.memory is not None and self.memory_percent is not None:
            raise ValueError("give memory or memoryPercent, not both")
        if self.priority_class_name is not None and self.priority is None:
            raise ValueError(
                f"priorityClassName {self.priority_class_name!r} needs its value as priority "
                "(what admission resolves the class to, e.g. priority: 1000)"
            )
        if self.is_mig and (self.cores or self.memory_percent is not None):
            raise ValueError(
                "a MIG claim gets whole instances: give a profile or memory, not cores or memoryPercent"
            )
        return self

    @property
    def is_mig(self) -> bool:
        return self.mig or self.profile is not None

    @property
    def replayed(self) -> list[str]:
        """The fields only ``--from-cluster`` replays (priorities, preemption, gangs)."""
        fields = ("priority", "priorityClassName", "preemptionPolicy", "gang")
        values = (self.priority, self.priority_class_name, self.preemption_policy, self.gang)
        return [name for name, value in zip(fields, values, strict=True) if value is not None]


def gang_problems(claims: Iterable[ClaimSpec]) -> list[str]:
    """Members of one gang (namespace and name) that disagree on its minimum."""
    minimums: dict[tuple[str, str], int] = {}
    problems = []
    for position, claim in enumerate(claims):
        if claim.gang is None:
            continue
        key = (claim.namespace, claim.gang.name)
        first = minimums.setdefault(key, claim.gang.min_member)
        if first != claim.gang.min_member:
            problems.append(
                f"claims[{position}]({claim.name}).gang.minMember: {claim.gang.min_member}, but an earlier "
                f"member of gang {claim.namespace}/{claim.gang.name} says {first}"
            )
    return problems


#: Validation context key: the allocations are observed facts (a snapshot), not a plan to check.
_OBSERVED = "observed"


class SnapshotInfo(_Strict):
    """Where and when ``simulate --from-cluster`` took the scenario (informational)."""

    context: str = ""
    server: str = ""
    driver: str = DEFAULT_DRIVER_NAME
    taken: str = ""


class Scenario(_Strict):
    #: Present in snapshots of a live cluster: their allocations may overcommit a card.
    snapshot: SnapshotInfo | None = None
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
            duplicates = _duplicates(names)
            if duplicates:
                raise ValueError(f"{kind} name listed twice: {duplicates}")
        return self

    def cluster_state(self) -> ClusterState:
        """The cluster with every GPU's existing allocations recorded.

        One placement per node (recording is per node: a node is re-scored and re-ranked once,
        not once per tenant). Recorded as observed, like the controller's ledger does: a
        hand-written scenario's allocations were already checked to fit, a snapshot's are facts.
        """
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
                whole_only=gpu.whole_only,
                links=dict(gpu.links),
            )
            for node in self.nodes
            for gpu in node.gpus
            if not gpu.in_mig_mode
        )
        for node in self.nodes:
            shares = [share for gpu in node.gpus for share in gpu.shares()]
            if shares:
                state.allocate(Placement(node=node.name, devices=tuple(shares)), strict=False)
        return state

    def mig_state(self) -> tuple[MigState, dict[tuple[str, int], MigInstance]]:
        """The MIG instances of every card in MIG mode, those ``inUse`` marked, and each by
        ``(node, engine index)``."""
        instances: dict[tuple[str, int], MigInstance] = {}
        state = MigState()
        for node in self.nodes:
            placed = [pair for gpu in node.gpus for pair in gpu.mig_instances(node.name)]
            for instance, _ in placed:
                instances[(node.name, instance.index)] = instance
            if placed:
                used = [instance.index for instance, spec in placed if spec is not None and spec.in_use]
                state.set_node(node.name, [instance for instance, _ in placed], used)
        return state, instances

    def requests(self) -> list[PlacementRequest | MigRequest]:
        return [self._mig_request(claim) if claim.is_mig else self._request(claim) for claim in self.claims]

    def _mig_request(self, claim: ClaimSpec) -> MigRequest:
        return MigRequest(
            name=claim.name,
            count=claim.count,
            profile=claim.profile,
            memory=claim.memory,
            policy=parse_policy_chain(claim.policy if claim.policy is not None else self.defaults.policy),
            node_policy=parse_node_policy(claim.node_policy or self.defaults.node_policy),
            numa_bind=claim.numa_bind,
            include_products=tuple(claim.product_names),
            exclude_products=tuple(claim.exclude_product_names),
            include_uuids=tuple(claim.uuids),
            exclude_uuids=tuple(claim.exclude_uuids),
        )

    def existing_charges(self, namespaces: Collection[str] | None = None) -> dict[str, list[Charge]]:
        """What the listed allocations already charge each namespace's quotas (only ``namespaces``'
        when given: a snapshot has tens of thousands of tenants, most in namespaces without quotas)."""
        charges: dict[str, list[Charge]] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                device = None
                for allocation in gpu.allocations:
                    if namespaces is not None and allocation.namespace not in namespaces:
                        continue
                    device = device or simulated_device(node.name, gpu.index)
                    cores = charged_cores(allocation.cores)
                    charge = Charge(allocation.device_class, device, allocation.memory, cores)
                    charges.setdefault(allocation.namespace, []).append(charge)
                for instance, spec in gpu.mig_instances(node.name):
                    if spec is None or not spec.in_use:
                        continue
                    if namespaces is not None and spec.namespace not in namespaces:
                        continue
                    mig_device = DeviceId(DEFAULT_DRIVER_NAME, node.name, instance.name)
                    mig_charge = Charge(
                        spec.device_class, mig_device, instance.memory, mig_cores(instance.slices)
                    )
                    charges.setdefault(spec.namespace, []).append(mig_charge)
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
    observed = isinstance(data.get("snapshot"), dict)
    try:
        return Scenario.model_validate(data, context={_OBSERVED: observed})
    except ValidationError as err:
        raise ScenarioError(_messages(err, data, source, Scenario)) from None


def _messages(err: ValidationError, data: Any, source: str, model: type[BaseModel]) -> str:
    lines = []
    for error in err.errors():
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message += unknown_field_hint(model, tuple(error["loc"]))
        lines.append(f"{source}: {_location(data, tuple(error['loc']))}: {message}")
    return "\n".join(lines)


def read_document(path: Path) -> Any:
    """The parsed document of a scenario or claims file; ``ScenarioError`` naming the file if unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read scenario file: {err.strerror or err}") from None
    try:
        return load_document(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_document(path), str(path))


class ClaimsFile(_Strict):
    """``simulate --claims FILE``: claims to place on a scenario or a cluster snapshot."""

    defaults: Defaults | None = None
    claims: list[ClaimSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> ClaimsFile:
        duplicates = _duplicates(claim.name for claim in self.claims)
        if duplicates:
            raise ValueError(f"claim name listed twice: {duplicates}")
        problems = gang_problems(self.claims)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def read_claims(path: Path) -> dict[str, Any]:
    """A claims file, checked, as a mapping with ``claims`` (and ``defaults`` when it has them).

    A bare list of claims is accepted too. Errors name the claims file and the path inside it.
    """
    data = read_document(path)
    if isinstance(data, list):
        data = {"claims": data}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ScenarioError(f"{path}: expected a list of claims or a mapping with 'claims', got {kind}")
    try:
        ClaimsFile.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_messages(err, data, str(path), ClaimsFile)) from None
    return data


def add_claims(data: Any, claims: dict[str, Any], source: str, claims_source: str) -> dict[str, Any]:
    """Scenario document ``data`` with the claims of a claims file after its own.

    The claims file's ``defaults`` replace the scenario's: they are what its claims were written for.
    """
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ScenarioError(f"{source}: expected a mapping with 'nodes' and 'claims', got {kind}")
    own = data.get("claims") or []
    if not isinstance(own, list):
        raise ScenarioError(f"{source}: claims: expected a list")
    names = {claim.get("name") for claim in own if isinstance(claim, dict)}
    for position, claim in enumerate(claims["claims"]):
        if claim["name"] in names:
            raise ScenarioError(
                f"{claims_source}: claims[{position}]({claim['name']}): {source} has a claim of that name"
            )
    merged = dict(data)
    merged["claims"] = [*own, *claims["claims"]]
    if claims.get("defaults") is not None:
        merged["defaults"] = claims["defaults"]
    return merged
