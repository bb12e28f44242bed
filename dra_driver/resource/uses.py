"""What an allocated claim takes from our devices: its ``Use`` of each device, read once.

Read from a claim's ``status.allocation`` whoever wrote it (our controller, kube-scheduler, a
human), by the consumable-capacity rule of ``dra_driver/resource/capacity.py``. The typed claim
(``objects.ClaimView.uses``), the controller's ledger and quotas, and the allocator's assumption
of what it is about to write all come from ``claim_uses``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.resource.capacity import WHOLE_DEVICE, Consumption, result_consumption
from dra_driver.resource.refs import AllocationResult, allocation_results, claim_request_refs


@dataclass(frozen=True, slots=True)
class Use:
    """What one result takes from one device; ``None`` amounts mean the whole card."""

    device: DeviceId
    memory: int | None
    cores: int | None
    slots: int | None
    #: The claim's namespace and the result's DeviceClass: what namespace quotas count by.
    namespace: str = ""
    class_name: str = ""

    @property
    def consumption(self) -> Consumption:
        """What the use takes, as ``resource/capacity.py`` says (``of(card)`` gives the amounts)."""
        if self.memory is None:
            return WHOLE_DEVICE
        return Consumption(False, self.memory, self.cores or 0, self.slots or 1)


def request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request name (``gpu``, or ``gpu/small`` for a firstAvailable entry) -> DeviceClass name."""
    return {ref.key: ref.class_name for ref in claim_request_refs(claim)}


def uses_of(
    results: Iterable[AllocationResult], driver: str, namespace: str, classes: Mapping[str, str]
) -> tuple[Use, ...]:
    """The device uses of allocation ``results`` for our driver (adminAccess takes nothing)."""
    uses = []
    for result in results:
        if result.device.driver != driver or result.admin_access:
            continue
        where = {"namespace": namespace, "class_name": classes.get(result.request, "")}
        taken = result_consumption(result.raw)
        if taken.whole_device:
            uses.append(Use(result.device, None, None, None, **where))
        else:
            uses.append(Use(result.device, taken.memory, taken.cores, taken.slots, **where))
    return tuple(uses)


def claim_uses(claim: Mapping[str, Any], driver: str) -> tuple[Use, ...]:
    """The device uses recorded in a claim's ``status.allocation`` for our driver."""
    results = allocation_results((claim.get("status") or {}).get("allocation"))
    if not any(result.device.driver == driver and not result.admin_access for result in results):
        return ()
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    return uses_of(results, driver, namespace, request_classes(claim))
