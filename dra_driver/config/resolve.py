"""Resolve the effective placement parameters of one claim request from all config sources.

Precedence, highest first: the pod's HAMi compatibility annotations,
the claim's ``spec.devices.config``, the DeviceClass's ``spec.config``, the controller defaults.
Each field resolves on its own, so a class may fix ``numaBind`` while a claim picks the policy.
Within one object later config entries override earlier ones, which is the order in which
kube-scheduler copies configs into an allocation and in which drivers apply them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.config.model import ConfigError, GpuConfig, parse_gpu_config
from dra_driver.engine import (
    DEFAULT_CARD_POLICY,
    DEFAULT_NODE_POLICY,
    DEFAULT_WEIGHTS,
    NodePolicy,
    PolicyChain,
    ScoringWeights,
    WeightsError,
    parse_node_policy,
    parse_policy_chain,
    parse_scoring_weights,
)

ANNOTATION_GPU_POLICY = "hami.io/gpu-scheduler-policy"
ANNOTATION_NODE_POLICY = "hami.io/node-scheduler-policy"
ANNOTATION_DEVICE_WEIGHTS = "hami.io/device-scoring-weights"
#: HAMi's card filters and NUMA binding (pod annotations, same names and meaning as in HAMi):
#: type lists are upper-cased substrings of the product name, UUID lists exact matches.
ANNOTATION_USE_GPU_TYPE = "nvidia.com/use-gputype"
ANNOTATION_NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
ANNOTATION_USE_GPU_UUID = "nvidia.com/use-gpuuuid"
ANNOTATION_NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
ANNOTATION_NUMA_BIND = "nvidia.com/numa-bind"
#: Every pod annotation ``resolve_config`` reads: pods that differ in any of them may be placed
#: differently (the controller's pending-shape grouping keys on all of them).
PLAN_ANNOTATIONS = (
    ANNOTATION_GPU_POLICY,
    ANNOTATION_NODE_POLICY,
    ANNOTATION_DEVICE_WEIGHTS,
    ANNOTATION_USE_GPU_TYPE,
    ANNOTATION_NOUSE_GPU_TYPE,
    ANNOTATION_USE_GPU_UUID,
    ANNOTATION_NOUSE_GPU_UUID,
    ANNOTATION_NUMA_BIND,
)


@dataclass(frozen=True, slots=True)
class PodAnnotations:
    """A pod's HAMi placement annotations, parsed: each None when absent or invalid.

    An invalid one is ignored with the reason in ``ignored`` (the lower sources apply), the way
    unknown names in a policy chain are ignored: a pod is placed with the class, claim or default
    value instead of waiting forever for an annotation it cannot change. The webhook warns about
    the same things (:meth:`warnings`) when the pod is created.
    """

    policy: PolicyChain | None = None
    node_policy: NodePolicy | None = None
    weights: ScoringWeights | None = None
    numa_bind: bool | None = None
    ignored: tuple[str, ...] = ()

    def warnings(self) -> list[str]:
        """The ignored annotations and the unknown policy names, for the pod's creator."""
        unknown = self.policy.unknown if self.policy is not None else ()
        names = [
            f"pod annotation {ANNOTATION_GPU_POLICY}: unknown policy name(s) ignored: {', '.join(unknown)}"
        ]
        return [*self.ignored, *(names if unknown else ())]


def read_pod_annotations(annotations: Mapping[str, str]) -> PodAnnotations:
    """Parse the HAMi placement annotations of :data:`PLAN_ANNOTATIONS` that pick values (the card
    filters are :meth:`CardFilter.from_annotations`)."""
    policy = node_policy = weights = numa_bind = None
    ignored: list[str] = []
    if ANNOTATION_GPU_POLICY in annotations:
        policy = parse_policy_chain(annotations[ANNOTATION_GPU_POLICY])
    if ANNOTATION_NODE_POLICY in annotations:
        try:
            node_policy = parse_node_policy(annotations[ANNOTATION_NODE_POLICY])
        except ValueError as err:
            ignored.append(f"pod annotation {ANNOTATION_NODE_POLICY} ignored: {err}")
    if ANNOTATION_DEVICE_WEIGHTS in annotations:
        try:
            weights = parse_scoring_weights(annotations[ANNOTATION_DEVICE_WEIGHTS])
        except WeightsError as err:
            ignored.append(f"pod annotation {ANNOTATION_DEVICE_WEIGHTS} ignored: {err}")
    if ANNOTATION_NUMA_BIND in annotations:
        text = annotations[ANNOTATION_NUMA_BIND].strip().lower()
        if text in ("true", "false"):
            numa_bind = text == "true"
        else:
            ignored.append(f"pod annotation {ANNOTATION_NUMA_BIND} ignored: not true or false: {text!r}")
    return PodAnnotations(policy, node_policy, weights, numa_bind, tuple(ignored))


