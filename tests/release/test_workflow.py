"""The forge's release workflow runs the Makefile's release target on a v<version> tag; the target
it names exists and passes the tag's version (checked against the files by versions.py)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from hack.release import versions
from tests.chart.helpers import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def _workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def test_a_version_tag_triggers_it() -> None:
    workflow = _workflow()
    trigger = workflow.get("on") or workflow[True]  # YAML 1.1 reads a bare `on` as true
    assert trigger == {"push": {"tags": ["v*"]}}


def test_it_runs_make_release_with_the_tags_version() -> None:
    (job,) = _workflow()["jobs"].values()
    runs = [step.get("run", "") for step in job["steps"]]
    release = [r for r in runs if re.search(r"\bmake release\b", r)]
    assert len(release) == 1, runs
    assert 'VERSION="${GITHUB_REF_NAME#v}"' in release[0]
    assert re.search(r"^release: ", (REPO / "Makefile").read_text(), re.MULTILINE)
    # The assets it attaches are the ones make release writes.
    assert any('dist/"$version"/*' in r and "CHANGELOG-$version.md" in r for r in runs)


def test_the_tag_of_the_current_version_would_release() -> None:
    version = versions.read(REPO).pyproject
    tag = f"v{version}"
    assert versions.release_version(versions.read(REPO), tag.removeprefix("v")) == version
