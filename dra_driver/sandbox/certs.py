"""Self-signed TLS material for the sandbox (API server, and webhooks started beside it).

Current kubectl/client-go refuse to send a bearer token over plain HTTP, so the sandbox serves
HTTPS like a real cluster. Certificates come from the ``openssl`` command line (present on every
development machine; no Python crypto dependency) and are made once per process and directory.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertPair:
    """A self-signed certificate (which is also its own CA) and its private key."""

    cert_file: Path
    key_file: Path

    @property
    def ca_pem(self) -> bytes:
        return self.cert_file.read_bytes()


class CertError(RuntimeError):
    """openssl is missing or failed; the message says what to install or what went wrong."""


def make_self_signed(
    directory: Path,
    common_name: str = "hami-dra-sandbox",
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
) -> CertPair:
    """Write ``<cn>.crt``/``<cn>.key`` into ``directory``: EC P-256, valid 10 years, SANs for ``hosts``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{common_name}.crt", directory / f"{common_name}.key"
    sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    cmd = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        "3650",
        "-subj",
        f"/CN={common_name}",
        "-addext",
        f"subjectAltName={sans}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,digitalSignature,keyCertSign",
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    except FileNotFoundError as err:
        raise CertError(
            "the sandbox needs the openssl command line tool (apt-get install -y openssl)"
        ) from err
    except subprocess.CalledProcessError as err:
        raise CertError(f"openssl failed: {err.stderr.decode(errors='replace').strip()}") from err
    key.chmod(0o600)
    return CertPair(cert, key)


@functools.cache
def server_cert() -> CertPair:
    """The API server's certificate, shared by every sandbox in this process (made on first use)."""
    return make_self_signed(Path(tempfile.mkdtemp(prefix="hami-dra-sandbox-tls-")), "hami-dra-sandbox")
