"""A claim's ``spec.devices.constraints`` as typed values, read once where the claim is parsed.

Each constraint names one attribute that the devices of some of the claim's requests (all of them
when ``requests`` is empty) must share (``matchAttribute``) or must not repeat
(``distinctAttribute``); the API server accepts exactly one of the two per constraint. The planner
checks them on the policy's choice (dra_driver/controller/planner.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """One entry of ``spec.devices.constraints``."""

    #: The attribute the devices must share, or must not repeat when ``distinct``.
    attribute: str
    distinct: bool
    #: The requests (``req`` or ``req/sub``) it covers; empty: every request of the claim.
    requests: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> DeviceConstraint | None:
        """The constraint, or None for one that names no attribute (the API server refuses it;
        nothing to check)."""
        requests = frozenset(str(name) for name in raw.get("requests") or ())
        match = raw.get("matchAttribute")
        if match:
            return cls(str(match), False, requests)
        distinct = raw.get("distinctAttribute")
        if distinct:
            return cls(str(distinct), True, requests)
        return None

    def covers(self, request: str) -> bool:
        """Whether a result of ``request`` (``req`` or ``req/sub``) is among the constrained ones."""
        return not self.requests or request in self.requests or request.split("/", 1)[0] in self.requests


def parse_constraints(raw: Iterable[Mapping[str, Any]] | None) -> tuple[DeviceConstraint | None, ...]:
    """Every entry of ``spec.devices.constraints`` in order (None where one names no attribute, so
    that a constraint keeps its position in messages)."""
    return tuple(DeviceConstraint.parse(entry) for entry in raw or ())
