"""Every file naming the version must agree before anything is built (hack/release/versions.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack.release import changelog, versions
from hack.release.errors import ReleaseError
from tests.chart.helpers import REPO


def test_the_tree_names_one_version_everywhere() -> None:
    sources = versions.read(REPO)
    assert versions.release_version(sources, None) == sources.pyproject
    assert set(sources.named().values()) == {sources.pyproject}


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text, count = re.subn(pattern, replacement, path.read_text(), count=1, flags=re.MULTILINE)
    assert count == 1, pattern
    path.write_text(text)


@pytest.mark.parametrize(
    ("relative", "pattern", "replacement", "named"),
    [
        ("pyproject.toml", r'^version = ".*"', 'version = "9.9.9"', "pyproject.toml version is 9.9.9"),
        ("dra_driver/__init__.py", r'^__version__ = ".*"', '__version__ = "9.9.9"',
         "dra_driver/__init__.py __version__ is 9.9.9"),
        ("charts/hami-dra/Chart.yaml", r"^version: .*", "version: 9.9.9",
         "charts/hami-dra/Chart.yaml version is 9.9.9"),
        ("charts/hami-dra/Chart.yaml", r"^appVersion: .*", 'appVersion: "9.9.9"',
         "charts/hami-dra/Chart.yaml appVersion is 9.9.9"),
        ("CHANGELOG.md", r"^## \[Unreleased\]", "## [Unreleased]\n\n## [9.9.9] - 2030-01-01",
         "CHANGELOG.md newest release is 9.9.9"),
    ],
    ids=["pyproject", "package", "chart-version", "app-version", "changelog"],
)  # fmt: skip
def test_one_file_off_is_named_in_the_error(
    tree: Path, relative: str, pattern: str, replacement: str, named: str
) -> None:
    expected = versions.read(tree).pyproject
    _edit(tree / relative, pattern, replacement)
    with pytest.raises(ReleaseError) as raised:
        versions.release_version(versions.read(tree), None if relative != "pyproject.toml" else expected)
    message = str(raised.value)
    assert message.startswith(f"version mismatch for {expected}: {named}"), message
    assert message.count(" is ") == 1, "only the file that differs is named"


def test_a_requested_version_the_files_do_not_name_lists_every_file(tree: Path) -> None:
    with pytest.raises(ReleaseError) as raised:
        versions.release_version(versions.read(tree), "7.0.0")
    assert str(raised.value).count(" is ") == 5


@pytest.mark.parametrize("bad", ["v0.1.0", "0.1", "0.1.0-dirty", "latest"])
def test_a_version_that_is_not_x_y_z_is_refused(bad: str) -> None:
    with pytest.raises(ReleaseError, match=r"is not X\.Y\.Z"):
        versions.release_version(versions.read(REPO), bad)


CHANGELOG = """\
# Changelog

## [Unreleased]

- something not released

## [0.2.0] - 2027-01-02

### Added

- a thing

### Upgrade notes

- Nothing to do.

## [0.1.0] - 2026-12-06

### Upgrade notes

- First.

[Unreleased]: https://example.invalid/compare/v0.2.0...HEAD
[0.2.0]: https://example.invalid/v0.2.0
"""


def test_a_section_runs_to_the_next_heading_and_stops_at_the_links() -> None:
    assert changelog.released_versions(CHANGELOG) == ["0.2.0", "0.1.0"]
    newer = changelog.section(CHANGELOG, "0.2.0")
    assert newer.startswith("## [0.2.0] - 2027-01-02\n") and newer.endswith("- Nothing to do.\n")
    older = changelog.section(CHANGELOG, "0.1.0")
    assert older == "## [0.1.0] - 2026-12-06\n\n### Upgrade notes\n\n- First.\n"


@pytest.mark.parametrize(
    ("text", "version", "message"),
    [
        (CHANGELOG, "0.3.0", r"no section for 0\.3\.0 \(sections: 0\.2\.0, 0\.1\.0\)"),
        (CHANGELOG.replace("### Upgrade notes\n\n- First.\n", "- First.\n"), "0.1.0",
         "no '### Upgrade notes'"),
        (CHANGELOG.replace("## [0.1.0] - 2026-12-06", "## [0.1.0]"), "0.1.0", "has no date"),
    ],
    ids=["missing", "no-upgrade-notes", "no-date"],
)  # fmt: skip
def test_a_section_that_cannot_be_released_is_refused(text: str, version: str, message: str) -> None:
    with pytest.raises(ReleaseError, match=message):
        changelog.section(text, version)


def test_the_released_changelog_section_has_upgrade_notes() -> None:
    version = versions.read(REPO).pyproject
    notes = changelog.section(changelog.read(REPO / "CHANGELOG.md"), version)
    assert notes.startswith(f"## [{version}] - ") and "### Upgrade notes" in notes
