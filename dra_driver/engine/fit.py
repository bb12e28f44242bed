"""Per-card fit checks, in HAMi's order; the first failing check names the card's reason.

The order matters because a card is counted under the first reason only, and pending messages
(``"1/4 ExclusiveDeviceAllocateConflict, 3/4 CardInsufficientMemory"``) must match HAMi's.
"""

from __future__ import annotations

from dra_driver.engine.model import FULL_CORES, CardUsage, GpuCard, PlacementRequest
from dra_driver.engine.reasons import Reason


def product_matches(card: GpuCard, request: PlacementRequest) -> bool:
    """HAMi's ``CheckType``: upper-cased substrings; include must match one, exclude must match none."""
    product = card.product_name.upper()
    include = [token.strip().upper() for token in request.include_products if token.strip()]
    exclude = [token.strip().upper() for token in request.exclude_products if token.strip()]
    if include and not any(token in product for token in include):
        return False
    return not any(token in product for token in exclude)


def uuid_matches(card: GpuCard, request: PlacementRequest) -> bool:
    """HAMi's ``CheckUUID``: exact UUIDs after trimming."""
    include = {token.strip() for token in request.include_uuids if token.strip()}
    exclude = {token.strip() for token in request.exclude_uuids if token.strip()}
    if include and card.uuid not in include:
        return False
    return card.uuid not in exclude


def check_card(card: GpuCard, usage: CardUsage, request: PlacementRequest) -> Reason | None:
    """Return why ``card`` cannot take one GPU of ``request`` right now, or ``None`` if it can."""
    if not card.healthy:
        return Reason.CARD_NOT_HEALTH
    if not card.shares_enforced and not request.unenforced_shares and request.shares_card(card):
        return Reason.CARD_SHARES_NOT_ENFORCED
    if card.whole_only and request.shares_card(card):
        return Reason.CARD_WHOLE_ONLY
    if request.allowed_devices is not None and (card.node, card.index) not in request.allowed_devices:
        return Reason.DEVICE_SELECTOR_MISMATCH
    if (request.include_products or request.exclude_products) and not product_matches(card, request):
        return Reason.CARD_TYPE_MISMATCH
    if (request.include_uuids or request.exclude_uuids) and not uuid_matches(card, request):
        return Reason.CARD_UUID_MISMATCH
    if usage.tenants >= card.slots:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if request.policy.mutex and usage.tenants > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if card.memory - usage.used_memory < request.memory_on(card):
        return Reason.CARD_INSUFFICIENT_MEMORY
    if card.cores - usage.used_cores < request.cores:
        return Reason.CARD_INSUFFICIENT_CORE
    if card.cores == FULL_CORES and request.cores == FULL_CORES and usage.tenants > 0:
        # A whole-card compute request is exclusive: it cannot join a card that has tenants.
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if usage.used_cores >= card.cores and request.cores == 0:
        return Reason.CARD_COMPUTE_UNITS_EXHAUSTED
    return None
