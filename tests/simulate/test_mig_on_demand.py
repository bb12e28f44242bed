"""``hami-dra simulate`` with cards in MIG on demand (issue 37 items 2 and 4): claims get possible
placements chosen by the policy chain (binpack packs 1g slices low on one card and keeps an
untouched card for a 7g; spread alternates), held placements block their slices and are charged
to quotas by their profile's memory, and a cluster snapshot keeps what a card offers and who holds
what."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import main
from dra_driver.controller.offline import ClusterObjects
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.simulated import parse_devices
from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.simulate.run import run_scenario
from dra_driver.simulate.scenario import ScenarioError, parse_scenario
from dra_driver.simulate.snapshot import take_snapshot

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mig" / "simulate-on-demand.yaml"
DRIVER = "gpu.hami.io"
GIB = 1024**3
MIG_CLASS = f"mig.{DRIVER}"


def results(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    assert main(["simulate", str(EXAMPLE), "--output", "json", *args]) == 0
    return {r["claim"]: r for r in json.loads(capsys.readouterr().out)["results"]}


def chosen(result: dict[str, Any]) -> list[str]:
    return [d["name"] for d in result["devices"]]


def test_the_example_packs_1g_placements_low_and_gives_the_7g_an_untouched_card(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = results(capsys)
    assert {claim: chosen(r) for claim, r in got.items()} == {
        "a": ["gpu-0-mig-1g18gb-at-0"],
        "b": ["gpu-0-mig-1g18gb-at-1"],
        "c": ["gpu-0-mig-1g18gb-at-2"],
        "big": ["gpu-1-mig-7g141gb-at-0"],
        "team-b-1": ["gpu-0-mig-1g18gb-at-3"],
        "team-b-2": [],
        "mid": ["gpu-0-mig-3g71gb-at-4"],
        "whole-card": ["gpu-2"],
    }
    # A placement is charged its profile's memory (16.5 GiB), not the card's: one fits in 20 GiB.
    assert got["a"]["devices"][0]["memory"] == 16896 * 1024**2
    assert got["team-b-2"]["quota"] == "team-b/cap"
    assert got["team-b-2"]["reason"] == (
        "GpuQuotaExceeded: team-b/cap memory: used 16896Mi + requested 16896Mi > hard 20Gi"
    )
    note = next(c["note"] for c in got["c"]["candidates"] if c["chosen"])
    assert note == "1g.18gb at slice 2 of gpu-0 (2 in use); leaves free blocks 4+1 (of 4+2)"
    # Once card 1 holds the 7g, its 1g placements lose to it, by name.
    lost = {c["name"]: c["reason"] for c in got["team-b-1"]["candidates"]}
    assert lost["gpu-1-mig-1g18gb-at-0"] == "MigPlacementTaken"
    assert lost["gpu-0-mig-1g18gb-at-0"] == "MigInstanceInUse"


def test_spread_alternates_cards_and_leaves_no_card_for_the_7g() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["defaults"]["policy"] = "spread"
    decisions = {d.request: d for d in run_scenario(parse_scenario(data)).decisions}
    names = {claim: [c.device for c in decisions[claim].candidates if c.chosen] for claim in ("a", "b", "c")}
    assert names == {
        "a": ["gpu-0-mig-1g18gb-at-0"],
        "b": ["gpu-1-mig-1g18gb-at-0"],
        "c": ["gpu-0-mig-1g18gb-at-1"],
    }
    assert decisions["big"].placement is None
    assert decisions["big"].reason == "2/36 MigPlacementTaken, 34/36 MigProfileMismatch"


def test_the_table_names_the_placement_and_the_card_memory_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "big (binpack): node-1 gpu-1-mig-7g141gb-at-0" in out
    # A card's placements overlap: its memory is its largest placement's, not their sum.
    assert "0Mi/143360Mi" in out and "712448Mi" not in out


def scenario(gpu: dict[str, Any], claims: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    base = {"index": 0, "productName": "NVIDIA H100 80GB HBM3", "memory": "80Gi", "migOnDemand": True}
    return {
        "nodes": [{"name": "n", "gpus": [{**base, **gpu}]}],
        "claims": claims or [{"name": "x", "profile": "1g.10gb"}],
    }


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"productName": "Tesla T4"}, "migOnDemand: productName 'Tesla T4' has no MIG profiles"),
        ({"allocations": [{"memory": "1Gi"}]}, "mark its instances inUse"),
        ({"migDevices": [{"profile": "1g.10gb+me", "inUse": True}]}, "offers no \\+me profile"),
        ({"migDevices": ["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"]}, None),
        (
            {"migDevices": [*(f"1g.10gb@{s}" for s in range(6)), "1g.20gb@6", "2g.20gb@4"]},
            "does not fit next to",
        ),
        ({"migDevices": [*(f"1g.10gb@{s}" for s in range(6)), {"profile": "1g.20gb", "start": 6}]}, None),
    ],
)
def test_scenario_errors_name_what_is_wrong(gpu: dict[str, Any], message: str | None) -> None:
    data = scenario(gpu)
    if message is None:
        parse_scenario(data, "s.yaml")  # valid: within the card's slices and compute
        return
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data, "s.yaml")


def test_held_placements_block_their_slices_and_are_charged_to_their_namespace() -> None:
    gpu = {"migDevices": [{"profile": "3g.40gb", "start": 4, "inUse": True, "namespace": "t"}]}
    data = scenario(gpu, [{"name": "x", "namespace": "t", "profile": "3g.40gb"}])
    data["quotas"] = [{"name": "q", "namespace": "t", "hard": {"memory": "60Gi"}}]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert decision.placement is None
    assert decision.reason is not None and "used 40448Mi + requested 40448Mi > hard 60Gi" in decision.reason
    del data["quotas"]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert [c.device for c in decision.candidates if c.chosen] == ["gpu-0-mig-3g40gb-at-0"]
    reasons = {c.device: c.reason for c in decision.candidates}
    assert reasons["gpu-0-mig-3g40gb-at-4"] is not None and reasons["gpu-0-mig-3g40gb-at-4"].value == (
        "MigInstanceInUse"
    )


def test_an_instance_no_claim_holds_is_not_ours_and_its_slices_are_not_offered() -> None:
    data = scenario({"migDevices": ["4g.40gb@0"]}, [{"name": "x", "mig": True, "count": 1}])
    (decision,) = run_scenario(parse_scenario(data)).decisions
    offered = {c.device for c in decision.candidates}
    assert offered and all(not name.endswith(("-at-0", "-at-1", "-at-2", "-at-3")) for name in offered)
    assert "gpu-0-mig-3g40gb-at-4" in offered


def on_demand_slices(cards: int, node: str) -> list[dict[str, Any]]:
    entries = [{"index": i, "profile": "h200", "migEnabled": True} for i in range(cards)]
    gpus = mark_on_demand(parse_devices({"gpus": entries}, node_name=node), parse_selection("all"))
    return build_resource_slices(
        gpus, node_name=node, driver_name=DRIVER, policy_taint=True, mig_on_demand_layout=LAYOUT_OWN_SLICE
    )


def held_claim(name: str, namespace: str, device: str) -> dict[str, Any]:
    result = {"request": "mig", "driver": DRIVER, "pool": "node-1", "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": f"mig.{DRIVER}"}}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_a_cluster_snapshot_keeps_on_demand_cards_and_the_placements_claims_hold() -> None:
    slices = on_demand_slices(2, "node-1")
    claims = [held_claim("small", "team-a", "gpu-0-mig-1g18gb-at-0")]
    objects = ClusterObjects(
        pods=[], claims=claims, slices=slices, classes=[], nodes=[], gpu_quotas=[], resource_quotas=[]
    )
    snapshot = take_snapshot(objects, DRIVER)
    assert snapshot.warnings == []
    (node,) = snapshot.data["nodes"]
    card = node["gpus"][0]
    assert card["migOnDemand"] is True and card["memory"] == "140Gi"
    assert card["migDevices"] == [
        {"profile": "1g.18gb", "start": 0, "inUse": True, "namespace": "team-a", "deviceClass": MIG_CLASS}
    ]
    assert node["gpus"][1]["migDevices"] == []
    data = {**snapshot.data, "claims": [{"name": "next", "namespace": "team-a", "profile": "1g.18gb"}]}
    data["defaults"] = {"policy": "binpack"}
    data["quotas"] = [{"name": "q", "namespace": "team-a", "hard": {"memory": f"{20 * GIB}"}}]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert "used 16896Mi + requested 16896Mi" in (decision.reason or "")
    del data["quotas"]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert [c.device for c in decision.candidates if c.chosen] == ["gpu-0-mig-1g18gb-at-1"]


def test_a_snapshot_leaves_out_the_slices_a_card_does_not_offer() -> None:
    slices = on_demand_slices(1, "node-1")
    (devices,) = [s["spec"]["devices"] for s in slices if s["spec"].get("devices")]
    # An instance the driver did not create at slices 4-7: the plugin publishes nothing there.
    kept = [d for d in devices if not _overlaps(d, range(4, 8))]
    spec = next(s for s in slices if s["spec"].get("devices"))["spec"]
    spec["devices"] = kept
    objects = ClusterObjects(
        pods=[], claims=[], slices=slices, classes=[], nodes=[], gpu_quotas=[], resource_quotas=[]
    )
    (node,) = take_snapshot(objects, DRIVER).data["nodes"]
    (card,) = node["gpus"]
    assert card["migDevices"] == [{"profile": "3g.71gb", "start": 4}]
    scenario = parse_scenario(take_snapshot(objects, DRIVER).data)
    offered = {instance.name for instance, _ in scenario.nodes[0].gpus[0].mig_instances("node-1")}
    assert offered == {d["name"] for d in kept}


def _overlaps(device: dict[str, Any], span: range) -> bool:
    attributes = device["attributes"]
    start = attributes["placementStart"]["int"]
    size = attributes["memorySlices"]["int"]
    return bool(set(range(start, start + size)) & set(span))
