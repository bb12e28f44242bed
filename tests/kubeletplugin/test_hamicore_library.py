"""Whether HAMi-core enforces shares on this node (``dra_driver/kubeletplugin/hamicore_library.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.kubeletplugin.hamicore_library import inspect_library, parse_version
from tests.kubeletplugin.helpers import stand_in_library


def test_no_or_a_missing_library_means_no_enforcement_or_simulated(tmp_path: Path) -> None:
    assert inspect_library(None, simulated=False).isolation == "none"
    assert inspect_library(None, simulated=True).isolation == "simulated"
    missing = inspect_library(tmp_path / "libvgpu.so", simulated=False)
    assert missing.library is None and "does not exist" in str(missing.problem)


def test_a_recent_library_enforces_and_its_version_is_recorded(tmp_path: Path) -> None:
    status = inspect_library(stand_in_library(tmp_path / "libvgpu.so", "v2.9.1"), simulated=False)
    assert (status.isolation, status.version, status.problem) == ("hami-core", "2.9.1", None)


@pytest.mark.parametrize("version", ["v2.5.0", "v2.8.2", "2.8.0", "v2.8.4"])
def test_an_old_library_is_refused_with_the_reason(tmp_path: Path, version: str) -> None:
    status = inspect_library(stand_in_library(tmp_path / "libvgpu.so", version), simulated=False)
    assert status.library is None and status.isolation == "none"
    assert f"HAMi-core {version}" in str(status.problem) and "older than v2.9.0" in str(status.problem)


def test_v2_8_3_ships_the_library_of_v2_9_0_and_is_accepted_as_itself(tmp_path: Path) -> None:
    status = inspect_library(stand_in_library(tmp_path / "libvgpu.so", "v2.8.3"), simulated=False)
    assert (status.isolation, status.version, status.problem) == ("hami-core", "2.8.3", None)
    assert status.library == tmp_path / "libvgpu.so"


def test_without_a_version_file_the_library_is_used_with_a_caveat(tmp_path: Path) -> None:
    status = inspect_library(stand_in_library(tmp_path / "libvgpu.so", None), simulated=False)
    assert (
        status.isolation == "hami-core"
        and status.version is None
        and "version is unknown" in str(status.problem)
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not a library", "is not an ELF shared object"),
        (b"\x7fELF\x01" + bytes(20), "is not a 64-bit ELF object"),
    ],
)
def test_a_file_the_loader_could_not_preload_is_refused(tmp_path: Path, content: bytes, problem: str) -> None:
    (tmp_path / "libvgpu.so").write_bytes(content)
    status = inspect_library(tmp_path / "libvgpu.so", simulated=False)
    assert status.library is None and problem in str(status.problem)


def test_versions_parse_with_or_without_v() -> None:
    assert parse_version("v2.9.0\n") == (2, 9, 0) and parse_version("2.10.1-rc1") == (2, 10, 1)
    assert parse_version("latest") is None
