"""A renewed certificate is served without a restart (cert-manager rotates the key and the CA may change).

The files are laid out as the kubelet writes a Secret volume: ``tls.crt -> ..data/tls.crt`` and
``..data -> <version dir>``, renewed by swapping the ``..data`` link in one rename.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.webhook.server import WebhookServer
from dra_driver.webhook.tls import ReloadingCertificate
from hami_dra_dev.certs import CertPair, make_self_signed
from tests.waiting import wait_for
from tests.webhook.test_webhook import FakeLookup

DRIVER = "gpu.hami.io"


class SecretVolume:
    """A directory updated the way the kubelet updates a mounted Secret."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir()
        for name in ("tls.crt", "tls.key"):
            (root / name).symlink_to(Path("..data") / name)

    @property
    def cert(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key(self) -> str:
        return str(self.root / "tls.key")

    def publish(self, cert: bytes, key: bytes) -> None:
        self.versions += 1
        version = self.root / f"..v{self.versions}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert)
        (version / "tls.key").write_bytes(key)
        link = self.root / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.root / "..data")


def pair(tmp_path: Path, name: str) -> CertPair:
    return make_self_signed(tmp_path / name, "localhost", ("127.0.0.1", "localhost"))


def answered(server: WebhookServer, ca: CertPair) -> bool:
    """Whether a client trusting only ``ca`` gets /healthz answered."""
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{server.port}/healthz", context=context, timeout=5
        ) as reply:
            return bool(reply.status == 200)
    except urllib.error.URLError as err:
        if isinstance(err.reason, ssl.SSLCertVerificationError):
            return False
        raise


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    return SecretVolume(tmp_path / "tls")


@pytest.fixture
def first(tmp_path: Path, volume: SecretVolume) -> CertPair:
    issued = pair(tmp_path, "first")
    volume.publish(issued.cert_file.read_bytes(), issued.key_file.read_bytes())
    return issued


@pytest.fixture
def server(volume: SecretVolume, first: CertPair) -> Iterator[WebhookServer]:
    certificate = ReloadingCertificate(volume.cert, volume.key)
    instance = WebhookServer(FakeLookup(), DRIVER, host="127.0.0.1", port=0, certificate=certificate)
    instance.start()
    yield instance
    instance.stop()


def test_a_renewed_certificate_from_a_new_ca_is_served_without_a_restart(
    tmp_path: Path, volume: SecretVolume, first: CertPair, server: WebhookServer
) -> None:
    assert answered(server, first)
    renewed = pair(tmp_path, "renewed")
    volume.publish(renewed.cert_file.read_bytes(), renewed.key_file.read_bytes())
    assert wait_for(lambda: answered(server, renewed), timeout=5, what="the renewed certificate served")
    assert not answered(server, first), "the old certificate is no longer served"


def test_a_broken_pair_keeps_the_previous_certificate_with_one_warning(
    tmp_path: Path,
    volume: SecretVolume,
    first: CertPair,
    server: WebhookServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    renewed = pair(tmp_path, "renewed")
    caplog.set_level(logging.WARNING, logger="dra_driver.webhook.tls")
    # A new certificate with the old key: what a reader sees between the two files of a renewal.
    volume.publish(renewed.cert_file.read_bytes(), first.key_file.read_bytes())
    for _ in range(3):
        assert answered(server, first), "still serving the previous certificate"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "changed but do not load" in warnings[0] and volume.cert in warnings[0]
    # Garbage, then the complete pair: each change is tried again.
    volume.publish(b"-----BEGIN CERTIFICATE-----\nnot a cert", b"")
    assert answered(server, first)
    volume.publish(renewed.cert_file.read_bytes(), renewed.key_file.read_bytes())
    assert wait_for(lambda: answered(server, renewed), timeout=5, what="the complete pair served")
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_files_that_vanish_for_a_moment_keep_the_loaded_certificate(
    volume: SecretVolume, first: CertPair, server: WebhookServer
) -> None:
    shutil.rmtree(volume.root / f"..v{volume.versions}")
    assert answered(server, first)


def test_the_first_load_must_succeed(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ReloadingCertificate(str(tmp_path / "none.crt"), str(tmp_path / "none.key"))
