"""The chart as released: charts/hami-dra packaged with the image repository the release pushes to
stamped into values.yaml, so ``helm install oci://<registry>/charts/hami-dra --version X`` pulls the
image from the same registry with no ``--set``; the tag stays empty (the chart's appVersion)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from hack.release.errors import ReleaseError

CHART_DIR = Path("charts/hami-dra")
#: ``image.repository`` in values.yaml: the first ``repository:`` under the top-level ``image:``.
IMAGE_REPOSITORY = re.compile(r"(?m)^(image:\n(?:[ ]{2}#.*\n)*[ ]{2}repository: ).*$")


def stamp_repository(values: str, repository: str) -> str:
    """values.yaml's text with ``image.repository`` set to ``repository``, comments kept."""
    stamped, count = IMAGE_REPOSITORY.subn(lambda m: m.group(1) + repository, values, count=1)
    if count != 1:
        raise ReleaseError(f"{CHART_DIR}/values.yaml: no 'image:' mapping starting with 'repository:'")
    return stamped


def package(repo: Path, helm: str, version: str, repository: str, out: Path) -> Path:
    """``helm package`` of a stamped copy into ``out``: ``hami-dra-<version>.tgz``."""
    with tempfile.TemporaryDirectory(prefix="hami-dra-chart-") as work:
        copy = Path(work) / "hami-dra"
        shutil.copytree(repo / CHART_DIR, copy)
        values = copy / "values.yaml"
        values.write_text(stamp_repository(values.read_text(), repository))
        done = subprocess.run(
            [helm, "package", str(copy), "--version", version, "--app-version", version, "-d", str(out)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise ReleaseError(f"helm package failed: {done.stderr.strip()}")
    archive = out / f"hami-dra-{version}.tgz"
    if not archive.is_file():
        raise ReleaseError(f"helm package wrote no {archive.name}: {done.stdout.strip()}")
    return archive
