"""Every file that names the version must name the same one: a chart whose appVersion differs from
the image tag it defaults to, or a wheel that reports another ``__version__``, is a broken release."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

from hack.release import changelog
from hack.release.errors import ReleaseError

#: A release version: MAJOR.MINOR.PATCH with an optional pre-release (PEP 440 and SemVer agree on it).
VERSION = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?$")
CHART = Path("charts/hami-dra/Chart.yaml")
PACKAGE_INIT = Path("dra_driver/__init__.py")


@dataclass(frozen=True)
class Sources:
    """The version as each file states it (``changelog``: its newest released section, if any)."""

    pyproject: str
    package: str
    chart: str
    app: str
    changelog: str | None

    def named(self) -> dict[str, str | None]:
        return {
            "pyproject.toml version": self.pyproject,
            f"{PACKAGE_INIT} __version__": self.package,
            f"{CHART} version": self.chart,
            f"{CHART} appVersion": self.app,
            "CHANGELOG.md newest release": self.changelog,
        }


def read(repo: Path) -> Sources:
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
    init = re.search(r'^__version__ = "([^"]+)"', (repo / PACKAGE_INIT).read_text(), re.MULTILINE)
    if init is None:
        raise ReleaseError(f'{PACKAGE_INIT} has no __version__ = "..." line')
    chart = yaml.safe_load((repo / CHART).read_text())
    released = changelog.released_versions(changelog.read(repo / "CHANGELOG.md"))
    return Sources(
        pyproject=str(pyproject),
        package=init.group(1),
        chart=str(chart.get("version")),
        app=str(chart.get("appVersion")),
        changelog=released[0] if released else None,
    )


def release_version(sources: Sources, requested: str | None) -> str:
    """The version to release: ``requested`` (e.g. from the tag) or pyproject's, once every file
    agrees with it; else one error naming each file that differs."""
    version = requested or sources.pyproject
    if not VERSION.match(version):
        raise ReleaseError(f"version {version!r} is not X.Y.Z (or X.Y.ZrcN): pass VERSION=0.1.0")
    wrong = {name: found for name, found in sources.named().items() if found != version}
    if wrong:
        listed = "; ".join(f"{name} is {found or 'missing'}" for name, found in wrong.items())
        raise ReleaseError(
            f"version mismatch for {version}: {listed}. Set every one to {version} "
            "(CHANGELOG.md: a '## [" + version + "] - YYYY-MM-DD' section on top) and commit"
        )
    return version
