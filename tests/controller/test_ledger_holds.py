"""The ledger's holds (capacity kept for a nominated preemptor) and what-ifs (``hiding``): what the
engine state counts while they last, and that nothing else (quotas, claims) sees a hold."""

from __future__ import annotations

import pytest

from dra_driver.contract import DeviceId
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import DeviceShare, Placement
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.uses import Use
from tests.controller.harness import DRIVER

MIB = 1024 * 1024


def gpu(index: int, node: str = "n1") -> DeviceId:
    return DeviceId(DRIVER, node, f"gpu-{index}")


def used(ledger: Ledger, index: int, node: str = "n1") -> tuple[int, int]:
    """(tenants, memory) the engine state counts on the card."""
    usage = ledger.state.nodes[node].usage[index]
    return usage.tenants, usage.used_memory


def ledger_of(*nodes: str) -> Ledger:
    ledger = Ledger()
    slices = [
        item
        for node in nodes
        for item in build_resource_slices(
            profile_gpus("t4", node_name=node, gpus=2), node_name=node, driver_name=DRIVER
        )
    ]
    ledger.set_inventory(build_inventory(slices, DRIVER))
    return ledger


def test_a_hold_counts_on_its_card_like_an_allocation_and_nowhere_else() -> None:
    ledger = ledger_of("n1")
    ledger.hold("p", (Use(gpu(1), 4000 * MIB, 0, 1, namespace="team", class_name=DRIVER),))
    assert used(ledger, 1) == (1, 4000 * MIB)
    assert used(ledger, 0) == (0, 0)
    assert ledger.namespace_charges("team") == []  # a quota never counts a hold
    assert dict(ledger.claims()) == {}
    ledger.unhold("p")
    assert used(ledger, 1) == (0, 0)


def test_hiding_leaves_claims_and_holds_out_until_the_block_ends_nested_too() -> None:
    ledger = ledger_of("n1")
    ledger.set_claim("c1", (Use(gpu(0), 1000 * MIB, 0, 1),))
    ledger.set_claim("c2", (Use(gpu(0), 2000 * MIB, 0, 1),))
    ledger.hold("p", (Use(gpu(0), 500 * MIB, 0, 1),))
    assert used(ledger, 0) == (3, 3500 * MIB)
    with ledger.hiding({"c1"}):
        assert used(ledger, 0) == (2, 2500 * MIB)
        with ledger.hiding({"p", "c1"}):
            assert used(ledger, 0) == (1, 2000 * MIB)
            with ledger.trial() as trial:  # a plan inside a what-if sees the what-if
                trial.allocate(ledger_placement(0, 100))
            assert used(ledger, 0) == (1, 2000 * MIB)
        assert used(ledger, 0) == (2, 2500 * MIB)
    assert used(ledger, 0) == (3, 3500 * MIB)


def ledger_placement(index: int, memory_mib: int) -> Placement:
    return Placement("n1", (DeviceShare(index, memory_mib * MIB, 0),))


def test_hiding_restores_the_state_when_the_block_raises() -> None:
    ledger = ledger_of("n1")
    ledger.set_claim("c1", (Use(gpu(0), 1000 * MIB, 0, 1),))
    with pytest.raises(RuntimeError), ledger.hiding({"c1"}):
        raise RuntimeError("planning failed")
    assert used(ledger, 0) == (1, 1000 * MIB)


def test_a_hold_on_a_device_not_published_yet_counts_once_it_is() -> None:
    """A restarted controller reads holds back before it has every slice."""
    ledger = ledger_of("n1")
    ledger.hold("p", (Use(gpu(0, "n2"), None, None, None),))
    assert "n2" not in ledger.state.nodes
    both = ledger_of("n1", "n2").inventory
    ledger.set_inventory(both)
    card = ledger.state.nodes["n2"].cards[0]
    assert used(ledger, 0, "n2") == (card.slots, card.memory)  # a whole card: every slot, all memory
