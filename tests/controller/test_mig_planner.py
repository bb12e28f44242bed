"""MIG classes through the planner (issue 37): placed among MIG instances by the policy chain,
given out whole, never mixed with cards; what the allocation and the decision record say."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.allocation import build_allocation
from dra_driver.controller.decision_record import request_record
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.planner import PlanInput, Planner, PodPlan
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import allocation_results
from dra_driver.resource.requests import claim_requests
from dra_driver.resource.uses import uses_of
from tests.controller.harness import DRIVER, NS, claim, device_class, exactly
from tests.controller.mig_world import MIG_CLASS, SEVEN_1G, mig_class, mig_slices, profile_selector
from tests.controller.worlds import planner


def mig_planner(cards: list[list[str] | None], policy: str = "binpack") -> tuple[Ledger, Planner]:
    classes = {MIG_CLASS: mig_class(policy), DRIVER: device_class(DRIVER, {"policy": "binpack"})}
    return planner(classes=classes, slices=mig_slices(cards))


def plan_one(obj: dict[str, Any], on: Planner) -> PodPlan:
    """One claim planned on n1 for a pod with no annotations (both classes are ours)."""
    requests, _ = claim_requests(obj, lambda name: name in (DRIVER, MIG_CLASS))
    return on.plan(PodView.parse({}), [PlanInput(ClaimView(obj, DRIVER), requests)], frozenset({"n1"}), None)


def mig_claim(name: str, profile: str | None = None, **body: Any) -> dict[str, Any]:
    if profile is not None:
        body["selectors"] = profile_selector(profile)
    return claim(name, exactly("mig", MIG_CLASS, **body))


def devices_of(plan: PodPlan) -> list[str]:
    assert plan.reason is None, plan.reason
    return [r.device.device for claim_plan in plan.claims for r in claim_plan.results]


def record(ledger: Ledger, plan: PodPlan, name: str) -> None:
    """What the informer would show once the claim is written: its uses in the ledger."""
    claim_plan = plan.claims[0]
    allocation = build_allocation(claim_plan, "n1", lambda _: None, {"mig": MIG_CLASS})
    uses = uses_of(allocation_results(allocation), DRIVER, NS, {"mig": MIG_CLASS})
    ledger.set_claim(name, uses)


def test_three_1g_claims_binpack_on_one_card_and_a_7g_takes_the_untouched_card() -> None:
    ledger, p = mig_planner([SEVEN_1G, ["7g.141gb"], SEVEN_1G])
    got = []
    for n in range(3):
        plan = plan_one(mig_claim(f"c{n}", "1g.18gb"), p)
        got += devices_of(plan)
        record(ledger, plan, f"c{n}")
    # gpu-0's 1g instances at slices 0, 1, 2 (GPU instance ids 7, 8, 9): slices 4-7 stay whole.
    assert got == ["gpu-0-mig-7-0", "gpu-0-mig-8-0", "gpu-0-mig-9-0"]
    seven = plan_one(mig_claim("big", "7g.141gb"), p)
    assert devices_of(seven) == ["gpu-1-mig-0-0"]


def test_spread_puts_each_1g_on_another_card() -> None:
    ledger, p = mig_planner([SEVEN_1G, SEVEN_1G], policy="spread")
    got = []
    for n in range(2):
        plan = plan_one(mig_claim(f"c{n}", "1g.18gb"), p)
        got += devices_of(plan)
        record(ledger, plan, f"c{n}")
    assert got == ["gpu-0-mig-7-0", "gpu-1-mig-7-0"]


def test_a_mig_result_is_whole_and_the_card_class_never_gets_a_mig_instance() -> None:
    _, p = mig_planner([None, SEVEN_1G])
    plan = plan_one(mig_claim("m", "1g.18gb"), p)
    allocation = build_allocation(plan.claims[0], "n1", lambda _: None, {"mig": MIG_CLASS})
    (result,) = allocation["devices"]["results"]
    assert result == {"request": "mig", "driver": DRIVER, "pool": "n1", "device": "gpu-1-mig-7-0"}
    # The card class: only gpu-0 (card 1 is in MIG mode and never given out whole nor as shares).
    whole = plan_one(claim("w", exactly("gpu", DRIVER, count=2)), p)
    assert whole.reason is not None
    assert devices_of(plan_one(claim("w", exactly("gpu", DRIVER)), p)) == ["gpu-0"]


def test_a_memory_request_takes_the_smallest_instance_that_holds_it() -> None:
    _, p = mig_planner([["3g.71gb", "1g.35gb@4", "1g.18gb@6"]])
    plan = plan_one(mig_claim("m", capacity={"requests": {"memory": "20Gi"}}), p)
    assert devices_of(plan) == ["gpu-0-mig-5-0"]  # the 1g.35gb at slices 4-5


def test_cores_are_refused_for_a_mig_class_with_the_fix() -> None:
    _, p = mig_planner([SEVEN_1G])
    plan = plan_one(mig_claim("m", capacity={"requests": {"cores": "30"}}), p)
    assert plan.reason is not None and "whole MIG instances" in plan.reason and "profile" in plan.reason


def test_a_pending_mig_claim_names_why_each_instance_lost() -> None:
    ledger, p = mig_planner([["3g.71gb", "1g.18gb@4"]])
    first = plan_one(mig_claim("a", "1g.18gb"), p)
    record(ledger, first, "a")
    plan = plan_one(mig_claim("b", "1g.18gb"), p)
    assert plan.reason == ("claim default/b request mig: 1/2 DeviceSelectorMismatch, 1/2 MigInstanceInUse")
    (decision,) = [d.decision for d in plan.decisions]
    rec = request_record("claim default/b request mig", decision, "binpack", ledger.device_name)
    by_device = {card.device: card for card in rec.cards}
    assert by_device["n1/gpu-0-mig-11-0"].reason == "MigInstanceInUse"
    assert by_device["n1/gpu-0-mig-1-0"].reason == "DeviceSelectorMismatch"


def test_the_decision_record_names_the_chosen_instance_and_its_placement() -> None:
    ledger, p = mig_planner([SEVEN_1G])
    plan = plan_one(mig_claim("a", "1g.18gb"), p)
    (decision,) = [d.decision for d in plan.decisions]
    rec = request_record("claim default/a request mig", decision, "binpack", ledger.device_name)
    assert rec.devices == ("gpu-0-mig-7-0",)
    chosen = next(card for card in rec.cards if card.chosen)
    assert chosen.device == "n1/gpu-0-mig-7-0"
    assert chosen.note == "1g.18gb at slice 0 of gpu-0 (0 in use); leaves free blocks 4+2+1 (of 8)"


def test_quota_charges_count_the_instance_memory() -> None:
    ledger, p = mig_planner([["3g.71gb", "1g.18gb@4"]])
    plan = plan_one(mig_claim("a", "3g.71gb"), p)
    allocation = build_allocation(plan.claims[0], "n1", lambda _: None, {"mig": MIG_CLASS})
    (use,) = uses_of(allocation_results(allocation), DRIVER, NS, {"mig": MIG_CLASS})
    charge = ledger.charge(use)
    assert charge.memory == 71424 * 1024 * 1024 and charge.cores == 42
    assert charge.class_name == MIG_CLASS


def test_binpack_keeps_the_largest_free_placement_next_to_an_instance_in_use() -> None:
    ledger, p = mig_planner([SEVEN_1G])
    # Someone else (kube-scheduler, a human) holds the 1g at slice 4: first fit would take slice 0;
    # binpack takes slice 5, so slices 0-3 stay free for a 3g or 4g.
    taken = {"gpu": "gpu-0-mig-11-0"}
    ledger.set_claim("other", uses_of(_results(taken), DRIVER, NS, {}))
    assert devices_of(plan_one(mig_claim("b", "1g.18gb"), p)) == ["gpu-0-mig-12-0"]


def _results(devices: dict[str, str]) -> Any:
    allocation = {
        "devices": {
            "results": [
                {"request": request, "driver": DRIVER, "pool": "n1", "device": device}
                for request, device in devices.items()
            ]
        }
    }
    return allocation_results(allocation)


def test_a_card_published_whole_beside_its_mig_instances_is_never_placed() -> None:
    slices = mig_slices([None, SEVEN_1G])
    devices = slices[0]["spec"]["devices"]
    whole = next(d for d in devices if d["name"] == "gpu-0")
    # Someone else's slice (or a bug) publishes card 1 whole too: the controller places only its instances.
    devices.append({**whole, "name": "gpu-1", "attributes": {**whole["attributes"], "index": {"int": 1}}})
    classes = {MIG_CLASS: mig_class(), DRIVER: device_class(DRIVER, {"policy": "binpack"})}
    ledger, p = planner(classes=classes, slices=slices)
    assert [device.name for device in ledger.inventory["n1"].devices.values()] == ["gpu-0"]
    assert plan_one(claim("w", exactly("gpu", DRIVER, count=2)), p).reason is not None
