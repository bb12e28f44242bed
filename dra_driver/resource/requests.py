"""A claim's device requests, parsed: classes, CEL selectors, capacity, count, tolerations.

A request of one of our DeviceClasses (``exactly``, or each ``firstAvailable`` subrequest in
order) becomes a ``RequestSpec``; capacity is validated here, once, with the slices' request
policy (memory rounded up to whole MiB, cores 0-100), so a request we cannot honour is refused
with its reason instead of being allocated with a wrong ``consumedCapacity``. Which devices a
request may use is the controller's question (``dra_driver/controller/eligibility.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.cel.values import ValueParseError, parse_quantity
from dra_driver.contract import CAPACITY_NAMES, MEMORY
from dra_driver.kube.api import ObjView
from dra_driver.quantity import MIB
from dra_driver.resource.capacity import consumed_amount
from dra_driver.resource.slices import capacity_entries


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
    tolerations: tuple[ObjView, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    name: str
    alternatives: tuple[RequestSpec, ...]


#: The memory capacity our slices publish (resource/slices.py), for its request policy only.
_MEMORY_POLICY = capacity_entries(memory=MIB, cores=100, slots=1)[MEMORY]


def _amount(value: Any, what: str, where: str) -> Fraction:
    """A capacity request as a number: a quantity, not negative."""
    try:
        amount = parse_quantity(str(value))
    except ValueParseError as err:
        raise RequestError(f"{where}: {what} {value!r}: {err}") from None
    if amount < 0:
        raise RequestError(f"{where}: {what} {value} is negative")
    return amount


def _memory(value: Any, where: str) -> int:
    # Rounded up by the request policy our slices publish, as kube-scheduler rounds it.
    consumed = consumed_amount(_MEMORY_POLICY, _amount(value, "memory", where))
    assert consumed is not None  # the memory range has no maximum
    return math.ceil(consumed)


def _cores(value: Any, where: str) -> int:
    cores = math.ceil(_amount(value, "cores", where))
    if cores > 100:
        raise RequestError(f"{where}: cores {value} exceeds 100 (percent of one GPU)")
    return cores


def _check_capacity_names(requested: ObjView, where: str) -> None:
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


def request_spec(name: str, body: ObjView, admin: bool) -> RequestSpec:
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


def claim_requests(claim: ObjView, is_ours: Callable[[Any], bool]) -> tuple[list[ClaimRequest], list[str]]:
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
