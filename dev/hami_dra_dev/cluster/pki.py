"""The cluster's certificates: one CA, serving and client certificates, service-account keys.

Made with the ``openssl`` command line (``hack/install.d/openssl.sh`` installs it), once per state
directory: a restarted cluster keeps its identities, so kubeconfigs handed out stay valid.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


class PkiError(RuntimeError):
    """openssl is missing or failed."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)
    except FileNotFoundError as err:
        raise PkiError("openssl not found; install it (hack/install.d/openssl.sh)") from err
    except subprocess.CalledProcessError as err:
        raise PkiError(f"openssl {args[0]} failed: {err.stderr.strip()}") from err


class ClusterPki:
    """Files under ``<state>/pki``; every method is idempotent."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        if not self.ca.cert.exists():
            _openssl(
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                "-keyout", str(self.ca.key), "-out", str(self.ca.cert),
                "-subj", "/CN=hami-dra-cluster-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            )  # fmt: skip

    def service_account_keys(self) -> KeyPair:
        """An RSA key pair: the private key signs tokens (kube-apiserver, kube-controller-manager)."""
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        if not pair.key.exists():
            _openssl("genrsa", "-out", str(pair.key), "2048")
            _openssl("rsa", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
        return pair

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        hosts: tuple[str, ...] = (),
        client: bool = True,
        server: bool = False,
    ) -> KeyPair:
        """A certificate signed by the CA; ``hosts`` become SANs (IP or DNS).

        Kept across `cluster up` runs, and issued again when what it asks for (subject, usages,
        SANs) differs from what the kept one was issued for, so a checkout that adds a SAN gets it.
        """
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        usages = [u for u, on in (("clientAuth", client), ("serverAuth", server)) if on]
        ext = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
        ]
        if hosts:
            sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
            ext.append(f"subjectAltName={sans}")
        request = "\n".join([f"subject={subject}", *ext]) + "\n"
        issued_for = self.dir / f"{name}.request"
        kept = pair.cert.exists() and pair.key.exists() and issued_for.exists()
        if kept and issued_for.read_text() == request:
            return pair
        csr = self.dir / f"{name}.csr"
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pair.key),
                 "-out", str(csr), "-subj", subject)  # fmt: skip
        ext_file = self.dir / f"{name}.ext"
        ext_file.write_text("\n".join(ext) + "\n")
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key),
            "-CAcreateserial", "-days", "3650", "-out", str(pair.cert), "-extfile", str(ext_file),
        )  # fmt: skip
        csr.unlink(missing_ok=True)
        ext_file.unlink(missing_ok=True)
        issued_for.write_text(request)
        return pair
