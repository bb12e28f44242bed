"""Answer reviews only to the API server: its client certificate, where the cluster sends one.

The webhook's Service answers any pod that reaches it, and a review's body is whatever its sender
wrote. ``/mutate-hami`` answers from the body alone, but ``/mutate`` must follow the claims a pod
names to their DeviceClass (a GET each), so a hand-made review naming another namespace's claims
learns whether they exist and are ours. Nothing in the body can prove who sent it; a TLS client
certificate can. kube-apiserver presents one to webhooks when its admin configures it
(``--admission-control-config-file`` with a ``WebhookAdmissionConfiguration`` whose kubeconfig
names the certificate: docs/multi-tenant.md). With ``--client-ca-file`` the webhook then asks every
connection for a certificate and answers reviews (POST) only over a connection that presented one
the CA signed, whose subject common name or DNS name is one of ``--client-name`` (any name when
none is given; a cluster CA usually signs kubelets and users too, so naming the API server's
certificate is what makes this an API-server-only door). Health and metrics (GET) stay open:
probes and scrapers do not carry the API server's certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from typing import Any


class ClientAuth:
    """Which client certificates may send reviews."""

    def __init__(self, ca_file: str, names: Iterable[str] = ()) -> None:
        self.ca_file = ca_file
        self.names = frozenset(names)
        ssl.create_default_context(cafile=ca_file)  # raises now (OSError, SSLError) if it does not load

    def configure(self, context: ssl.SSLContext) -> None:
        """Ask for a client certificate and verify one that is sent (a connection without one still
        completes its handshake, for the probes; ``refusal`` turns its reviews away)."""
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=self.ca_file)

    def refusal(self, peer: Mapping[str, Any] | None) -> str | None:
        """Why a review over a connection whose verified peer certificate is ``peer`` is refused;
        None when it may be answered. ``peer`` is ``SSLSocket.getpeercert()``: empty without one."""
        if not peer:
            return "reviews are answered only to the API server: present its client certificate"
        names = certificate_names(peer)
        if self.names and not names & self.names:
            expected = ", ".join(sorted(self.names))
            return (
                f"reviews are answered only to the API server's client certificate ({expected}); "
                f"this one is for {', '.join(sorted(names)) or 'no name'}"
            )
        return None


def certificate_names(peer: Mapping[str, Any]) -> frozenset[str]:
    """The subject's common names and the DNS names of a ``getpeercert()`` dict."""
    names = {str(value) for rdn in peer.get("subject") or () for key, value in rdn if key == "commonName"}
    names |= {str(value) for kind, value in peer.get("subjectAltName") or () if kind == "DNS"}
    return frozenset(names)
