"""The ``GpuConfig`` opaque parameters: a strict pydantic model whose errors name the field.

Users put this object in ``DeviceClass.spec.config[].opaque.parameters`` or
``ResourceClaim.spec.devices.config[].opaque.parameters``. Every field is optional: an unset
field falls through to the next source (see ``resolve``). Validation is strict (no unknown
fields, no type coercion such as ``"true"`` for a bool) because a typo silently ignored would
mean a placement policy silently not applied.

Unknown policy names are an error by default (the webhook rejects them); the controller parses
with ``lenient_policy=True`` so that an object that slipped past the webhook still allocates with
the known names, as the engine ignores unknown ones, and the unknown ones become a warning event.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dra_driver.engine import KNOWN_POLICY_NAMES, ScoringWeights, WeightsError, parse_policy_chain
from dra_driver.engine.weights import MAX_WEIGHT
from dra_driver.suggest import unknown_field_hint

API_VERSION = "gpu.hami.io/v1alpha1"
KIND = "GpuConfig"


class ConfigError(ValueError):
    """An invalid ``GpuConfig``; the message names every offending field (``policy: ...``)."""


class ScoringWeightsConfig(BaseModel):
    """Weights of the card usage score terms (HAMi's ``slot=,core=,memory=``); unset weights are 1."""

    model_config = ConfigDict(extra="forbid", strict=True)

    slot: int = Field(default=1, ge=0, le=MAX_WEIGHT, description="weight of the tenants/slots term")
    core: int = Field(default=1, ge=0, le=MAX_WEIGHT, description="weight of the used/total cores term")
    memory: int = Field(default=1, ge=0, le=MAX_WEIGHT, description="weight of the used/total memory term")

    @model_validator(mode="after")
    def _one_positive(self) -> ScoringWeightsConfig:
        if not (self.slot or self.core or self.memory):
            raise ValueError("at least one of slot, core, memory must be positive")
        return self

    def to_engine(self) -> ScoringWeights:
        try:
            return ScoringWeights(slot=self.slot, core=self.core, memory=self.memory)
        except WeightsError as err:  # pragma: no cover - the model already enforces the same rules
            raise ConfigError(f"scoringWeights: {err}") from err


class GpuConfig(BaseModel):
    """Placement parameters for claims of the ``gpu.hami.io`` driver."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        title="GpuConfig",
        json_schema_extra={"description": "Opaque device configuration of the gpu.hami.io DRA driver."},
    )

    apiVersion: Literal["gpu.hami.io/v1alpha1"] = Field(description="always gpu.hami.io/v1alpha1")
    kind: Literal["GpuConfig"] = Field(description="always GpuConfig")
    policy: str | None = Field(
        default=None,
        description=(
            "card policy chain, comma separated: filters mutex, topology-aware; sort keys binpack, "
            "spread, numa in priority order (e.g. 'mutex,binpack,numa')"
        ),
        examples=["mutex,binpack", "spread", "binpack,numa"],
    )
    nodePolicy: Literal["binpack", "spread"] | None = Field(
        default=None, description="how nodes are ranked before cards are chosen"
    )
    scoringWeights: ScoringWeightsConfig | None = Field(
        default=None, description="weights of the card usage score (slot, core, memory)"
    )
    numaBind: bool | None = Field(
        default=None, description="a multi-GPU request must take all its GPUs from one NUMA node"
    )
    allowUnenforcedShares: bool | None = Field(
        default=None,
        description=(
            "DeviceClass only (ignored in a claim): hand out shares (memory or cores below the whole "
            "card) also on GPUs whose node cannot enforce them (slice attribute isolation=none), as "
            "NVIDIA's driver does; off by default, so such GPUs are only given whole"
        ),
    )
    memoryPercent: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description=(
            "memory of each GPU as a percentage of that GPU, floored to whole MiB (HAMi's "
            "nvidia.com/gpumem-percentage); for requests without a memory capacity request"
        ),
    )

    @field_validator("policy")
    @classmethod
    def _known_policies(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        chain = parse_policy_chain(value)
        if not chain.policies and not chain.unknown:
            raise ValueError("must name at least one policy")
        lenient = bool(info.context and info.context.get("lenient_policy"))
        if chain.unknown and not lenient:
            unknown = ", ".join(repr(name) for name in chain.unknown)
            raise ValueError(f"unknown policy name(s) {unknown}; known: {', '.join(KNOWN_POLICY_NAMES)}")
        return value

    def unknown_policies(self) -> tuple[str, ...]:
        """Names in ``policy`` the engine does not know (only non-empty for lenient parses)."""
        return () if self.policy is None else parse_policy_chain(self.policy).unknown


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(object)"


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, each starting with the field path, pydantic's noise removed."""
    lines = []
    for problem in err.errors(include_url=False):
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field" + unknown_field_hint(GpuConfig, tuple(problem["loc"]))
        elif problem["type"] == "literal_error":
            message = f"{message}, got {problem.get('input')!r}"
        lines.append(f"{_location(tuple(problem['loc']))}: {message}")
    return "; ".join(lines)


def parse_gpu_config(data: Any, *, lenient_policy: bool = False) -> GpuConfig:
    """Validate an opaque ``parameters`` object; raise ``ConfigError`` naming the bad fields."""
    if not isinstance(data, dict):
        raise ConfigError(f"parameters must be an object with apiVersion {API_VERSION} and kind {KIND}")
    try:
        return GpuConfig.model_validate(data, context={"lenient_policy": lenient_policy})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
