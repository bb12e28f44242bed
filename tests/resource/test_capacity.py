"""Consumable capacity (resource.k8s.io/v1): the one rule every reader of allocations applies.

What a result takes (``result_consumption``) is what kube-scheduler sums: nothing for adminAccess,
the whole device without a shareID, the share's consumedCapacity with one. What a request consumes
under a device's requestPolicy (``consumed_amount``) follows ``calculateConsumedCapacity``
(KEP-5075, as the DRA interfaces reference summarises it). The last tests check that the
controller's ledger, the kubelet plugin's overcommit check, the HAMi annotation and ``top`` all
answer with this rule.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dra_driver.controller.hami_annotation import encode_devices_allocated
from dra_driver.controller.ledger import card_capacity
from dra_driver.engine import GpuCard
from dra_driver.kubeletplugin.claims import ClaimRef, devices_for_node
from dra_driver.kubeletplugin.defence import usage_by_gpu
from dra_driver.kubeletplugin.inventory import NodeGpu
from dra_driver.quantity import GIB, MIB
from dra_driver.resource.capacity import (
    NOTHING,
    WHOLE_DEVICE,
    Capacity,
    Consumption,
    consumed_amount,
    consumption,
    policy_consumption,
    result_consumption,
)
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.slices import capacity_entries
from dra_driver.resource.uses import claim_uses
from dra_driver.top.objects import parse_claim

DRIVER = "gpu.hami.io"
SHARE_ID = "5f0c7a52-9d36-4a54-8a1b-6c0d2f0e1a11"
CARD = Capacity(memory=16 * GIB, cores=100, slots=10)


def result(**fields: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0", **fields}


# --- what a result takes -------------------------------------------------------------------------


def test_a_result_without_share_id_takes_the_whole_device() -> None:
    assert result_consumption(result()) == WHOLE_DEVICE
    assert result_consumption(result()).of(CARD) == CARD
    # consumedCapacity without a shareID is not a share: the device is still the result's alone.
    assert result_consumption(result(consumedCapacity={"memory": "1Gi"})).of(CARD) == CARD
    assert result_consumption(result(shareID="")).whole_device


def test_a_share_takes_its_consumed_capacity() -> None:
    share = result(shareID=SHARE_ID, consumedCapacity={"memory": "4Gi", "cores": "30", "slots": "1"})
    taken = result_consumption(share)
    assert taken == Consumption(whole_device=False, memory=4 * GIB, cores=30, slots=1)
    assert taken.of(CARD) == Capacity(4 * GIB, 30, 1)


def test_consumed_amounts_are_rounded_up_never_down() -> None:
    share = result(shareID=SHARE_ID, consumedCapacity={"memory": "1.5", "cores": "100m", "slots": "1500m"})
    assert result_consumption(share).of(CARD) == Capacity(2, 1, 2)


def test_missing_amounts_count_as_our_policies_minimums() -> None:
    # kube-scheduler lists every capacity; a hand-written share that does not takes no memory and
    # no cores, and always one tenant slot (never 0, whatever it says).
    bare = result_consumption(result(shareID=SHARE_ID))
    assert bare.of(CARD) == Capacity(0, 0, 1) and not bare.whole_device
    odd = result(shareID=SHARE_ID, consumedCapacity={"memory": "-1Gi", "cores": "lots", "slots": "0"})
    assert result_consumption(odd).of(CARD) == Capacity(0, 0, 1)


def test_admin_access_takes_nothing_even_without_share_id() -> None:
    assert result_consumption(result(adminAccess=True)) == NOTHING
    assert result_consumption(result(adminAccess=True)).of(CARD) == Capacity(0, 0, 0)
    assert result_consumption(result(shareID=SHARE_ID)) != NOTHING, "a share always takes a slot"


def test_parsed_amounts_read_as_their_quantities() -> None:
    """The kubelet plugin checkpoints consumed amounts as integers: the same rule applies."""
    as_quantities = consumption(SHARE_ID, {"memory": "1Gi", "cores": "10", "slots": "2"})
    assert consumption(SHARE_ID, {"memory": GIB, "cores": 10, "slots": 2}) == as_quantities


# --- what a request consumes under the device's requestPolicy ------------------------------------

RANGE = {
    "value": "16Gi",
    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "1Gi"}},
}
VALUES = {"value": "40", "requestPolicy": {"default": "10", "validValues": ["10", "20", "40"]}}


def test_not_requested_takes_the_default_else_the_whole_value() -> None:
    assert consumed_amount(RANGE, None) == GIB
    assert consumed_amount({"value": "100"}, None) == 100
    assert consumed_amount({"value": "100", "requestPolicy": {"validRange": {"min": "1"}}}, None) == 100


def test_requested_without_a_policy_is_taken_as_is() -> None:
    assert consumed_amount({"value": "100"}, "33500m") == Fraction(67, 2)


@pytest.mark.parametrize(
    ("requested", "consumed"),
    [
        ("1500Mi", 2 * GIB),  # rounded up to min + k * step
        ("512Mi", GIB),  # below min: min
        ("8Gi", 8 * GIB),  # on a step
        ("8193Mi", None),  # rounds past max: does not fit
    ],
)
def test_valid_range_rounds_up_to_a_step_within_max(requested: str, consumed: int | None) -> None:
    assert consumed_amount(RANGE, requested) == consumed


@pytest.mark.parametrize(("requested", "consumed"), [("5", 10), ("10", 10), ("11", 20), ("41", None)])
def test_valid_values_take_the_smallest_at_least_the_request(requested: str, consumed: int | None) -> None:
    assert consumed_amount(VALUES, requested) == consumed


def test_an_allocation_consumes_every_capacity_of_the_device() -> None:
    device = {"memory": RANGE, "cores": {"value": "100"}}
    assert policy_consumption(device, {"memory": "1500Mi"}) == {"memory": 2 * GIB, "cores": 100}
    assert policy_consumption(device, {}) == {"memory": GIB, "cores": 100}
    assert policy_consumption(device, {"memory": "9Gi"}) is None, "past the policy's max"
    assert policy_consumption(device, {"slots": "1"}) is None, "a capacity the device does not publish"


def test_our_published_policies() -> None:
    """What the kubelet plugin publishes: memory in 1Mi steps (the card when not asked for), cores
    in steps of 1 up to the card's, one slot per allocation."""
    ours = capacity_entries(16 * GIB + 123, 100, 10)
    assert policy_consumption(ours, {}) == {"memory": 16 * GIB, "cores": 0, "slots": 1}
    assert policy_consumption(ours, {"memory": "1000Ki", "cores": "10.5"}) == {
        "memory": MIB, "cores": 11, "slots": 1,
    }  # fmt: skip
    assert policy_consumption(ours, {"cores": "101"}) is None
    assert policy_consumption(ours, {"slots": "11"}) is None
    single = capacity_entries(GIB, 100, 1)
    assert consumed_amount(single["slots"], None) == 1 and consumed_amount(single["slots"], "2") is None


