"""What a namespace's claims charge against its quotas, and whether a placement would exceed one.

A ``Charge`` is one allocated device result: its class, the GPU it is on and what it consumes
(a whole-card result charges the card's memory and cores). ``devices`` counts distinct GPUs, so a
second claim on a card the namespace already uses adds memory and cores but no device.

Cores are charged as the compute a result is given, not as the figure it asked for: HAMi-core
limits a share's SMs only when ``0 < cores < 100`` (``dra_driver/kubeletplugin/hamicore.py``),
so a share that asks for no cores runs unthrottled and charges a whole card's 100
(``charged_cores``); otherwise a namespace capped at ``cores: 50`` could run any number of
coreless shares at 100 % each (issue 34).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dra_driver.contract import DeviceId
from dra_driver.quota.crd import RESOURCES
from dra_driver.quota.model import Quota, format_amount

#: A whole GPU's cores (percent); also HAMi-core's "no SM limit" threshold.
WHOLE_CARD_CORES = 100


def charged_cores(cores: int, card_cores: int = WHOLE_CARD_CORES) -> int:
    """The cores one result charges: its SM limit when HAMi-core enforces one, else the whole card.

    ``cores`` is what the result consumes (``consumedCapacity.cores``); 0 and anything from the
    card's total up get no SM limit from HAMi-core, so they are charged ``card_cores``.
    """
    return cores if 0 < cores < min(card_cores, WHOLE_CARD_CORES) else card_cores


@dataclass(frozen=True, slots=True)
class Charge:
    class_name: str
    device: DeviceId  # one GPU
    memory: int
    cores: int


@dataclass(frozen=True, slots=True)
class Usage:
    memory: int = 0
    cores: int = 0
    devices: frozenset[DeviceId] = frozenset()

    def amount(self, resource: str) -> int:
        return len(self.devices) if resource == "devices" else int(getattr(self, resource))


def usage_of(quota: Quota, charges: Iterable[Charge]) -> Usage:
    """What ``charges`` (one namespace's) count against ``quota``."""
    memory = cores = 0
    devices: set[DeviceId] = set()
    for charge in charges:
        if not quota.counts(charge.class_name):
            continue
        memory += charge.memory
        cores += charge.cores
        devices.add(charge.device)
    return Usage(memory, cores, frozenset(devices))


@dataclass(frozen=True, slots=True)
class Breach:
    """The first limit a placement would exceed."""

    quota: Quota
    resource: str
    used: int
    requested: int
    hard: int

    @property
    def message(self) -> str:
        amounts = (self.used, self.requested, self.hard)
        used, requested, hard = (format_amount(self.resource, value) for value in amounts)
        return (
            f"GpuQuotaExceeded: {self.quota.ref} {self.resource}: "
            f"used {used} + requested {requested} > hard {hard}"
        )


def find_breach(quotas: Sequence[Quota], existing: Sequence[Charge], new: Sequence[Charge]) -> Breach | None:
    """The first quota (in the order given) and resource that ``new`` would take past its limit.

    Every quota applies; a resource a quota does not list is not limited by it. Adding nothing
    to a resource never breaches it, so a namespace already over a lowered limit can still place
    a claim that, for example, only shares a GPU it already uses.
    """
    for quota in quotas:
        before = usage_of(quota, existing)
        after = usage_of(quota, [*existing, *new])
        for resource in RESOURCES:
            hard = quota.hard.get(resource)
            if hard is None:
                continue
            requested = after.amount(resource) - before.amount(resource)
            if requested > 0 and after.amount(resource) > hard:
                return Breach(quota, resource, before.amount(resource), requested, hard)
    return None
