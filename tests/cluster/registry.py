"""A real OCI registry on this machine for the release test: Debian's ``docker-registry`` (the CNCF
distribution registry) serving TLS with a certificate the test makes, trusted by the cluster's
containerd through a ``hosts.toml`` in its registry hosts directory (``config_path``) and by helm
and podman through the CA file. Installed by hack/install.d/registry.sh (``make test``)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver import __version__
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.cluster.layout import Layout
from tests.chart.helpers import REPO, find_or_install_helm
from tests.cluster.drivers import ChartDriver
from tests.waiting import wait_for

if TYPE_CHECKING:
    from tests.cluster.conftest import RealCluster

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class LocalRegistry:
    """``docker-registry serve`` on ``127.0.0.1:<free port>`` with its storage under ``root``."""

    def __init__(self, root: Path) -> None:
        program = shutil.which("docker-registry")
        if program is None:
            raise FileNotFoundError("docker-registry is not installed: bash hack/install.d/registry.sh")
        self.root = root
        self.port = _free_port()
        self.host = f"{HOST}:{self.port}"
        tls = make_self_signed(root / "tls", "registry", hosts=(HOST,))
        self.ca_file = tls.cert_file
        config = root / "config.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                    "http": {
                        "addr": self.host,
                        "tls": {"certificate": str(tls.cert_file), "key": str(tls.key_file)},
                    },
                }
            )
        )
        self.log = root / "registry.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([program, "serve", str(config)], stdout=out, stderr=out)
        self.context = ssl.create_default_context(cafile=str(self.ca_file))
        wait_for(self._answers, 30, f"the registry at {self.host} answering /v2/ (log: {self.log})")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"docker-registry exited: {self.log.read_text()[-2000:]}")
        try:
            self.get("/v2/")
            return True
        except OSError:
            return False

    def get(self, path: str, accept: str = "") -> Any:
        request = urllib.request.Request(
            f"https://{self.host}{path}", headers={"Accept": accept} if accept else {}
        )
        with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
            return json.loads(response.read() or b"{}")

    def repositories(self) -> list[str]:
        return list(self.get("/v2/_catalog")["repositories"])

    def tags(self, repository: str) -> list[str]:
        return list(self.get(f"/v2/{repository}/tags/list")["tags"])

    def trust_in_containerd(self, hosts_dir: Path) -> Path:
        """``<hosts_dir>/<host:port>/hosts.toml``: containerd pulls from it over TLS with our CA."""
        directory = hosts_dir / self.host
        directory.mkdir(parents=True, exist_ok=True)
        hosts = directory / "hosts.toml"
        hosts.write_text(
            f'server = "https://{self.host}"\n\n'
            f'[host."https://{self.host}"]\n  capabilities = ["pull", "resolve"]\n  ca = "{self.ca_file}"\n'
        )
        return hosts

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


#: The path under the registry the release test pushes to: no image of this name was ever
#: imported into the cluster's containerd, so a running pod of it was pulled.
RELEASE_PATH = "release-test"


@dataclass(frozen=True)
class Released:
    """What ``make release`` reported: its artifacts' directory and the pushed references."""

    version: str
    out: Path
    image: str
    image_digest: str
    chart: str


def release(registry: LocalRegistry, out: Path) -> Released:
    """``python -m hack.release`` (what ``make release`` runs after ``make image``) against the local
    registry: the archive `make image` left in the cache, packaged, checksummed and pushed."""
    target = f"{registry.host}/{RELEASE_PATH}"
    done = subprocess.run(
        [sys.executable, "-m", "hack.release", "--registry", target, "--ca-file", str(registry.ca_file),
         "--out", str(out), "--helm", find_helm()],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"make release failed: {done.stderr}\n{done.stdout}"
    pushed = dict(line.split()[1:3] for line in done.stdout.splitlines() if line.startswith("pushed "))
    image = f"{target}/hami-dra:{__version__}"
    chart = f"oci://{target}/charts/hami-dra"
    assert set(pushed) == {image, f"{chart}:{__version__}"}, done.stdout
    return Released(__version__, out / __version__, image, pushed[image], chart)


def find_helm() -> str:
    helm, why = find_or_install_helm()
    assert helm is not None, why
    return helm


class RegistryDriver(ChartDriver):
    """The chart as a user installs a release: ``helm install oci://<registry>/.../charts/hami-dra``
    with the registry's CA and the no-GPU values of docs/install.md, nothing about the image: the
    packaged chart names the image the release pushed, and containerd pulls it."""

    kind = "registry"

    def __init__(self, cluster: RealCluster, helm: str, root: Path) -> None:
        self.registry = LocalRegistry(root / "registry")
        try:
            self.released = release(self.registry, root / "dist")
            self.hosts = self.registry.trust_in_containerd(Layout(cluster.state_dir).registry_hosts_dir)
            self.cluster, self.helm = cluster, helm
            self.images_before = self.containerd_images()
            super().__init__(cluster, helm)
        except BaseException:
            self.registry.stop()
            raise

    def _import_image(self) -> None:
        """Nothing imported: the image comes from the registry."""

    def chart_source(self) -> list[str]:
        return [
            self.released.chart,
            "--version",
            self.released.version,
            "--ca-file",
            str(self.registry.ca_file),
        ]

    def values_args(self) -> list[str]:
        """docs/install.md's no-GPU install (simulated T4s); the kubelet root of this cluster."""
        kubelet_root = Layout(self.cluster.state_dir).kubelet_root
        values = (
            "kubeletPlugin.source=simulated",
            "kubeletPlugin.simulated.profile=t4",
            "kubeletPlugin.simulated.gpus=4",
            f"kubeletPlugin.kubeletRootDir={kubelet_root}",
        )
        return [arg for value in values for arg in ("--set", value)]

    def containerd_images(self) -> set[str]:
        socket = self.cluster.state_dir / "containerd" / "containerd.sock"
        ctr = str(self.cluster.toolchain.path("ctr"))
        listed = subprocess.run(
            [ctr, "--address", str(socket), "-n", "k8s.io", "images", "ls", "-q"],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return set(listed.stdout.split())

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.registry.stop()
            self.hosts.unlink(missing_ok=True)
