"""The webhook's serving certificate, reloaded when its files change.

cert-manager renews the certificate (``rotationPolicy: Always``: a new key too) and the kubelet
swaps the Secret's files in the pod; a context loaded once would keep serving the old certificate,
whose CA the API server stops trusting, until someone restarts the pod. Each new connection
therefore checks the files' identity (inode, size, modification time: two ``stat`` calls) and
builds a new context when they changed. A pair that does not load (half-written, key and
certificate from different renewals) leaves the previous context in use, with one warning per
broken version of the files; the next change is tried again.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.webhook.clientauth import ClientAuth

log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int], ...]


def tls_context(cert_file: str, key_file: str, client_auth: ClientAuth | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving ``cert_file`` with ``key_file`` (asking for a client
    certificate with ``client_auth``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_auth is not None:
        client_auth.configure(context)
    return context


def _signature(*paths: str) -> Signature:
    """What changes when a file is replaced or rewritten (``stat`` follows the Secret's symlinks)."""
    result = []
    for path in paths:
        status = os.stat(path)
        result.append((status.st_ino, status.st_size, status.st_mtime_ns))
    return tuple(result)


class ReloadingCertificate:
    """The context for the next connection: rebuilt from ``cert_file``/``key_file`` when they change.

    The first load happens in the constructor and raises (``OSError``, ``ssl.SSLError``) like
    ``tls_context``: a webhook must not start without a certificate.
    """

    def __init__(self, cert_file: str, key_file: str, client_auth: ClientAuth | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_auth = client_auth
        self._lock = threading.Lock()
        self._signature = _signature(cert_file, key_file)
        self._context = tls_context(cert_file, key_file, client_auth)
        self._rejected: Signature | None = None
        self.reloads = 0

    def context(self) -> ssl.SSLContext:
        """The current context, after loading the files again if they changed since last time."""
        try:
            signature = _signature(self.cert_file, self.key_file)
        except OSError as err:  # the kubelet is between two versions of the files
            log.debug("certificate files not readable, keeping the loaded certificate: %s", err)
            signature = self._signature
        with self._lock:
            if signature not in (self._signature, self._rejected):
                self._reload(signature)
            return self._context

    def _reload(self, signature: Signature) -> None:
        try:
            context = tls_context(self.cert_file, self.key_file, self.client_auth)
        except (OSError, ssl.SSLError) as err:
            self._rejected = signature
            log.warning(
                "certificate files %s and %s changed but do not load (%s); still serving the previous "
                "certificate, will retry when the files change again",
                self.cert_file,
                self.key_file,
                err,
            )
            return
        self._context, self._signature, self._rejected = context, signature, None
        self.reloads += 1
        log.info("serving the renewed certificate from %s", self.cert_file)