class ConfigSource(StrEnum):
    """Where a resolved field came from (shown in the decision log)."""

    ANNOTATION = "annotation"
    CLAIM = "claim"
    CLASS = "class"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class ControllerDefaults:
    """``--default-policy`` and ``--default-node-policy``."""

    policy: str = DEFAULT_CARD_POLICY
    node_policy: str = DEFAULT_NODE_POLICY.value

    def __post_init__(self) -> None:
        chain = parse_policy_chain(self.policy)
        if chain.unknown or not chain.policies:
            raise ConfigError(f"default policy {self.policy!r} names no known policy or an unknown one")
        try:
            parse_node_policy(self.node_policy)
        except ValueError as err:
            raise ConfigError(f"default node policy: {err}") from None


def _token_list(value: str) -> tuple[str, ...]:
    return tuple(token.strip() for token in value.split(",") if token.strip())


@dataclass(frozen=True, slots=True)
class CardFilter:
    """HAMi's use/nouse-gputype and use/nouse-gpuuuid pod annotations, as lists."""

    include_products: tuple[str, ...] = ()
    exclude_products: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()
    exclude_uuids: tuple[str, ...] = ()

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> CardFilter:
        def tokens(key: str) -> tuple[str, ...]:
            return _token_list(annotations.get(key, ""))

        return cls(
            include_products=tokens(ANNOTATION_USE_GPU_TYPE),
            exclude_products=tokens(ANNOTATION_NOUSE_GPU_TYPE),
            include_uuids=tokens(ANNOTATION_USE_GPU_UUID),
            exclude_uuids=tokens(ANNOTATION_NOUSE_GPU_UUID),
        )

    def describe(self) -> str:
        parts = [
            f"{name}={','.join(values)}"
            for name, values in (
                ("useType", self.include_products), ("nouseType", self.exclude_products),
                ("useUuid", self.include_uuids), ("nouseUuid", self.exclude_uuids),
            )
            if values
        ]  # fmt: skip
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """The engine inputs for one request and the source of each."""

    policy: PolicyChain
    node_policy: NodePolicy
    weights: ScoringWeights
    numa_bind: bool
    sources: Mapping[str, ConfigSource] = field(default_factory=dict)
    #: Pod annotations that were invalid and therefore ignored (the lower sources apply).
    ignored_annotations: tuple[str, ...] = ()
    memory_percent: int | None = None
    card_filter: CardFilter = field(default_factory=lambda: CardFilter())
    #: The class lets shares onto GPUs that cannot enforce them (never a claim's or pod's choice).
    unenforced_shares: bool = False

    @property
    def unknown_policies(self) -> tuple[str, ...]:
        return self.policy.unknown

    def describe(self) -> str:
        """``policy=mutex,binpack(class) nodePolicy=binpack(default) ...`` for logs and events."""
        parts = [
            f"policy={self.policy.text or '-'}({self.sources.get('policy', ConfigSource.DEFAULT)})",
            f"nodePolicy={self.node_policy.value}({self.sources.get('nodePolicy', ConfigSource.DEFAULT)})",
            f"weights={self.weights}({self.sources.get('scoringWeights', ConfigSource.DEFAULT)})",
            f"numaBind={str(self.numa_bind).lower()}({self.sources.get('numaBind', ConfigSource.DEFAULT)})",
        ]
        if self.memory_percent is not None:
            parts.append(f"memoryPercent={self.memory_percent}({self.sources['memoryPercent']})")
        if self.card_filter.describe():
            parts.append(f"{self.card_filter.describe()}(annotation)")
        return " ".join(parts)


