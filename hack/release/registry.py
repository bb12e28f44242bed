"""Pushes to an OCI registry: the image with podman (from the storage `make image` builds into, the
same image as the archive), the chart with ``helm push``. Authentication is the tools' own
(``podman login``, ``helm registry login``); TLS trusts the system CAs, or ``ca_file`` (a private
registry), or nothing at all with ``plain_http``."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hack.release.errors import ReleaseError

#: Where released images and charts go unless REGISTRY says otherwise; the chart's default
#: image.repository (charts/hami-dra/values.yaml) names this registry's image.
DEFAULT_REGISTRY = "ghcr.io/hami-dra"
IMAGE_NAME = "hami-dra"
CHART_NAME = "hami-dra"
#: The name hack/image/build.sh gives the image it builds (and saves as the archive).
LOCAL_IMAGE = "localhost/hami-dra"


@dataclass(frozen=True)
class Target:
    """``host[:port][/path]`` and how to talk to it."""

    registry: str
    ca_file: Path | None = None
    plain_http: bool = False

    def __post_init__(self) -> None:
        host = self.registry.split("/", 1)[0]
        if not self.registry or "://" in self.registry or not host or self.registry.endswith("/"):
            raise ReleaseError(
                f"REGISTRY={self.registry!r} is not host[:port][/path] (no scheme, no trailing '/'), "
                f"e.g. REGISTRY={DEFAULT_REGISTRY}"
            )
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ReleaseError(f"CA_FILE={self.ca_file} does not exist")

    @property
    def host(self) -> str:
        return self.registry.split("/", 1)[0]

    @property
    def image_repository(self) -> str:
        return f"{self.registry}/{IMAGE_NAME}"

    def image(self, version: str) -> str:
        return f"{self.image_repository}:{version}"

    @property
    def charts(self) -> str:
        """Where ``helm push`` puts the chart: ``oci://<registry>/charts`` (+ ``/hami-dra``)."""
        return f"oci://{self.registry}/charts"

    def helm_flags(self) -> list[str]:
        if self.plain_http:
            return ["--plain-http"]
        return ["--ca-file", str(self.ca_file)] if self.ca_file else []


def check_reachable(target: Target, timeout: float = 10.0) -> None:
    """The registry's ``/v2/`` answers (any HTTP status: 401 only asks for a login), before
    anything is built; else one line that says what to do."""
    scheme = "http" if target.plain_http else "https"
    url = f"{scheme}://{target.host}/v2/"
    context = ssl.create_default_context(cafile=str(target.ca_file) if target.ca_file else None)
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context if scheme == "https" else None):
            return
    except urllib.error.HTTPError:
        return  # it answered: 401/403 is for the tools' own login
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise ReleaseError(
                f"registry {target.host}: its TLS certificate is not trusted ({reason.verify_message}): "
                "pass CA_FILE=<its CA certificate>, or PLAIN_HTTP=1 for a registry without TLS"
            ) from err
        raise ReleaseError(
            f"registry {target.host} is unreachable at {url} ({reason}): start it or fix REGISTRY=, "
            "or build without pushing: make release PUSH=0"
        ) from err
    except (OSError, TimeoutError) as err:
        raise ReleaseError(
            f"registry {target.host} is unreachable at {url} ({err}): start it or fix REGISTRY=, "
            "or build without pushing: make release PUSH=0"
        ) from err


def archive_config_digest(archive: Path) -> str:
    """The image ID (its config's digest) of an OCI archive holding one image."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> bytes:
            stream = tar.extractfile(name)
            if stream is None:
                raise ReleaseError(f"{archive}: no {name}")
            return stream.read()

        index = json.loads(member("index.json"))
        digest = index["manifests"][0]["digest"]
        manifest = json.loads(member("blobs/" + digest.replace(":", "/")))
        return str(manifest["config"]["digest"])


class Podman:
    """podman with the storage hack/image/build.sh uses (``~/.cache/hami-dra/image``)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.env = {**os.environ, "CONTAINERS_CONF": str(cache / "containers.conf")}
        self.base = ["podman", "--root", str(cache / "storage"), "--runroot", str(cache / "run"),
                     "--tmpdir", str(cache / "tmp"), "--storage-driver", "vfs"]  # fmt: skip

    def run(self, *args: str, timeout: float = 900) -> str:
        if shutil.which("podman") is None:
            raise ReleaseError("podman is required to push the image: bash hack/install.d/podman.sh")
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env, check=False)  # fmt: skip
        if done.returncode != 0:
            raise ReleaseError(f"podman {args[0]} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def image_id(self, ref: str) -> str | None:
        try:
            return self.run("image", "inspect", "--format", "{{.Id}}", ref).strip()
        except ReleaseError:
            return None

    def push(self, archive: Path, version: str, target: Target) -> str:
        """Push the archive's image as ``<registry>/hami-dra:<version>``; returns its digest.
        podman pushes from its storage, so the archive is loaded first when the stored image
        is another build (another worktree's `make image`, say)."""
        local = f"{LOCAL_IMAGE}:{version}"
        wanted = archive_config_digest(archive).removeprefix("sha256:")
        if self.image_id(local) != wanted:
            self.run("load", "-q", "-i", str(archive))
            self.run("tag", wanted, local)
        with tempfile.TemporaryDirectory(prefix="hami-dra-push-") as work:
            flags = ["--digestfile", f"{work}/digest"]
            if target.plain_http:
                flags.append("--tls-verify=false")
            elif target.ca_file:
                certs = Path(work) / "certs"
                certs.mkdir()
                shutil.copyfile(target.ca_file, certs / "ca.crt")
                flags += ["--cert-dir", str(certs)]
            self.run("push", "--quiet", *flags, local, f"docker://{target.image(version)}")
            return (Path(work) / "digest").read_text().strip()


def push_chart(helm: str, chart: Path, target: Target) -> str:
    """``helm push`` of the packaged chart to ``oci://<registry>/charts``; returns its digest."""
    done = subprocess.run([helm, "push", str(chart), target.charts, *target.helm_flags()],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    if done.returncode != 0:
        raise ReleaseError(f"helm push to {target.charts} failed: {done.stderr.strip()}")
    output = done.stdout + done.stderr
    digest = next((line.split()[-1] for line in output.splitlines() if line.startswith("Digest:")), "")
    return digest
