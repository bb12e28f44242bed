"""Claim requests -> engine requests: classes, CEL selectors, capacity, counts, policy config.

A request of one of our DeviceClasses (``exactly``, or each ``firstAvailable`` subrequest in order)
becomes a ``RequestSpec``; which devices it may use is decided here with CEL (class selectors,
then the request's, exactly as kube-scheduler evaluates them, errors abort the claim) and device
taints (our own ``<driver>/policy-managed`` taint is the one we ignore). The engine receives that
device set as ``allowed_devices`` and the nodes that have such devices as ``allowed_nodes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import SelectorError, selectors_match
from dra_driver.cel.values import ValueParseError, parse_quantity
from dra_driver.config.classes import class_selectors
from dra_driver.contract import CAPACITY_NAMES
from dra_driver.controller.inventory import Device, NodeInventory
from dra_driver.controller.pods import taints_tolerated
from dra_driver.engine import MIB

Obj = Mapping[str, Any]
MAX_CACHED_SELECTIONS = 1024


class RequestError(ValueError):
    """A request we cannot allocate as written (the message goes to the pod's event)."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One allocatable alternative: a request, or one subrequest of a ``firstAvailable`` list."""

    name: str  # "gpu" or "gpu/small"
    class_name: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    memory: int | None  # bytes per device; None = the device's default (all of it)
    cores: int
    admin_access: bool
    tolerations: tuple[Obj, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    name: str
    alternatives: tuple[RequestSpec, ...]


def _memory(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(str(value))
    except ValueParseError as err:
        raise RequestError(f"{where}: memory {value!r}: {err}") from None
    if amount < 0:
        raise RequestError(f"{where}: memory {value} is negative")
    # The slices' request policy: validRange min 1Mi, step 1Mi (round up, like the scheduler).
    return max(MIB, math.ceil(amount / MIB) * MIB)


def _cores(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(str(value))
    except ValueParseError as err:
        raise RequestError(f"{where}: cores {value!r}: {err}") from None
    if amount < 0:
        raise RequestError(f"{where}: cores {value} is negative")
    cores = max(0, math.ceil(amount))
    if cores > 100:
        raise RequestError(f"{where}: cores {value} exceeds 100 (percent of one GPU)")
    return cores


def _check_capacity_names(requested: Obj, where: str) -> None:
    """Refuse what we cannot honour rather than ignore it (consumedCapacity would be wrong).

    kube-scheduler finds no device for a capacity the device does not publish, and would
    consume the ``slots`` asked for; the engine places exactly one slot per share.
    """
    unknown = sorted(str(key) for key in requested if key not in CAPACITY_NAMES)
    if unknown:
        raise RequestError(
            f"{where}: capacity {', '.join(unknown)} is not published by our devices "
            "(they offer memory, cores and slots)"
        )
    if "slots" in requested:
        try:
            slots = parse_quantity(str(requested["slots"]))
        except ValueParseError as err:
            raise RequestError(f"{where}: slots {requested['slots']!r}: {err}") from None
        if slots > 1:
            raise RequestError(
                f"{where}: slots {requested['slots']} is not supported: each share takes one slot"
            )


def request_spec(name: str, body: Obj, admin: bool) -> RequestSpec:
    requested = (body.get("capacity") or {}).get("requests") or {}
    _check_capacity_names(requested, name)
    mode = body.get("allocationMode") or "ExactCount"
    return RequestSpec(
        name=name,
        class_name=str(body.get("deviceClassName", "")),
        selectors=tuple(
            str(selector["cel"]["expression"])
            for selector in body.get("selectors") or ()
            if (selector.get("cel") or {}).get("expression")
        ),
        all_devices=mode == "All",
        count=int(body.get("count") or 1),
        memory=_memory(requested["memory"], name) if "memory" in requested else None,
        cores=_cores(requested["cores"], name) if "cores" in requested else 0,
        admin_access=admin,
        tolerations=tuple(body.get("tolerations") or ()),
    )


def claim_requests(claim: Obj, is_ours: Any) -> tuple[list[ClaimRequest], list[str]]:
    """Our requests of a claim, and the names of requests that belong to other drivers' classes."""
    ours, foreign = [], []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly"):
            body = request["exactly"]
            if is_ours(body.get("deviceClassName")):
                ours.append(ClaimRequest(name, (request_spec(name, body, bool(body.get("adminAccess"))),)))
            else:
                foreign.append(name)
        elif request.get("firstAvailable"):
            alternatives = tuple(
                request_spec(f"{name}/{sub.get('name')}", sub, False)
                for sub in request["firstAvailable"]
                if is_ours(sub.get("deviceClassName"))
            )
            if alternatives:
                ours.append(ClaimRequest(name, alternatives))
            else:
                foreign.append(name)
    return ours, foreign


@dataclass(frozen=True, slots=True)
class Eligible:
    """Devices a request may use, as ``(node, index)`` (None = all of ours), and the nodes holding them."""

    devices: frozenset[tuple[str, int]] | None
    nodes: frozenset[str]
    per_node: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    #: Devices the selectors chose but a taint the request does not tolerate kept out, as
    #: ``node/device`` -> taint keys: what a pending pod's reason names (an unhealthy GPU, say).
    tainted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class Matcher:
    """CEL + taint eligibility per (class, selectors, tolerations), cached until the inventory changes."""

    def __init__(self, driver: str, policy_taint: str) -> None:
        self.driver = driver
        self.policy_taint = policy_taint
        self._cache: dict[tuple[Any, ...], Eligible] = {}
        self._generation = -1

    def eligible(
        self,
        spec: RequestSpec,
        device_class: Obj,
        claim_subject: str,
        inventory: Mapping[str, NodeInventory],
        generation: int,
    ) -> Eligible:
        if generation != self._generation:
            self._cache.clear()
            self._generation = generation
        class_exprs = tuple(class_selectors(device_class))
        key = (
            spec.class_name,
            class_exprs,
            spec.selectors,
            repr(spec.tolerations),
            claim_subject if spec.selectors else "",
        )
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if len(self._cache) >= MAX_CACHED_SELECTIONS:
            self._cache.clear()  # per-claim selectors could otherwise grow it without bound
        devices, nodes, per_node, total = set(), set(), {}, 0
        tainted: dict[str, tuple[str, ...]] = {}
        for node, node_inventory in inventory.items():
            matched = []
            for device in sorted(node_inventory.devices.values(), key=lambda item: item.card.index):
                total += 1
                if not self._selected(spec, class_exprs, claim_subject, device):
                    continue
                keeping_out = self._untolerated(spec, device)
                if keeping_out:
                    tainted[f"{node}/{device.name}"] = keeping_out
                    continue
                matched.append(device)
                devices.add((node, device.card.index))
            if matched:
                nodes.add(node)
                per_node[node] = tuple(matched)
        eligible = Eligible(
            None if len(devices) == total else frozenset(devices), frozenset(nodes), per_node, tainted
        )
        self._cache[key] = eligible
        return eligible

    def _selected(self, spec: RequestSpec, class_exprs: Sequence[str], subject: str, device: Device) -> bool:
        try:
            if not selectors_match(f"class {spec.class_name}", class_exprs, device.cel):
                return False
            return not spec.selectors or selectors_match(subject, spec.selectors, device.cel)
        except SelectorError as err:
            raise RequestError(str(err)) from None

    def _untolerated(self, spec: RequestSpec, device: Device) -> tuple[str, ...]:
        """The keys of the device's taints that keep ``spec`` off it (ours, policy-managed, never)."""
        effects = ("NoSchedule", "NoExecute")
        others = [taint for taint in device.taints if taint.get("key") != self.policy_taint]
        kept_out = [taint for taint in others if not taints_tolerated([taint], spec.tolerations, effects)]
        return tuple(str(taint.get("key")) for taint in kept_out)
