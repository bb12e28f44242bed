"""hack/e2e-kind.sh cannot run here (no Docker, no kind); check what can be checked statically."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.chart.helpers import EXAMPLES, REPO

SCRIPT = REPO / "hack" / "e2e-kind.sh"


def test_bash_syntax() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt: shellcheck)")
def test_shellcheck_clean() -> None:
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_placements_are_the_seed_lab() -> None:
    calls = re.findall(r"^place (\S+) (gpu-\d)(?: (\S+))?$", SCRIPT.read_text(), flags=re.M)
    assert [(recipe, want) for recipe, want, _ in calls] == [
        ("binpack", "gpu-0"),
        ("binpack", "gpu-0"),
        ("spread", "gpu-1"),
        ("mutex-binpack", "gpu-2"),  # the seed's worked example
        ("mutex", "gpu-3"),
        ("binpack-numa", "gpu-0"),
    ]


@pytest.mark.parametrize("recipe", ["binpack", "spread", "mutex-binpack", "mutex", "binpack-numa"])
def test_pod_rename_touches_only_the_pod(recipe: str) -> None:
    """place() renames the example's pod with sed; nothing else in the file may change."""
    source = (EXAMPLES / f"{recipe}.yaml").read_text()
    rename = f"s/^  name: {recipe}$/  name: renamed/"
    proc = subprocess.run(["sed", rename], input=source, capture_output=True, text=True, check=True)
    before = list(yaml.safe_load_all(source))
    after = list(yaml.safe_load_all(proc.stdout))
    for old, new in zip(before, after, strict=True):
        if old["kind"] == "Pod":
            assert new["metadata"]["name"] == "renamed"
            new["metadata"]["name"] = old["metadata"]["name"]
        assert new == old
