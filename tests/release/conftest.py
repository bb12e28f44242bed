"""A copy of the files that name the version, for the consistency checks to break one at a time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hack.release.versions import CHART, PACKAGE_INIT
from tests.chart.helpers import REPO

VERSIONED = (Path("pyproject.toml"), PACKAGE_INIT, CHART, Path("CHANGELOG.md"))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for relative in VERSIONED:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / relative, tmp_path / relative)
    return tmp_path
