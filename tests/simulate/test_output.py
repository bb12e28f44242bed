"""``simulate``'s output: plain columns in a pipe, drawn tables on a terminal, the same document as
JSON or YAML, ``wide``, and ``--fail-on-pending``'s exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver import output
from dra_driver.cli import CHILD_ENTRY, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORKED = EXAMPLES / "worked-example.yaml"
#: Its second claim stays pending (the one card with no tenant is taken by the first).
MUTEX = EXAMPLES / "recipes" / "mutex.yaml"
BOX = set("─│┃━┏┓┗┛┡┩└┘┌┐╇╈")


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_in_a_pipe_each_claim_is_a_title_line_and_plain_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate(capsys, str(WORKED))
    assert code == 0
    assert not BOX & set(out)
    lines = out.splitlines()
    assert lines[0] == "latency-tier (mutex,binpack): gke-lab-node gpu-2"
    assert lines[1].split() == [
        "NODE", "INDEX", "MODEL", "NUMA", "TENANTS", "MEMORY", "SCORE", "ELIGIBLE", "REASON",
    ]  # fmt: skip
    assert lines[2].split() == [
        "gke-lab-node", "0", "Tesla", "T4", "0", "2", "2000Mi/15360Mi", "3.302083", "no",
        "ExclusiveDeviceAllocateConflict",
    ]  # fmt: skip
    assert lines[4].split()[-2:] == ["chosen", "-"]
    # Columns are as wide as their cells, never padded out to a terminal's width.
    assert all(line == line.rstrip() for line in lines)
    assert max(map(len, lines)) == len(lines[2])


def test_is_terminal_follows_the_stream(tmp_path: Path) -> None:
    with open(tmp_path / "file", "w") as file:
        assert not output.is_terminal(file)
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        assert not output.is_terminal(pipe)
    os.close(read_end)


def test_the_plain_table_survives_a_real_pipe() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD_ENTRY, "simulate", str(WORKED)],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    assert done.stdout.splitlines()[0] == "latency-tier (mutex,binpack): gke-lab-node gpu-2"
    assert not BOX & set(done.stdout) and "\x1b[" not in done.stdout


def test_on_a_terminal_the_tables_are_drawn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dra_driver.simulate.command.is_terminal", lambda stream=None: True)
    monkeypatch.setenv("COLUMNS", "200")  # the terminal's width, which rich reads
    code, out, _ = simulate(capsys, str(WORKED))
    assert code == 0 and BOX & set(out)
    assert "used memory" in out and "3.302083" in out


def test_wide_adds_the_cores_used(capsys: pytest.CaptureFixture[str]) -> None:
    _, table, _ = simulate(capsys, str(WORKED), "-o", "table")
    _, wide, _ = simulate(capsys, str(WORKED), "-o", "wide")
    assert "CORES" not in table.splitlines()[1]
    header = wide.splitlines()[1].split()
    assert header[header.index("MEMORY") + 1] == "CORES"


def test_yaml_is_the_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    _, as_json, _ = simulate(capsys, str(MUTEX), "-o", "json")
    _, as_yaml, _ = simulate(capsys, str(MUTEX), "-o", "yaml")
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


def test_fail_on_pending_exits_1_when_a_claim_stays_pending(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, str(MUTEX), "--fail-on-pending", "-o", "json")
    results = json.loads(out)["results"]
    pending = [r["claim"] for r in results if not r["allocated"]]
    assert pending and code == 1
    assert err == f"hami-dra simulate: {len(pending)} of {len(results)} claims stay pending\n"
    # Without the flag a pending claim is an answer, not a failure.
    assert simulate(capsys, str(MUTEX), "-o", "json")[0] == 0


def test_fail_on_pending_exits_0_when_everything_is_placed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, str(WORKED), "--fail-on-pending")
    assert code == 0 and err == "" and "gke-lab-node gpu-2" in out
