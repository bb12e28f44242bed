"""The seed's worked example and each "Common Recipes" scenario, run through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def simulate_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    assert main(["simulate", str(path), "--output", "json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    return {result["claim"]: result for result in results}


def picked(result: dict[str, Any]) -> list[int]:
    assert result["allocated"], result["reason"]
    return [device["index"] for device in result["devices"]]


def test_worked_example_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLES / "worked-example.yaml")]) == 0
    out = capsys.readouterr().out
    assert "gke-lab-node gpu-2" in out
    for score in ("3.302083", "1.651042", "0.000000"):
        assert score in out
    assert out.count("ExclusiveDeviceAllocateConflict") == 2


def test_worked_example_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = simulate_json(EXAMPLES / "worked-example.yaml", capsys)["latency-tier"]
    assert result["devices"] == [
        {"node": "gke-lab-node", "index": 2, "name": "gpu-2", "memory": 1000 * 1024**2, "cores": 0}
    ]
    assert [c["score"] for c in result["candidates"]] == [3.302083, 1.651042, 0.0, 0.0]
    assert [c["eligible"] for c in result["candidates"]] == [False, False, True, True]
    assert result["reason"] is None and result["node"] == "gke-lab-node"


def test_recipe_binpack(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/binpack.yaml", capsys)
    assert picked(results["packed"]) == [1]  # the busiest card that fits


def test_recipe_spread(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/spread.yaml", capsys)
    assert picked(results["spread-explicit"]) == [3]  # the least used card
    assert picked(results["spread-default"]) == [0]  # default is spread; ties by index


def test_recipe_mutex(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/mutex.yaml", capsys)
    assert picked(results["exclusive-1"]) == [3]
    assert not results["exclusive-2"]["allocated"]
    assert results["exclusive-2"]["reason"] == "4/4 ExclusiveDeviceAllocateConflict"
    assert results["joins-later"]["allocated"]  # mutex is a placement-time rule only


def test_recipe_binpack_numa(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/binpack-numa.yaml", capsys)
    assert picked(results["numa-first"]) == [2]
    packed = results["packed-local"]
    scores = {c["index"]: c["score"] for c in packed["candidates"]}
    assert scores[0] == scores[2] == 3.302083  # tie broken by NUMA, not by index
    assert picked(packed) == [2]


def test_recipe_mutex_binpack(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/mutex-binpack.yaml", capsys)
    assert picked(results["latency-tier"]) == [2]


def test_recipe_mutex_binpack_numa(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "recipes/mutex-binpack-numa.yaml", capsys)
    assert picked(results["latency-tier"]) == [3]
    assert picked(results["exclusive-packed"]) == [0]
    assert results["no-idle-card-left"]["reason"] == "4/4 ExclusiveDeviceAllocateConflict"


def test_quota_example_names_the_blocking_quota(capsys: pytest.CaptureFixture[str]) -> None:
    results = simulate_json(EXAMPLES / "quota.yaml", capsys)
    assert picked(results["train"]) == [1]  # gpu-0 holds 12Gi already: 6Gi more does not fit there
    assert results["train"]["quota"] is None
    held = results["eval"]
    assert not held["allocated"] and held["quota"] == "team-a/team-a"
    assert held["reason"] == "GpuQuotaExceeded: team-a/team-a memory: used 18Gi + requested 4Gi > hard 20Gi"
    assert not any(card["chosen"] for card in held["candidates"])
    assert picked(results["notebook"]) == [1]  # another namespace: the eval claim took nothing
    assert main(["simulate", str(EXAMPLES / "quota.yaml")]) == 0
    assert "PENDING GpuQuotaExceeded: team-a/team-a" in capsys.readouterr().out


def test_quota_devices_and_cores_in_a_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "defaults: {policy: spread}\n"
        "quotas: [{name: q, hard: {devices: 1, cores: 50}}]\n"
        "nodes: [{name: n, gpus: [{index: 0, memory: 16Gi}, {index: 1, memory: 16Gi}]}]\n"
        "claims: [{name: a, memory: 1Gi, cores: 30}, {name: b, memory: 1Gi, cores: 10},"
        " {name: c, memory: 1Gi, cores: 30}]\n"
    )
    results = simulate_json(scenario, capsys)
    assert picked(results["a"]) == [0]
    assert results["b"]["reason"] == "GpuQuotaExceeded: default/q devices: used 1 + requested 1 > hard 1"
    assert results["c"]["quota"] == "default/q"