def applies_to(requests: Sequence[str] | None, request: str) -> bool:
    """Whether a config entry's ``requests`` list covers ``request`` (``"req"`` or ``"req/sub"``)."""
    if not requests:
        return True
    base = request.split("/", 1)[0]
    return request in requests or base in requests


def driver_configs(
    entries: Sequence[Mapping[str, Any]] | None,
    *,
    driver: str,
    request: str | None,
    where: str,
    lenient_policy: bool = True,
) -> list[GpuConfig]:
    """Our driver's ``GpuConfig`` objects among ``config`` entries that apply to ``request``.

    ``request=None`` selects every entry (DeviceClass configs have no ``requests``). Entries of
    other drivers are skipped; ours must be valid, else ``ConfigError`` names ``where`` and the index.
    """
    configs = []
    for position, entry in enumerate(entries or ()):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        if request is not None and not applies_to(entry.get("requests"), request):
            continue
        try:
            configs.append(parse_gpu_config(opaque.get("parameters"), lenient_policy=lenient_policy))
        except ConfigError as err:
            raise ConfigError(f"{where} config[{position}]: {err}") from None
    return configs


def resolve_config(
    *,
    class_configs: Sequence[GpuConfig] = (),
    claim_configs: Sequence[GpuConfig] = (),
    annotations: Mapping[str, str] | None = None,
    defaults: ControllerDefaults = ControllerDefaults(),
) -> ResolvedConfig:
    """Merge the sources field by field; an invalid pod annotation is ignored (:class:`PodAnnotations`).

    Our own ``GpuConfig`` is validated by the webhook, so it cannot be invalid here.
    """
    policy_text: str = defaults.policy
    node_policy_text: str = defaults.node_policy
    weights: ScoringWeights = DEFAULT_WEIGHTS
    numa_bind = False
    memory_percent: int | None = None
    sources: dict[str, ConfigSource] = {}
    for source, configs in ((ConfigSource.CLASS, class_configs), (ConfigSource.CLAIM, claim_configs)):
        for config in configs:
            if config.policy is not None:
                policy_text, sources["policy"] = config.policy, source
            if config.nodePolicy is not None:
                node_policy_text, sources["nodePolicy"] = config.nodePolicy, source
            if config.scoringWeights is not None:
                weights, sources["scoringWeights"] = config.scoringWeights.to_engine(), source
            if config.numaBind is not None:
                numa_bind, sources["numaBind"] = config.numaBind, source
            if config.memoryPercent is not None:
                memory_percent, sources["memoryPercent"] = config.memoryPercent, source
    annotations = annotations or {}
    pod = read_pod_annotations(annotations)
    policy = parse_policy_chain(policy_text)
    if pod.policy is not None:
        policy, sources["policy"] = pod.policy, ConfigSource.ANNOTATION
    if pod.weights is not None:
        weights, sources["scoringWeights"] = pod.weights, ConfigSource.ANNOTATION
    if pod.numa_bind is not None:
        numa_bind, sources["numaBind"] = pod.numa_bind, ConfigSource.ANNOTATION
    if pod.node_policy is not None:
        node_policy, sources["nodePolicy"] = pod.node_policy, ConfigSource.ANNOTATION
    else:
        try:
            node_policy = parse_node_policy(node_policy_text)
        except ValueError as err:
            raise ConfigError(f"nodePolicy {node_policy_text!r}: {err}") from None
    return ResolvedConfig(
        policy=policy,
        node_policy=node_policy,
        weights=weights,
        numa_bind=numa_bind,
        sources=sources,
        ignored_annotations=pod.ignored,
        memory_percent=memory_percent,
        card_filter=CardFilter.from_annotations(annotations),
        # Only an admin's DeviceClass may accept unenforced shares: a tenant's claim cannot.
        unenforced_shares=any(config.allowUnenforcedShares for config in class_configs),
    )
