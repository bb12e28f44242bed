"""Consumable capacity (resource.k8s.io/v1, KEP-5075): what an allocation takes from a device.

The two rules every reader and writer of allocations must agree on, each coded here only:

* **What one allocation result takes** (:func:`consumption`, :func:`result_consumption`), as
  kube-scheduler sums results (``GatherAllocatedState``): a result with ``adminAccess`` takes
  nothing; a result without a ``shareID`` takes the whole device; a result with one takes its
  ``consumedCapacity``. Amounts are rounded up to whole numbers (our request policies have whole
  steps, so a fraction written by anyone else is counted up, never down: a card may look fuller
  than it is, never emptier), and a share takes at least our policies' minimums: nothing of
  ``memory``/``cores`` when not listed, one of ``slots`` (each share is one tenant). Used by the
  controller's ledger (hence quotas, ``explain`` and ``simulate --from-cluster``), the kubelet
  plugin's last-line overcommit check, the HAMi annotation and ``top``.
* **What a request consumes given the device's ``requestPolicy``** (:func:`consumed_amount`,
  :func:`policy_consumption`), as ``calculateConsumedCapacity`` computes it: not requested, the
  policy's ``default`` else the full ``value``; requested without a policy, the amount as is;
  ``validRange``: below ``min`` takes ``min``, a ``step`` rounds up to ``min + k*step``, above
  ``max`` does not fit; ``validValues``: the smallest valid value at least the request, none does
  not fit. Used by the sandbox's first-fit allocator (kube-scheduler's stand-in).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from dra_driver.contract import CORES, MEMORY, SLOTS
from dra_driver.quantity import ceil_quantity, optional_quantity


class Capacity(NamedTuple):
    """A device's consumable totals, or what an allocation takes of them."""

    memory: int  # bytes
    cores: int  # percent of one GPU
    slots: int  # tenants


@dataclass(frozen=True, slots=True)
class Consumption:
    """What one allocation result takes from its device: the whole device, or amounts."""

    whole_device: bool
    memory: int = 0
    cores: int = 0
    slots: int = 0

    def of(self, device: Capacity) -> Capacity:
        """The amounts taken from ``device`` (all of it for a whole-device result)."""
        return device if self.whole_device else Capacity(self.memory, self.cores, self.slots)


#: An ``adminAccess`` result: it reaches the device without consuming any of it. The only
#: consumption without a slot (a share takes at least one), so ``== NOTHING`` tells admin access.
NOTHING = Consumption(whole_device=False)
#: A result without a ``shareID``: the device is the result's alone.
WHOLE_DEVICE = Consumption(whole_device=True)


def consumption(
    share_id: object, consumed: Mapping[str, object] | None, *, admin_access: bool = False
) -> Consumption:
    """The consumable-capacity rule for one result's ``shareID``, ``consumedCapacity``, ``adminAccess``.

    ``consumed`` values may be quantities (as in the API) or whole numbers already parsed.
    An amount that is not a quantity counts as absent.
    """
    if admin_access:
        return NOTHING
    if not share_id:
        return WHOLE_DEVICE
    amounts = consumed or {}
    return Consumption(
        whole_device=False,
        memory=max(0, ceil_quantity(amounts.get(MEMORY)) or 0),
        cores=max(0, ceil_quantity(amounts.get(CORES)) or 0),
        slots=max(1, ceil_quantity(amounts.get(SLOTS)) or 1),
    )


def result_consumption(result: Mapping[str, Any]) -> Consumption:
    """:func:`consumption` of one ``status.allocation.devices.results[]`` entry."""
    return consumption(
        result.get("shareID"), result.get("consumedCapacity"), admin_access=bool(result.get("adminAccess"))
    )


def consumed_amount(capacity: Mapping[str, Any], requested: object | None) -> Fraction | None:
    """What a request for ``requested`` (None: not requested) consumes of one device capacity.

    ``capacity`` is a ``DeviceCapacity`` (``value`` and an optional ``requestPolicy``). None when
    the request does not fit the policy (above ``validRange.max`` or every ``validValues``).
    Quantities that do not parse count as 0, as validation would have refused them.
    """
    policy: Mapping[str, Any] = capacity.get("requestPolicy") or {}
    if requested is None:
        default = policy.get("default")
        return _amount(default if default is not None else capacity.get("value"))
    want = _amount(requested)
    valid_values = policy.get("validValues")
    valid_range = policy.get("validRange")
    if valid_range is not None:
        low = _amount(valid_range.get("min"))
        want = max(want, low)
        step = _amount(valid_range.get("step"))
        if step > 0:
            want = low + math.ceil((want - low) / step) * step
        high = optional_quantity(valid_range.get("max"))
        return None if high is not None and want > high else want
    if valid_values is not None:
        fitting = (
            value for value in map(optional_quantity, valid_values) if value is not None and value >= want
        )
        return min(fitting, default=None)
    return want


def policy_consumption(
    capacities: Mapping[str, Mapping[str, Any]], requested: Mapping[str, Any]
) -> dict[str, Fraction] | None:
    """What one allocation of a multi-allocatable device consumes, per capacity of the device.

    Every capacity of the device is consumed (its default when not requested), as kube-scheduler
    lists all of them in ``consumedCapacity``. None when the device does not fit: a requested
    capacity it does not publish, or one its policy refuses.
    """
    if any(name not in capacities for name in requested):
        return None
    out = {}
    for name, capacity in capacities.items():
        amount = consumed_amount(capacity, requested.get(name))
        if amount is None:
            return None
        out[name] = amount
    return out


def _amount(value: object) -> Fraction:
    return optional_quantity(value) or Fraction(0)
