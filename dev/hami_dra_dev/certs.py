"""Self-signed TLS material for development servers: the sandbox API server, webhooks started
beside it or the demo, a test's registry.

Current kubectl/client-go refuse to send a bearer token over plain HTTP, so the sandbox serves
HTTPS like a real cluster. Certificates come from the ``openssl`` command line (present on every
development machine; no Python crypto dependency) and are made once per process and directory.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import threading
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


_SERVER_CERT: CertPair | None = None
_LOCK = threading.Lock()


def server_cert() -> CertPair:
    """The API server's certificate, shared by every sandbox in this process.

    Made on first use, and made again if something cleaned its temp dir away meanwhile.
    """
    global _SERVER_CERT
    with _LOCK:
        if _SERVER_CERT is None or not (_SERVER_CERT.cert_file.exists() and _SERVER_CERT.key_file.exists()):
            directory = Path(tempfile.mkdtemp(prefix="hami-dra-sandbox-tls-"))
            atexit.register(shutil.rmtree, directory, True)
            _SERVER_CERT = make_self_signed(directory, "hami-dra-sandbox")
        return _SERVER_CERT
