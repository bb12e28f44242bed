"""Where the upstream binaries live, and how they are built (``hack/cluster/build.sh``).

The build script owns the cache layout (``<cache>/<component>/v<version>/bin``) and prints one
``bin: <dir>`` line per component; this module only runs it and reads those lines, so the layout
is written down once.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "cluster" / "build.sh"
VERSIONS_FILE = REPO_ROOT / "hack" / "cluster" / "versions.env"

#: Programs each cluster needs, by the component directory build.sh puts them in.
REQUIRED: dict[str, tuple[str, ...]] = {
    "kubernetes": (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
    ),
    "etcd": ("etcd",),
    "containerd": ("containerd", "containerd-shim-runc-v2", "ctr"),
    "cni-plugins": ("bridge", "loopback", "host-local", "portmap"),
    "crictl": ("crictl",),
}


#: The NVIDIA Container Toolkit's programs (build.sh's ``nvidia-container-toolkit`` component): the
#: tests generate CDI specs with them as a GPU node's toolkit would. No cluster runs them, so they
#: are not in :data:`REQUIRED`.
NVIDIA_TOOLKIT_PROGRAMS: tuple[str, ...] = ("nvidia-ctk", "nvidia-cdi-hook")


class MissingBinaries(RuntimeError):
    """Some upstream program is not built; the message names the command that builds it."""


def pinned_versions() -> dict[str, str]:
    """``hack/cluster/versions.env`` as a dict (KEY=value lines; comments skipped)."""
    if not VERSIONS_FILE.is_file():
        raise MissingBinaries(
            f"{VERSIONS_FILE} not found: 'hami-dra cluster' needs a checkout of the hami-dra repository"
        )
    versions: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


def default_kubernetes_version() -> str:
    return pinned_versions()["KUBERNETES_VERSION_DEFAULT"]


def normalise_version(version: str | None) -> str:
    """``v1.34.4`` / ``1.34.4`` / None (the default) -> ``1.34.4``."""
    return (version or default_kubernetes_version()).removeprefix("v")


def cache_dir() -> Path:
    return Path(os.environ.get("HAMI_DRA_CACHE") or Path.home() / ".cache" / "hami-dra")


@dataclass(frozen=True)
class Toolchain:
    """Absolute paths of the programs one cluster runs."""

    kubernetes_version: str
    dirs: dict[str, Path]

    def path(self, program: str) -> Path:
        for component, programs in REQUIRED.items():
            if program in programs:
                return self.dirs[component] / program
        raise KeyError(program)

    @property
    def cni_bin_dir(self) -> Path:
        return self.dirs["cni-plugins"]

    def missing(self) -> list[str]:
        return [
            str(self.dirs[component] / program)
            for component, programs in REQUIRED.items()
            for program in programs
            if not os.access(self.dirs[component] / program, os.X_OK)
        ]


def pinned_kubernetes_versions() -> list[str]:
    """Kubernetes versions with a module in hack/cluster/go/ (what build.sh can build)."""
    modules = REPO_ROOT / "hack" / "cluster" / "go"
    return sorted(
        p.name.removeprefix("kubernetes-") for p in modules.glob("kubernetes-*") if (p / "go.mod").is_file()
    )


def expected_toolchain(kubernetes_version: str | None = None) -> Toolchain:
    """The toolchain's paths as build.sh lays them out, whether or not they are built yet."""
    version = normalise_version(kubernetes_version)
    pinned = pinned_kubernetes_versions()
    if version not in pinned:
        raise MissingBinaries(
            f"Kubernetes {version} is not pinned (pinned: {', '.join(pinned)}); add it with "
            f"hack/cluster/gen-kubernetes-module.sh {version}"
        )
    pins = pinned_versions()
    versions = {
        "kubernetes": version,
        "etcd": pins["ETCD_VERSION"],
        "containerd": pins["CONTAINERD_VERSION"],
        "cni-plugins": pins["CNI_PLUGINS_VERSION"],
        "crictl": pins["CRICTL_VERSION"],
    }
    root = cache_dir()
    return Toolchain(version, {c: root / c / f"v{v}" / "bin" for c, v in versions.items()})


def nvidia_toolkit_bin() -> Path:
    """Where build.sh puts ``nvidia-ctk`` and ``nvidia-cdi-hook`` (built or not): the cache layout
    for the version pinned in versions.env, so a new pin never finds an old build."""
    version = pinned_versions()["NVIDIA_CONTAINER_TOOLKIT_VERSION"]
    return cache_dir() / "nvidia-container-toolkit" / f"v{version}" / "bin"


def build_command(kubernetes_version: str | None = None) -> str:
    version = normalise_version(kubernetes_version)
    return f"hami-dra cluster build --kubernetes-version {version}"


def require_toolchain(kubernetes_version: str | None = None) -> Toolchain:
    """The built toolchain, or :class:`MissingBinaries` naming the build command."""
    toolchain = expected_toolchain(kubernetes_version)
    missing = toolchain.missing()
    if missing:
        raise MissingBinaries(
            f"{len(missing)} upstream program(s) not built (first: {missing[0]}); "
            f"run: {build_command(kubernetes_version)}"
        )
    return toolchain


def build(kubernetes_version: str | None = None) -> Toolchain:
    """Run build.sh (progress goes to stderr; a warm cache returns in about a second)."""
    version = normalise_version(kubernetes_version)
    if not BUILD_SCRIPT.is_file():
        raise MissingBinaries(
            f"{BUILD_SCRIPT} not found: building needs a checkout of the hami-dra repository"
        )
    env = {**os.environ, "KUBERNETES_VERSION": version, "HAMI_DRA_CACHE": str(cache_dir())}
    try:
        subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, check=True, stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError as err:
        raise MissingBinaries(
            f"{BUILD_SCRIPT} failed with exit status {err.returncode} (its output is above)"
        ) from err
    except FileNotFoundError as err:
        raise MissingBinaries(f"cannot run bash for {BUILD_SCRIPT}: {err}") from err
    return require_toolchain(version)
