"""``make release PUSH=0``: the artifacts of one version, each named with it, and checksums that
``sha256sum -c`` verifies (hack/release/main.py). The image archive is a tiny OCI archive made
here (the real one is `make image`'s, pushed in tests/cluster/test_registry_install.py)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import __version__
from hack.release import chart, checksums, main, registry
from hami_dra_dev.cluster.images import write_oci_archive
from tests.chart.helpers import CHART, container, find_or_install_helm, run_helm

pytestmark = pytest.mark.slow
REGISTRY = "registry.example.com:5000/team"


@pytest.fixture(scope="module")
def helm() -> str:
    found, why = find_or_install_helm()
    if found is None:
        pytest.skip(f"helm unavailable: {why}")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = b"not the driver\n"
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = tmp_path_factory.mktemp("image") / "hami-dra.oci.tar"
    return write_oci_archive(path, f"localhost/hami-dra:{__version__}", layer.getvalue(), {})


@pytest.fixture(scope="module")
def released(helm: str, image_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    argv = ["--registry", REGISTRY, "--no-push", "--out", str(out), "--image-archive", str(image_archive),
            "--helm", helm]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", f"from hack.release.main import main; raise SystemExit(main({argv!r}))"],
        cwd=main.REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / __version__, done.stdout


def test_every_artifact_is_there_named_with_the_version(released: tuple[Path, str]) -> None:
    directory, stdout = released
    v = __version__
    assert sorted(p.name for p in directory.iterdir()) == sorted([
        f"hami-dra-image-{v}.oci.tar", f"hami-dra-{v}.tgz", f"hami_dra-{v}-py3-none-any.whl",
        f"hami_dra-{v}.tar.gz", f"CHANGELOG-{v}.md", "SHA256SUMS",
    ])  # fmt: skip
    assert f"install: helm install hami-dra oci://{REGISTRY}/charts/hami-dra --version {v}" in stdout
    assert "pushed" not in stdout


def test_the_checksums_verify_and_catch_a_changed_artifact(
    released: tuple[Path, str], tmp_path: Path
) -> None:
    directory, _ = released
    lines = (directory / checksums.NAME).read_text().splitlines()
    assert len(lines) == 5 and all(len(line.split("  ")[0]) == 64 for line in lines)
    ok = subprocess.run(["sha256sum", "-c", checksums.NAME], cwd=directory, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.count(": OK") == 5, ok.stdout
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in directory.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    notes = copy / f"CHANGELOG-{__version__}.md"
    notes.write_text(notes.read_text() + "tampered\n")
    bad = subprocess.run(["sha256sum", "-c", checksums.NAME], cwd=copy, capture_output=True, text=True)
    assert bad.returncode != 0 and f"CHANGELOG-{__version__}.md: FAILED" in bad.stdout


def test_the_image_archive_is_the_one_make_image_built(
    released: tuple[Path, str], image_archive: Path
) -> None:
    directory, _ = released
    shipped = directory / f"hami-dra-image-{__version__}.oci.tar"
    assert shipped.read_bytes() == image_archive.read_bytes()
    with tarfile.open(image_archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest_path = "blobs/" + index["manifests"][0]["digest"].replace(":", "/")
        config = json.loads(tar.extractfile(manifest_path).read())["config"]  # type: ignore[union-attr]
        blob = tar.extractfile("blobs/" + config["digest"].replace(":", "/")).read()  # type: ignore[union-attr]
    assert config["digest"] == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert registry.archive_config_digest(shipped) == config["digest"]


def test_the_wheel_carries_the_cli_at_the_version(released: tuple[Path, str]) -> None:
    directory, _ = released
    with zipfile.ZipFile(directory / f"hami_dra-{__version__}-py3-none-any.whl") as wheel:
        info = f"hami_dra-{__version__}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        assert "dra_driver/cli.py" in wheel.namelist()
    assert f"\nVersion: {__version__}\n" in metadata
    assert "hami-dra = dra_driver.cli:main" in entry_points


def test_the_notes_are_the_versions_changelog_section(released: tuple[Path, str]) -> None:
    directory, _ = released
    notes = (directory / f"CHANGELOG-{__version__}.md").read_text()
    assert notes.startswith(f"## [{__version__}] - ") and "### Upgrade notes" in notes
    assert "## [Unreleased]" not in notes


def _render(helm: str, chart_ref: str, *args: str) -> list[dict[str, Any]]:
    out = run_helm(helm, "template", "hami-dra", chart_ref, "-n", "hami-system", *args)
    return [d for d in yaml.safe_load_all(out) if d]


def _driver_images(objects: list[dict[str, Any]]) -> set[str]:
    """The driver's own workloads' images (HAMi-core's installer DaemonSet runs HAMi's image)."""
    workloads = (o for o in objects if o["kind"] in ("DaemonSet", "Deployment"))
    return {container(o)["image"] for o in workloads if not o["metadata"]["name"].endswith("-hami-core")}


def test_the_packaged_chart_pulls_the_image_from_the_registry_it_was_pushed_to(
    released: tuple[Path, str], helm: str
) -> None:
    directory, _ = released
    packaged = directory / f"hami-dra-{__version__}.tgz"
    meta = yaml.safe_load(run_helm(helm, "show", "chart", str(packaged)))
    assert (meta["version"], meta["appVersion"]) == (__version__, __version__)
    assert _driver_images(_render(helm, str(packaged))) == {f"{REGISTRY}/hami-dra:{__version__}"}
    # Only image.repository differs from the checkout's chart.
    ours = yaml.safe_load((CHART / "values.yaml").read_text())
    theirs = yaml.safe_load(run_helm(helm, "show", "values", str(packaged)))
    assert theirs["image"].pop("repository") == f"{REGISTRY}/hami-dra"
    assert ours["image"].pop("repository") == f"{registry.DEFAULT_REGISTRY}/hami-dra"
    assert theirs == ours


def test_the_checkouts_chart_defaults_to_the_default_release_registry(helm: str) -> None:
    assert _driver_images(_render(helm, str(CHART))) == {
        f"{registry.DEFAULT_REGISTRY}/hami-dra:{__version__}"
    }


def test_stamping_keeps_every_other_line() -> None:
    values = (CHART / "values.yaml").read_text()
    stamped = chart.stamp_repository(values, "mirror.internal/x/hami-dra")
    changed = [(a, b) for a, b in zip(values.splitlines(), stamped.splitlines(), strict=True) if a != b]
    assert changed == [
        ("  repository: ghcr.io/hami-dra/hami-dra", "  repository: mirror.internal/x/hami-dra")
    ]
