"""HAMi's fit-failure reason names and its pending-message format.

The names are HAMi's exact strings (``pkg/device/common/common.go``) so that operators who know
HAMi read our pending reasons without a dictionary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import StrEnum


class Reason(StrEnum):
    """Why a card cannot take a request; a card is counted under the first check it fails."""

    CARD_NOT_HEALTH = "CardNotHealth"
    #: Not HAMi's: a share (below the whole card) on a card whose node cannot enforce its limits
    #: (no HAMi-core), for a DeviceClass that did not opt in with ``allowUnenforcedShares``.
    CARD_SHARES_NOT_ENFORCED = "CardSharesNotEnforced"
    #: Not HAMi's: a share on a card whose compute mode (Exclusive_Process, Prohibited) lets no two
    #: tenants use it; ``allowUnenforcedShares`` cannot change that.
    CARD_WHOLE_ONLY = "CardComputeModeWholeOnly"
    #: Not HAMi's: the card is outside the request's eligible set (DRA CEL selectors, device taints).
    DEVICE_SELECTOR_MISMATCH = "DeviceSelectorMismatch"
    #: Not HAMi's (MIG, issue 37): the instance has another profile than the request names.
    MIG_PROFILE_MISMATCH = "MigProfileMismatch"
    #: Not HAMi's (MIG): the instance is given out whole to another claim already.
    MIG_INSTANCE_IN_USE = "MigInstanceInUse"
    #: Not HAMi's (MIG on demand): the placement overlaps an instance in use on its card (memory
    #: slices), or its card has not enough compute slices left.
    MIG_PLACEMENT_TAKEN = "MigPlacementTaken"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    NUMA_NOT_FIT = "NumaNotFit"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"


def format_reasons(reasons: Iterable[Reason | None], total_cards: int) -> str:
    """HAMi's ``GenReason``: ``"<count>/<cards> <Reason>"`` per reason, sorted as strings, joined by ``", "``.

    Sorting whole strings (so ``10/12 X`` precedes ``2/12 Y``) is HAMi's behaviour; we keep it so
    messages are byte-identical to what HAMi users have seen.
    """
    counts = Counter(reason for reason in reasons if reason is not None)
    return ", ".join(sorted(f"{count}/{total_cards} {reason.value}" for reason, count in counts.items()))