# --- every reader applies the one rule ----------------------------------------------------------

READ_RESULTS = [
    result(),
    result(shareID=SHARE_ID, consumedCapacity={"memory": "1536Mi", "cores": "25", "slots": "1"}),
    result(shareID=SHARE_ID, consumedCapacity={"memory": "1Gi"}),
    result(shareID=SHARE_ID),
    result(adminAccess=True),
]


@pytest.mark.parametrize("entry", READ_RESULTS)
def test_ledger_node_check_annotation_and_top_agree(entry: dict[str, Any]) -> None:
    expected = result_consumption(entry).of(CARD)
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}]}},
        "status": {"allocation": {"devices": {"results": [entry]}}},
    }
    card = GpuCard(
        node="node-1", index=0, memory=CARD.memory, cores=CARD.cores, slots=CARD.slots, uuid="GPU-0"
    )

    # The controller's ledger (quotas, explain and simulate --from-cluster read it too).
    uses = claim_uses(claim, DRIVER)
    if entry.get("adminAccess"):
        assert uses == ()
    else:
        (use,) = uses
        assert use.consumption.of(card_capacity(card)) == expected

    # The kubelet plugin's last-line overcommit check, on the claim as the plugin reads it.
    (device,) = devices_for_node(claim, ClaimRef("ns", "c", "u"), DRIVER, "node-1")
    gpu = NodeGpu("gpu-0", 0, 0, "GPU-0", "0000:01:00.0", CARD.memory, CARD.cores, CARD.slots)
    usage = usage_by_gpu([("u", device)], {"gpu-0": gpu}).get("gpu-0")
    node_sees = Capacity(usage.memory, usage.cores, usage.slots) if usage else Capacity(0, 0, 0)
    assert node_sees == expected

    # The HAMi annotation (MiB and percent).
    pod = {"spec": {"containers": [{"name": "a", "resources": {"claims": [{"name": "c"}]}}]}}
    annotation = encode_devices_allocated(
        PodView(pod), {"c": ClaimView(claim, DRIVER).results}, DRIVER, lambda _: card
    )
    assert annotation == f"GPU-0,NVIDIA,{expected.memory // MIB},{expected.cores}:;"

    # top.
    allocated = parse_claim(claim, DRIVER)
    assert allocated is not None
    (read,) = allocated.results
    if read.whole_card:
        assert expected == CARD
    else:
        assert Capacity(read.memory or 0, read.cores or 0, read.slots or 0) == expected
