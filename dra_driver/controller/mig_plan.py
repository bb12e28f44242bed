"""A claim request of a MIG class -> the engine's ``MigRequest`` (issue 37, static MIG).

A MIG class (``DeviceClassView.mig``: a selector pins ``type == "mig"``, as the chart's
``mig.<driver>`` class does) is placed among MIG instances, each given out whole. A request names
the profile it wants with a CEL selector on the ``profile`` attribute (the eligible set the
engine receives), or a memory size (``capacity.requests.memory``: the smallest instance with that
much). Cores cannot be asked for: an instance's compute is its profile's, and HAMi-core does not
limit inside a MIG instance, so a cores request is refused rather than silently not honoured.
"""

from __future__ import annotations

from dra_driver.config.resolve import ResolvedConfig
from dra_driver.controller.eligibility import Eligible
from dra_driver.engine.mig import MigRequest
from dra_driver.resource.requests import RequestError, RequestSpec


def check_mig_request(spec: RequestSpec, subject: str) -> None:
    """Refuse what a MIG instance cannot honour (raises ``RequestError`` with the fix)."""
    if spec.cores:
        raise RequestError(
            f"{subject} request {spec.name}: class {spec.class_name} gives out whole MIG instances, "
            "whose compute is their profile's: ask for a profile (a CEL selector on "
            'device.attributes["<driver>"].profile) or a memory size, not cores'
        )


def mig_request(
    spec: RequestSpec, eligible: Eligible, resolved: ResolvedConfig, count: int, allowed: frozenset[str]
) -> MigRequest:
    """The engine's request for ``count`` instances of ``spec`` on ``allowed`` with ``resolved``
    (``memoryPercent`` has no meaning for a whole instance and is not applied)."""
    return MigRequest(
        name=spec.name,
        count=count,
        memory=spec.memory,
        policy=resolved.policy,
        node_policy=resolved.node_policy,
        numa_bind=resolved.numa_bind,
        include_products=resolved.card_filter.include_products,
        exclude_products=resolved.card_filter.exclude_products,
        include_uuids=resolved.card_filter.include_uuids,
        exclude_uuids=resolved.card_filter.exclude_uuids,
        allowed_nodes=allowed,
        allowed_devices=eligible.devices,
    )
