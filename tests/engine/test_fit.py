"""Per-card fit checks and HAMi's reason accounting."""

import pytest

from dra_driver.engine import ClusterState, Reason, format_reasons, place
from tests.engine.helpers import request, t4, tenants


def _reasons(state: ClusterState, **kwargs: object) -> dict[int, Reason | None]:
    decision = place(state, request(**kwargs))  # type: ignore[arg-type]
    return {card.index: card.reason for card in decision.candidates}


def test_each_check_names_its_reason() -> None:
    state = ClusterState(
        [
            t4(0, healthy=False),
            t4(1, slots=1),
            t4(2),
            t4(3, cores=100),
        ]
    )
    tenants(state, "node-1", 1, 1)  # slot exhausted
    tenants(state, "node-1", 2, 1, memory_mib=15000)  # too little memory left
    tenants(state, "node-1", 3, 1, memory_mib=0, cores=100)  # compute exhausted
    reasons = _reasons(state, memory_mib=1000, cores=0)
    assert reasons == {
        0: Reason.CARD_NOT_HEALTH,
        1: Reason.CARD_TIME_SLICING_EXHAUSTED,
        2: Reason.CARD_INSUFFICIENT_MEMORY,
        3: Reason.CARD_COMPUTE_UNITS_EXHAUSTED,
    }


def test_core_request_checks() -> None:
    state = ClusterState([t4(0), t4(1), t4(2)])
    tenants(state, "node-1", 0, 1, cores=60)
    tenants(state, "node-1", 1, 1, cores=10)
    reasons = _reasons(state, cores=50)
    assert reasons == {0: Reason.CARD_INSUFFICIENT_CORE, 1: None, 2: None}
    # A 100-core request needs an idle card even if the cores look free.
    state2 = ClusterState([t4(0), t4(1)])
    tenants(state2, "node-1", 0, 1, cores=0)
    assert _reasons(state2, cores=100) == {0: Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, 1: None}


def test_type_and_uuid_filters() -> None:
    state = ClusterState(
        [
            t4(0, uuid="GPU-a"),
            t4(1, uuid="GPU-b").__class__(
                node="node-1",
                index=1,
                memory=80 * 1024**3,
                product_name="NVIDIA A100-SXM4-80GB",
                uuid="GPU-b",
            ),
        ]
    )
    assert _reasons(state, include_products=("a100",)) == {0: Reason.CARD_TYPE_MISMATCH, 1: None}
    assert _reasons(state, exclude_products=(" T4 ",)) == {0: Reason.CARD_TYPE_MISMATCH, 1: None}
    # HAMi's substring rule: A10 matches A100.
    assert _reasons(state, include_products=("A10",))[1] is None
    assert _reasons(state, include_uuids=("GPU-b",)) == {0: Reason.CARD_UUID_MISMATCH, 1: None}
    assert _reasons(state, exclude_uuids=("GPU-b",)) == {0: None, 1: Reason.CARD_UUID_MISMATCH}


def test_mutex_reason_and_pending_message() -> None:
    state = ClusterState([t4(i) for i in range(4)])
    for index in range(4):
        tenants(state, "node-1", index, 1)
    decision = place(state, request("mutex"))
    assert not decision.allocated
    assert decision.reason == "4/4 ExclusiveDeviceAllocateConflict"


def test_memory_percent_is_per_card_and_floored_to_mib() -> None:
    state = ClusterState([t4(0)])
    decision = place(state, request(memory_mib=None, memory_percent=10))
    assert decision.placement is not None
    assert decision.placement.devices[0].memory == 1536 * 1024 * 1024


def test_whole_card_by_default() -> None:
    state = ClusterState([t4(0), t4(1)])
    tenants(state, "node-1", 0, 1, memory_mib=1)
    decision = place(state, request(memory_mib=None))
    assert decision.placement is not None and decision.placement.devices[0].index == 1
    assert decision.placement.devices[0].memory == 15360 * 1024 * 1024


def test_format_reasons_sorts_whole_strings_like_hami() -> None:
    reasons = [Reason.CARD_INSUFFICIENT_MEMORY] * 2 + [Reason.CARD_UUID_MISMATCH] * 10
    assert format_reasons(reasons, 12) == "10/12 CardUuidMismatch, 2/12 CardInsufficientMemory"
    assert format_reasons([None, None], 2) == ""


@pytest.mark.parametrize("count", [2, 3])
def test_multi_gpu_insufficient_counts_accepted_cards(count: int) -> None:
    state = ClusterState([t4(0), t4(1)])
    tenants(state, "node-1", 0, 1)
    decision = place(state, request("mutex", count=count))
    assert not decision.allocated
    assert "1/2 AllocatedCardsInsufficientRequest" in (decision.reason or "")
    assert "1/2 ExclusiveDeviceAllocateConflict" in (decision.reason or "")


def test_allowed_devices_filter_has_its_own_reason() -> None:
    state = ClusterState([t4(0), t4(1), t4(2)])
    reasons = _reasons(state, allowed_devices=frozenset({("node-1", 1)}))
    assert reasons == {0: Reason.DEVICE_SELECTOR_MISMATCH, 1: None, 2: Reason.DEVICE_SELECTOR_MISMATCH}
    decision = place(state, request(allowed_devices=frozenset()))
    assert decision.reason == "3/3 DeviceSelectorMismatch"


def test_a_card_that_cannot_enforce_shares_takes_only_whole_requests_unless_the_class_opts_in() -> None:
    state = ClusterState([t4(0, shares_enforced=False), t4(1)])
    assert _reasons(state, memory_mib=1000) == {0: Reason.CARD_SHARES_NOT_ENFORCED, 1: None}
    assert _reasons(state, memory_mib=None, cores=50) == {0: Reason.CARD_SHARES_NOT_ENFORCED, 1: None}
    assert _reasons(state, memory_mib=None, cores=100) == {0: None, 1: None}  # a whole card
    assert _reasons(state, memory_mib=1000, unenforced_shares=True) == {0: None, 1: None}


def test_a_card_whose_compute_mode_forbids_sharing_takes_only_whole_requests_whatever_the_class() -> None:
    state = ClusterState([t4(0, whole_only=True), t4(1)])
    assert _reasons(state, memory_mib=1000) == {0: Reason.CARD_WHOLE_ONLY, 1: None}
    assert _reasons(state, memory_mib=None, cores=50) == {0: Reason.CARD_WHOLE_ONLY, 1: None}
    # allowUnenforcedShares cannot help: two processes cannot hold contexts on the card at all.
    assert _reasons(state, memory_mib=1000, unenforced_shares=True) == {0: Reason.CARD_WHOLE_ONLY, 1: None}
    assert _reasons(state, memory_mib=None, cores=100) == {0: None, 1: None}  # a whole card
