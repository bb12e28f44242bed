"""Bad scenario files: one clear line per problem naming file and path, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.cli import main

GOOD_NODE = "nodes:\n  - name: n1\n    gpus:\n      - {index: 0, memory: 15360Mi}\n"


def run(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    code = main(["simulate", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.replace(str(path), "FILE")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD_NODE + "claims:\n  - {name: c, policy: 'mutex,fastest'}\n",
            "FILE: claims[0](c).policy: unknown policy name(s) 'fastest'",
        ),
        (
            GOOD_NODE + "quotas:\n  - {name: q, hard: {gpus: 1}}\n",
            "FILE: quotas[0](q).hard.gpus: Extra inputs are not permitted",
        ),
        (
            GOOD_NODE + "quotas:\n  - {name: q, hard: {}}\n",
            "FILE: quotas[0](q).hard: give at least one of memory, cores, devices",
        ),
        (
            GOOD_NODE + "quotas:\n  - {name: q, hard: {cores: -1}}\n",
            "FILE: quotas[0](q).hard.cores: -1 is not a whole, non-negative number",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, memory: 1000}\n",
            "FILE: claims[0](c).memory: 1000 is less than 1Mi",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, memory: lots}\n",
            "FILE: claims[0](c).memory: 'lots' is not a quantity",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, cores: 120}\n",
            "FILE: claims[0](c).cores: Input should be less than or equal to 100",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, weights: 'slot=1,core=1'}\n",
            "expected slot, core, and memory weights",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, nodePolicy: fastest}\n",
            "FILE: claims[0](c).nodePolicy: unknown node policy",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, colour: red}\n",
            "FILE: claims[0](c).colour: Extra inputs are not permitted\n",
        ),
        # A mistyped field is refused with the field it most likely meant (issue 39).
        (
            GOOD_NODE + "claims:\n  - {name: c, memroy: 1Gi}\n",
            "FILE: claims[0](c).memroy: Extra inputs are not permitted; did you mean 'memory'?",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, exclude_uuid: [GPU-1]}\n",
            "FILE: claims[0](c).exclude_uuid: Extra inputs are not permitted; did you mean 'excludeUuids'?",
        ),
        (
            "nodes:\n  - name: n1\n    gpus:\n      - {index: 0, memory: 1Gi, numNode: 0}\n",
            "FILE: nodes[0](n1).gpus[0].numNode: Extra inputs are not permitted; did you mean 'numaNode'?",
        ),
        (
            GOOD_NODE + "qoutas: []\n",
            "FILE: qoutas: Extra inputs are not permitted; did you mean 'quotas'?",
        ),
        (
            GOOD_NODE + "claims:\n  - {name: c, memory: 1Gi, memoryPercent: 5}\n",
            "give memory or memoryPercent, not both",
        ),
        (
            "nodes:\n  - name: n1\n    gpus:\n"
            "      - {index: 0, memory: 1Gi, allocations: [{memory: 2Gi}]}\n",
            "FILE: nodes[0](n1).gpus[0]: allocations use",
        ),
        ("nodes: []\n", "FILE: nodes: List should have at least 1 item"),
        ("nodes: [\n", "FILE: not valid YAML at line"),
        ("- a\n- b\n", "FILE: expected a mapping"),
    ],
)
def test_bad_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    code, err = run(tmp_path, text, capsys)
    assert code == 2
    assert expected in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read scenario file" in capsys.readouterr().err


def test_pending_claim_lists_best_nodes_cards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = "".join(
        f"  - name: n{i}\n    gpus:\n      - {{index: 0, memory: 1Gi, allocations: [{{memory: 1Mi}}]}}\n"
        for i in range(5)
    )
    path = tmp_path / "s.yaml"
    path.write_text(f"nodes:\n{nodes}claims:\n  - {{name: c, policy: mutex, memory: 1Mi}}\n")
    assert main(["simulate", str(path), "-o", "json", "--max-candidates", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count('"index"') == 3
    assert "5/5 ExclusiveDeviceAllocateConflict" in out


def test_a_share_is_refused_on_a_gpu_whose_node_cannot_enforce_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "nodes:\n  - name: n1\n    gpus:\n      - {index: 0, memory: 16Gi, isolation: none}\n"
        "      - {index: 1, memory: 16Gi}\n"
        "claims:\n  - {name: share, memory: 1Gi}\n  - {name: whole, count: 1}\n"
    )
    assert main(["simulate", str(path), "-o", "json"]) == 0
    out = capsys.readouterr().out
    assert "CardSharesNotEnforced" in out


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ("- {name: c, policy: fastest}\n", "CLAIMS: claims[0](c).policy: unknown policy name(s) 'fastest'"),
        (
            "- {name: c, cors: 10}\n",
            "CLAIMS: claims[0](c).cors: Extra inputs are not permitted; did you mean 'cores'?",
        ),
        ("defaults: {nodePolcy: spread}\nclaims: [{name: c}]\n", "did you mean 'nodePolicy'?"),
        ("claims: []\n", "CLAIMS: claims: List should have at least 1 item"),
        ("- {name: c}\n- {name: c}\n", "CLAIMS: (top level): claim name listed twice: ['c']"),
        ("- {name: mine}\n", "CLAIMS: claims[0](mine): FILE has a claim of that name"),
        ("just text\n", "CLAIMS: expected a list of claims or a mapping with 'claims', got str"),
        ("claims: [\n", "CLAIMS: not valid YAML at line"),
    ],
)
def test_bad_claims_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], claims: str, expected: str
) -> None:
    scenario, what_if = tmp_path / "scenario.yaml", tmp_path / "what-if.yaml"
    scenario.write_text(GOOD_NODE + "claims:\n  - {name: mine}\n")
    what_if.write_text(claims)
    assert main(["simulate", str(scenario), "--claims", str(what_if)]) == 2
    err = capsys.readouterr().err.replace(str(what_if), "CLAIMS").replace(str(scenario), "FILE")
    assert expected in err and "Traceback" not in err


def test_claims_files_defaults_replace_the_scenarios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, what_if = tmp_path / "scenario.yaml", tmp_path / "what-if.yaml"
    scenario.write_text(
        "defaults: {policy: spread}\nnodes:\n  - name: n1\n    gpus:\n"
        "      - {index: 0, memory: 16Gi, allocations: [{memory: 1Gi}]}\n      - {index: 1, memory: 16Gi}\n"
    )
    what_if.write_text("defaults: {policy: binpack}\nclaims: [{name: packed, memory: 1Gi}]\n")
    assert main(["simulate", str(scenario), "--claims", str(what_if), "-o", "json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["policy"] == "binpack" and result["devices"][0]["index"] == 0
