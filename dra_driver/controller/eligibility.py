"""Which devices a claim request may use: CEL selectors and device taints, cached per inventory.

A request of one of our DeviceClasses (``exactly``, or each ``firstAvailable`` subrequest in order)
becomes a ``RequestSpec``; which devices it may use is decided here with CEL (class selectors,
then the request's, exactly as kube-scheduler evaluates them, errors abort the claim) and device
taints (our own ``<driver>/policy-managed`` taint is the one we ignore). The engine receives that
device set as ``allowed_devices`` and the nodes that have such devices as ``allowed_nodes``.

A claim's selectors spend the claim's ``CostBudget`` (one per claim per plan, the planner's): each
evaluation is charged its estimated cost (``dra_driver/cel/cost.py``), and the selection whose
evaluation would pass the budget fails with the claim's selector error. Errors are cached like
selections (the next plan does not pay again); a budget refusal is kept across inventory changes
(bounded, oldest out), so a tenant's costly claim costs the planner once, not on every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import CostBudget, SelectorBudgetError, SelectorError, selectors_match
from dra_driver.config.classes import class_selectors
from dra_driver.controller.inventory import Device, NodeInventory
from dra_driver.kube.api import ObjView
from dra_driver.resource.nodes import BLOCKING_EFFECTS, taints_tolerated
from dra_driver.resource.requests import RequestError, RequestSpec

MAX_CACHED_SELECTIONS = 1024
#: Selections refused for their cost, kept across inventory changes (oldest out beyond this).
MAX_REFUSED_SELECTIONS = 4096


@dataclass(frozen=True, slots=True)
class Eligible:
    """Devices a request may use, as ``(node, index)`` (None = all of ours), and the nodes holding them."""

    devices: frozenset[tuple[str, int]] | None
    nodes: frozenset[str]
    per_node: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    #: Devices the selectors chose but a taint the request does not tolerate kept out, as
    #: ``node/device`` -> taint keys: what a pending pod's reason names (an unhealthy GPU, say).
    tainted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _NodeSelection:
    """What a request may use on one node: its devices, those kept out by a taint, and how many
    devices the node has (for "all of ours")."""

    matched: tuple[Device, ...]
    tainted: tuple[tuple[str, tuple[str, ...]], ...]
    total: int


@dataclass(slots=True)
class _Selection:
    """A cached selection: per node, and the ``Eligible`` made of them, at inventory ``position``."""

    position: int
    per_node: dict[str, _NodeSelection]
    eligible: Eligible


class Matcher:
    """CEL + taint eligibility per (class, selectors, tolerations), cached per node.

    When some nodes' devices change (``changed_since``: the inventory's change log), a cached
    selection evaluates only those nodes' devices again: every other node's CEL results are
    kept. Without a log, or when the change is unknown, a selection is evaluated in full.
    """

    def __init__(self, driver: str, policy_taint: str) -> None:
        self.driver = driver
        self.policy_taint = policy_taint
        self._cache: dict[tuple[Any, ...], _Selection | str] = {}  # str: the selector error
        self._refused: dict[tuple[Any, ...], str] = {}  # selections over their cost budget
        self._generation = -1

    def eligible(
        self,
        spec: RequestSpec,
        device_class: ObjView,
        claim_subject: str,
        inventory: Mapping[str, NodeInventory],
        generation: int,
        budget: CostBudget | None = None,
        changed_since: Callable[[int], set[str] | None] | None = None,
        *,
        mig: bool = False,
    ) -> Eligible:
        """The devices ``spec`` may use; raises ``RequestError`` with the selector's error (cached).

        ``mig``: choose among the nodes' MIG instances (a MIG class, issue 37) instead of their
        cards; the two never mix, so a class of cards never gets a MIG instance.

        ``generation``: the inventory's position in its change log (``Ledger.inventory_log``),
        ``changed_since`` that log's ``since``: the nodes to evaluate again in a cached selection.
        """
        if generation != self._generation:
            if changed_since is None:
                self._cache.clear()
            else:  # a selection catches up when read; an error is looked at again in full
                self._cache = {key: value for key, value in self._cache.items() if not isinstance(value, str)}
            self._generation = generation
        class_exprs = tuple(class_selectors(device_class))
        key = (
            spec.class_name,
            class_exprs,
            spec.selectors,
            repr(spec.tolerations),
            claim_subject if spec.selectors else "",
            mig,
        )
        cached = self._cache.get(key)
        if isinstance(cached, str):
            raise RequestError(cached)
        if cached is not None and cached.position == generation:
            return cached.eligible
        refused = self._refused.get(key)
        if refused is not None:
            raise RequestError(refused)
        changed = None if cached is None or changed_since is None else changed_since(cached.position)
        try:
            if cached is None or changed is None:
                per_node = self._select(spec, class_exprs, claim_subject, inventory.items(), budget, mig)
            else:
                per_node = dict(cached.per_node)
                for node in changed:
                    per_node.pop(node, None)
                there = ((node, inventory[node]) for node in changed if node in inventory)
                per_node.update(self._select(spec, class_exprs, claim_subject, there, budget, mig))
        except SelectorBudgetError as err:
            self._cache.pop(key, None)
            _bounded_put(self._refused, key, str(err), MAX_REFUSED_SELECTIONS)
            raise RequestError(str(err)) from None
        except SelectorError as err:
            _bounded_put(self._cache, key, str(err), MAX_CACHED_SELECTIONS)
            raise RequestError(str(err)) from None
        selection = _Selection(generation, per_node, _eligible(per_node, inventory))
        # Per-claim selectors could otherwise grow it without bound; the oldest goes first.
        _bounded_put(self._cache, key, selection, MAX_CACHED_SELECTIONS)
        return selection.eligible

    def _select(
        self,
        spec: RequestSpec,
        class_exprs: Sequence[str],
        claim_subject: str,
        nodes: Iterable[tuple[str, NodeInventory]],
        budget: CostBudget | None,
        mig: bool = False,
    ) -> dict[str, _NodeSelection]:
        """Evaluate the selectors and taints on every device of ``nodes`` (MIG instances: ``mig``)."""
        per_node = {}
        for node, node_inventory in nodes:
            matched = []
            tainted = []
            pool = node_inventory.mig if mig else node_inventory.devices
            devices = sorted(pool.values(), key=lambda item: item.card.index)
            for device in devices:
                if not self._selected(spec, class_exprs, claim_subject, device, budget):
                    continue
                keeping_out = self._untolerated(spec, device)
                if keeping_out:
                    tainted.append((f"{node}/{device.name}", keeping_out))
                    continue
                matched.append(device)
            per_node[node] = _NodeSelection(tuple(matched), tuple(tainted), len(devices))
        return per_node

    @staticmethod
    def _selected(
        spec: RequestSpec, class_exprs: Sequence[str], subject: str, device: Device, budget: CostBudget | None
    ) -> bool:
        """The class's selectors (an admin's: not charged), then the claim's (charged to ``budget``)."""
        if not selectors_match(f"class {spec.class_name}", class_exprs, device.cel):
            return False
        return not spec.selectors or selectors_match(subject, spec.selectors, device.cel, budget)

    def _untolerated(self, spec: RequestSpec, device: Device) -> tuple[str, ...]:
        """The keys of the device's taints that keep ``spec`` off it (ours, policy-managed, never)."""
        effects = BLOCKING_EFFECTS
        others = [taint for taint in device.taints if taint.get("key") != self.policy_taint]
        kept_out = [taint for taint in others if not taints_tolerated([taint], spec.tolerations, effects)]
        return tuple(str(taint.get("key")) for taint in kept_out)


def _eligible(per_node: Mapping[str, _NodeSelection], inventory: Mapping[str, NodeInventory]) -> Eligible:
    """The ``Eligible`` of per-node selections (nodes no longer in the inventory left out)."""
    devices: set[tuple[str, int]] = set()
    nodes: set[str] = set()
    matched: dict[str, tuple[Device, ...]] = {}
    tainted: dict[str, tuple[str, ...]] = {}
    total = 0
    for node, selection in per_node.items():
        if node not in inventory:
            continue
        total += selection.total
        tainted.update(selection.tainted)
        if selection.matched:
            nodes.add(node)
            matched[node] = selection.matched
            devices.update((node, device.card.index) for device in selection.matched)
    return Eligible(None if len(devices) == total else frozenset(devices), frozenset(nodes), matched, tainted)


def _bounded_put(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any, limit: int) -> None:
    """Store ``value``, dropping the oldest entries beyond ``limit`` (not the whole cache at once:
    a tenant's stream of new selectors must not make every other claim pay again)."""
    cache.pop(key, None)
    while len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value
