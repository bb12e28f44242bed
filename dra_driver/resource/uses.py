"""What an allocated claim takes from our devices: its ``Use`` of each device, read once.

Read from a claim's ``status.allocation`` whoever wrote it (our controller, kube-scheduler, a
human), by the consumable-capacity rule of ``dra_driver/resource/capacity.py``. The typed claim
(``objects.ClaimView.uses``), the controller's ledger and quotas, and the allocator's assumption
of what it is about to write all come from ``claim_uses``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.resource.capacity import WHOLE_DEVICE, Consumption, result_consumption


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
    classes: dict[str, str] = {}
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly"):
            classes[name] = str(request["exactly"].get("deviceClassName", ""))
        for sub in request.get("firstAvailable") or ():
            classes[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return classes


def claim_uses(claim: Mapping[str, Any], driver: str) -> tuple[Use, ...]:
    """The device uses recorded in a claim's ``status.allocation`` for our driver."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = [
        result
        for result in (allocation.get("devices") or {}).get("results") or ()
        if result.get("driver") == driver and not result.get("adminAccess")
    ]
    if not results:
        return ()
    namespace = str((claim.get("metadata") or {}).get("namespace") or "")
    classes = request_classes(claim)
    uses = []
    for result in results:
        device = DeviceId(driver, str(result.get("pool", "")), str(result.get("device", "")))
        where = {"namespace": namespace, "class_name": classes.get(str(result.get("request", "")), "")}
        taken = result_consumption(result)
        if taken.whole_device:
            uses.append(Use(device, None, None, None, **where))
        else:
            uses.append(Use(device, taken.memory, taken.cores, taken.slots, **where))
    return tuple(uses)
