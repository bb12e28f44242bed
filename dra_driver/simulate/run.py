"""Place a scenario's claims in order, each placement updating the usage the next one sees.

A claim whose placement would take its namespace past a quota stays pending, with the quota's
message as its reason, exactly as the controller holds such a pod (dra_driver/quota/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.contract import DeviceId
from dra_driver.engine import DEFAULT_MAX_CANDIDATES, Decision, place
from dra_driver.engine.mig import MigInstance, MigRequest, is_mig_index, place_mig
from dra_driver.quota import Breach, Charge, Quota
from dra_driver.quota.crd import RESOURCES
from dra_driver.quota.usage import charged_cores
from dra_driver.simulate.scenario import Scenario, simulated_device


@dataclass(frozen=True)
class Preempted:
    """A pod the controller would evict to place a claim (``--from-cluster``: preemption)."""

    pod: str  # namespace/name
    priority: int
    node: str


@dataclass(frozen=True)
class SimulationResult:
    decisions: tuple[Decision, ...]
    #: Per decision: the quota (``namespace/name``) that held the claim pending, else None.
    quota_blocks: tuple[str | None, ...] = ()
    #: Per decision (``--from-cluster`` only, where Node objects are known): node -> why the
    #: claim's pod cannot run there (node fit), for a pending claim; empty otherwise.
    nodes_refused: tuple[Mapping[str, str], ...] = ()
    #: Per decision (``--from-cluster`` only): the pods preempted to place it (for a gang's
    #: member, those on its node), nobody evicted for real.
    victims: tuple[tuple[Preempted, ...], ...] = ()

    def blocked_by(self, position: int) -> str | None:
        return self.quota_blocks[position] if position < len(self.quota_blocks) else None

    def refused_on(self, position: int) -> Mapping[str, str]:
        return self.nodes_refused[position] if position < len(self.nodes_refused) else {}

    def victims_of(self, position: int) -> tuple[Preempted, ...]:
        return self.victims[position] if position < len(self.victims) else ()


@dataclass(slots=True)
class _Running:
    """What one quota counts so far: kept up to date instead of re-summed for every claim."""

    quota: Quota
    memory: int = 0
    cores: int = 0
    devices: set[DeviceId] = field(default_factory=set)

    def amount(self, resource: str) -> int:
        return (
            len(self.devices)
            if resource == "devices"
            else self.memory
            if resource == "memory"
            else self.cores
        )

    def add(self, charges: Iterable[Charge]) -> None:
        for charge in charges:
            if self.quota.counts(charge.class_name):
                self.memory += charge.memory
                self.cores += charge.cores
                self.devices.add(charge.device)


class QuotaLedger:
    """Every quota's running usage, checked as ``dra_driver.quota.find_breach`` checks it.

    ``find_breach`` sums a namespace's charges on every call, which is right for the controller
    (its charges change under it) but makes a simulation quadratic: 2,000 claims against a
    snapshot with tens of thousands of tenants spent most of their time re-adding the same
    charges. Here each quota's usage is kept as a running total, so a check costs the claim's own
    charges; the outcome (first quota in order, first resource, the ``Breach`` and its message)
    is the same, which the tests compare on random inputs.
    """

    def __init__(
        self, quotas: Mapping[str, Sequence[Quota]], charges: Mapping[str, Sequence[Charge]]
    ) -> None:
        self._running: dict[str, list[_Running]] = {}
        for namespace, listed in quotas.items():
            running = [_Running(quota) for quota in listed]
            for entry in running:
                entry.add(charges.get(namespace, ()))
            self._running[namespace] = running

    def breach(self, namespace: str, new: Sequence[Charge]) -> Breach | None:
        """The first quota and resource that ``new`` would take past its limit, if any."""
        for running in self._running.get(namespace, ()):
            counted = [charge for charge in new if running.quota.counts(charge.class_name)]
            added = {
                "memory": sum(charge.memory for charge in counted),
                "cores": sum(charge.cores for charge in counted),
                "devices": len({charge.device for charge in counted} - running.devices),
            }
            for resource in RESOURCES:
                hard = running.quota.hard.get(resource)
                if hard is None:
                    continue
                used = running.amount(resource)
                requested = added[resource]
                if requested > 0 and used + requested > hard:
                    return Breach(running.quota, resource, used, requested, hard)
        return None

    def add(self, namespace: str, new: Sequence[Charge]) -> None:
        for running in self._running.get(namespace, ()):
            running.add(new)


def run_scenario(scenario: Scenario, *, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> SimulationResult:
    state = scenario.cluster_state()
    mig_state, mig_instances = scenario.mig_state()
    quotas: dict[str, list[Quota]] = {}
    for spec in scenario.quotas:
        quotas.setdefault(spec.namespace, []).append(spec.quota())
    ledger = QuotaLedger(quotas, scenario.existing_charges(set(quotas)) if quotas else {})
    decisions: list[Decision] = []
    blocks: list[str | None] = []
    for claim, request in zip(scenario.claims, scenario.requests(), strict=True):
        if isinstance(request, MigRequest):
            decision = place_mig(mig_state, request, max_candidates=max_candidates)
        else:
            decision = place(state, request, max_candidates=max_candidates)
        blocked = None
        if decision.placement is not None:
            node = decision.placement.node
            new = [
                Charge(
                    claim.device_class,
                    _device(node, share.index, mig_instances),
                    share.memory,
                    share.cores if is_mig_index(share.index) else charged_cores(share.cores),
                )
                for share in decision.placement.devices
            ]
            breach = ledger.breach(claim.namespace, new)
            if breach is None:
                if isinstance(request, MigRequest):
                    mig_state.allocate(decision.placement)
                else:
                    state.allocate(decision.placement)
                ledger.add(claim.namespace, new)
            else:
                blocked = f"{breach.quota.namespace}/{breach.quota.name}"
                decision = held(decision, breach.message)
        decisions.append(decision)
        blocks.append(blocked)
    return SimulationResult(tuple(decisions), tuple(blocks))


def _device(node: str, index: int, mig_instances: Mapping[tuple[str, int], MigInstance]) -> DeviceId:
    """The DRA name of the engine's card or MIG instance ``index`` of ``node``."""
    instance = mig_instances.get((node, index))
    if instance is None:
        return simulated_device(node, index)
    return DeviceId(simulated_device(node, 0).driver, node, instance.name)


def held(decision: Decision, reason: str) -> Decision:
    """The decision as a pending one: the cards are as scored, none chosen."""
    candidates = tuple(dataclasses.replace(card, chosen=False) for card in decision.candidates)
    return dataclasses.replace(decision, placement=None, reason=reason, candidates=candidates)
