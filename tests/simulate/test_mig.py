"""``hami-dra simulate`` with cards in MIG mode (issue 37): MIG claims placed by the chain among
instances, counted by quotas; scenario errors for what cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.simulate.run import run_scenario
from dra_driver.simulate.scenario import ScenarioError, parse_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mig" / "simulate.yaml"


def results(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    assert main(["simulate", str(EXAMPLE), "--output", "json", *args]) == 0
    return {r["claim"]: r for r in json.loads(capsys.readouterr().out)["results"]}


def test_the_example_places_1g_claims_on_one_card_and_the_7g_on_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = results(capsys)
    names = {claim: [d["name"] for d in r["devices"]] for claim, r in got.items()}
    assert names == {
        "a": ["gpu-0-mig-7-0"],
        "b": ["gpu-0-mig-8-0"],
        "c": ["gpu-0-mig-9-0"],
        "big": ["gpu-1-mig-0-0"],
        "by-memory": [],
        "team-b-1": ["gpu-0-mig-10-0"],
        "team-b-2": [],
        "whole-card": ["gpu-2"],
    }
    assert got["a"]["devices"][0]["memory"] == 16896 * 1024**2
    assert got["by-memory"]["reason"] == "4/8 CardInsufficientMemory, 4/8 MigInstanceInUse"
    assert got["team-b-2"]["quota"] == "team-b/cap"
    chosen = next(c for c in got["c"]["candidates"] if c["chosen"])
    assert chosen["name"] == "gpu-0-mig-9-0"
    assert chosen["note"] == "1g.18gb at slice 2 of gpu-0 (2 in use); leaves free blocks 4+1 (of 4+2)"


def test_the_wide_table_names_instances_and_their_notes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE), "--output", "wide"]) == 0
    out = capsys.readouterr().out
    assert "a (binpack): node-1 gpu-0-mig-7-0" in out
    assert "leaves free blocks 4+2+1 (of 8)" in out
    assert "MigProfileMismatch" in out


def scenario(gpu: dict[str, Any], claim: dict[str, Any] | None = None) -> dict[str, Any]:
    base = {"index": 0, "productName": "NVIDIA H100 80GB HBM3", "memory": "80Gi"}
    return {
        "nodes": [{"name": "n", "gpus": [{**base, **gpu}]}],
        "claims": [claim or {"name": "x", "mig": True}],
    }


@pytest.mark.parametrize(
    ("gpu", "claim", "message"),
    [
        ({"productName": "Tesla T4", "migDevices": ["1g.10gb"]}, None, "'Tesla T4' has no MIG profiles"),
        ({"migDevices": ["1g.10gb@7"]}, None, "1g.10gb cannot start at memory slice 7"),
        ({"migDevices": ["7g.80gb", "1g.10gb"]}, None, "1g.10gb does not fit next to 7g.80gb@0"),
        ({"migDevices": ["1g.10gb"], "allocations": [{"memory": "1Gi"}]}, None, "mark its instances inUse"),
        ({"migDevices": ["1g.10gb"]}, {"name": "x", "profile": "1g.10gb", "cores": 30}, "not cores"),
    ],
)
def test_scenario_errors_name_what_is_wrong(gpu: dict[str, Any], claim: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(scenario(gpu, claim), "s.yaml")


def test_instances_in_use_are_skipped_and_charged_to_their_namespace() -> None:
    gpu = {"migDevices": [{"profile": "3g.40gb", "inUse": True, "namespace": "t"}, "3g.40gb"]}
    data = scenario(gpu, {"name": "x", "namespace": "t", "profile": "3g.40gb"})
    data["quotas"] = [{"name": "q", "namespace": "t", "hard": {"memory": "60Gi"}}]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert decision.placement is None
    assert decision.reason is not None and "used 40448Mi + requested 40448Mi > hard 60Gi" in decision.reason
    del data["quotas"]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert decision.placement is not None
    assert [c.device for c in decision.candidates if c.chosen] == ["gpu-0-mig-2-0"]  # slices 4-7


def test_a_cluster_snapshot_keeps_mig_cards_and_who_holds_their_instances() -> None:
    from dra_driver.controller.offline import ClusterObjects
    from dra_driver.simulate.snapshot import take_snapshot
    from tests.controller.harness import DRIVER
    from tests.controller.mig_world import mig_slices

    slices = mig_slices([None, ["3g.71gb", "1g.18gb@4", "1g.18gb@5"]], node="node-1")
    held = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "small", "namespace": "team-a"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": f"mig.{DRIVER}"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "mig", "driver": DRIVER, "pool": "node-1", "device": "gpu-1-mig-11-0"}
                    ]
                }
            }
        },
    }
    objects = ClusterObjects(
        pods=[], claims=[held], slices=slices, classes=[], nodes=[], gpu_quotas=[], resource_quotas=[]
    )
    snapshot = take_snapshot(objects, DRIVER)
    assert snapshot.warnings == []
    (node,) = snapshot.data["nodes"]
    mig_card = next(gpu for gpu in node["gpus"] if "migDevices" in gpu)
    assert mig_card["index"] == 1 and mig_card["productName"] == "NVIDIA H200"
    assert mig_card["migDevices"] == [
        {"profile": "3g.71gb", "start": 0},
        {
            "profile": "1g.18gb",
            "start": 4,
            "inUse": True,
            "namespace": "team-a",
            "deviceClass": f"mig.{DRIVER}",
        },
        {"profile": "1g.18gb", "start": 5},
    ]
    # Placed on the snapshot: the free 1g, next to the held one; the quota counts the held one.
    data = {**snapshot.data, "claims": [{"name": "next", "namespace": "team-a", "profile": "1g.18gb"}]}
    data["quotas"] = [{"name": "q", "namespace": "team-a", "hard": {"memory": "20Gi"}}]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert decision.placement is None and "used 16896Mi + requested 16896Mi > hard 20Gi" in (
        decision.reason or ""
    )
    del data["quotas"]
    (decision,) = run_scenario(parse_scenario(data)).decisions
    assert [c.device for c in decision.candidates if c.chosen] == ["gpu-1-mig-12-0"]
