"""`make release VERSION=X.Y.Z REGISTRY=host[:port][/path]`: into ``dist/<version>/``

* ``hami-dra-image-<version>.oci.tar``: the image `make image` built (OCI archive);
* ``hami-dra-<version>.tgz``: the chart, its image.repository stamped ``<registry>/hami-dra``;
* ``hami_dra-<version>-py3-none-any.whl`` and ``hami_dra-<version>.tar.gz``: the CLI (``pip install``);
* ``CHANGELOG-<version>.md``: that version's changes and upgrade notes;
* ``SHA256SUMS`` over all of them;

then pushes ``<registry>/hami-dra:<version>`` and ``oci://<registry>/charts/hami-dra:<version>``.
Versions are checked first and the registry's reachability before anything is built."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hack.release import changelog, chart, checksums, registry, versions
from hack.release.errors import ReleaseError

REPO = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where hack/image/build.sh keeps its podman storage and the archive (``image/``)."""
    return Path(os.environ.get("HAMI_DRA_CACHE") or Path.home() / ".cache" / "hami-dra")


@dataclass
class Release:
    version: str
    target: registry.Target
    out: Path
    artifacts: list[Path] = field(default_factory=list)
    pushed: dict[str, str] = field(default_factory=dict)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--version", default="", help="X.Y.Z; default: pyproject.toml's (every file must agree)"
    )
    parser.add_argument("--registry", default=registry.DEFAULT_REGISTRY, help="host[:port][/path]")
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="artifacts go to OUT/<version>/")
    archive = "~/.cache/hami-dra/image/hami-dra-<version>.oci.tar (make image)"
    parser.add_argument("--image-archive", type=Path, default=None, help=f"default: {archive}")
    parser.add_argument("--helm", default=str(REPO / ".tools" / "bin" / "helm"))
    parser.add_argument("--ca-file", type=Path, default=None, help="CA certificate of a private registry")
    parser.add_argument("--plain-http", action="store_true", help="a registry without TLS")
    parser.add_argument("--no-push", action="store_true", help="build the artifacts only")
    parser.add_argument("--check", action="store_true", help="only check versions and the registry")
    return parser.parse_args(argv)


def warn_if_dirty(repo: Path) -> None:
    done = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode == 0 and done.stdout.strip():
        changed = len(done.stdout.strip().splitlines())
        print(f"release: warning: {changed} uncommitted change(s): the artifacts are not the commit's",
              file=sys.stderr)  # fmt: skip


def python_distributions(repo: Path, out: Path) -> list[Path]:
    """The wheel and the sdist (``uv build``), built aside: uv also leaves a .gitignore behind."""
    uv = Path(sys.executable).parent / "uv"
    command = [str(uv)] if uv.is_file() else [sys.executable, "-m", "uv"]
    with tempfile.TemporaryDirectory(prefix="hami-dra-dist-") as work:
        with_uv = [*command, "build", "--quiet", "--sdist", "--wheel", "--out-dir", work, str(repo)]
        done = subprocess.run(with_uv, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise ReleaseError(f"uv build failed: {done.stderr.strip()[-2000:]}")
        built = sorted(Path(work).glob("hami_dra-*"))
        return [Path(shutil.move(path, out / path.name)) for path in built]


def build(args: argparse.Namespace, version: str, target: registry.Target) -> Release:
    release = Release(version, target, args.out / version)
    archive = args.image_archive or cache_dir() / "image" / f"hami-dra-{version}.oci.tar"
    if not archive.is_file():
        raise ReleaseError(f"no image archive at {archive}: build it with `make image`")
    if release.out.exists():
        shutil.rmtree(release.out)
    release.out.mkdir(parents=True)
    image = release.out / f"hami-dra-image-{version}.oci.tar"
    shutil.copyfile(archive, image)
    release.artifacts.append(image)
    release.artifacts.append(chart.package(REPO, args.helm, version, target.image_repository, release.out))
    release.artifacts += python_distributions(REPO, release.out)
    notes = release.out / f"CHANGELOG-{version}.md"
    notes.write_text(changelog.section(changelog.read(REPO / "CHANGELOG.md"), version))
    release.artifacts.append(notes)
    release.artifacts.append(checksums.write(release.out))
    return release


def push(release: Release, archive: Path, helm: str) -> None:
    podman = registry.Podman(cache_dir() / "image")
    target, version = release.target, release.version
    release.pushed[target.image(version)] = podman.push(archive, version, target)
    tgz = release.out / f"hami-dra-{version}.tgz"
    release.pushed[f"{target.charts}/{registry.CHART_NAME}:{version}"] = registry.push_chart(
        helm, tgz, target
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        version = versions.release_version(versions.read(REPO), args.version or None)
        target = registry.Target(args.registry, args.ca_file, args.plain_http)
        warn_if_dirty(REPO)
        if not args.no_push:
            registry.check_reachable(target)
        if args.check:
            print(f"release: {version} consistent; registry {target.registry}")
            return 0
        if not Path(args.helm).is_file():
            raise ReleaseError(f"helm is not at {args.helm}: bash hack/install.d/helm.sh")
        release = build(args, version, target)
        if not args.no_push:
            push(release, release.out / f"hami-dra-image-{version}.oci.tar", args.helm)
    except ReleaseError as err:
        print(f"release: error: {err}", file=sys.stderr)
        return 2
    print(f"release {version} in {release.out}:")
    for artifact in release.artifacts:
        print(f"  {artifact.name}")
    for ref, digest in release.pushed.items():
        print(f"pushed {ref} {digest}")
    print(f"install: helm install hami-dra {target.charts}/{registry.CHART_NAME} --version {version} "
          "-n hami-system --create-namespace")  # fmt: skip
    return 0
