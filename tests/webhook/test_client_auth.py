"""``--client-ca-file``: reviews are answered only over a connection with the API server's client
certificate (webhook/clientauth.py); without it, a tenant's pod gets no answer, so ``/mutate``
reads nothing for it. Real TLS over loopback, certificates from a real CA (openssl)."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.webhook.clientauth import ClientAuth, certificate_names
from dra_driver.webhook.server import ReloadingCertificate, WebhookServer
from hami_dra_dev.cluster.pki import ClusterPki, KeyPair
from tests.webhook.test_hami_resources import seed_pod
from tests.webhook.test_optin import RecordingApi

DRIVER = "gpu.hami.io"
API_SERVER = "kube-apiserver-webhook-client"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    return ClusterPki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def api() -> RecordingApi:
    return RecordingApi()


@pytest.fixture
def server(pki: ClusterPki, api: RecordingApi) -> Iterator[WebhookServer]:
    serving = pki.issue("webhook", "webhook", hosts=("127.0.0.1",), client=False, server=True)
    client_auth = ClientAuth(str(pki.ca.cert), [API_SERVER])
    certificate = ReloadingCertificate(str(serving.cert), str(serving.key), client_auth)
    instance = WebhookServer(
        api, DRIVER, host="127.0.0.1", port=0, certificate=certificate, client_auth=client_auth
    )
    instance.start()
    yield instance
    instance.stop()


def call(
    server: WebhookServer, pki: ClusterPki, method: str, path: str, client: KeyPair | None = None
) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    body = None
    if method == "POST":
        request: dict[str, Any] = {"uid": "u", "namespace": "victim", "operation": "CREATE"}
        pod = seed_pod()
        pod["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimName": "victims-claim"}]
        body = json.dumps({"request": request | {"object": pod}})
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["/mutate", "/mutate-hami", "/mutate-claims", "/validate"])
def test_a_review_without_the_api_servers_certificate_gets_no_answer_and_no_read(
    server: WebhookServer, pki: ClusterPki, api: RecordingApi, path: str
) -> None:
    status, text = call(server, pki, "POST", path)
    assert status == 403 and "present its client certificate" in text
    assert api.calls == [], "nothing looked up for the caller"
    samples = server.metrics.registry.get_sample_value(
        "hami_dra_webhook_reviews_total", {"path": path, "outcome": "unauthenticated"}
    )
    assert samples == 1


def test_another_certificate_of_the_same_ca_is_refused_by_name(
    server: WebhookServer, pki: ClusterPki, api: RecordingApi
) -> None:
    """A cluster CA signs kubelets and users too: only the named certificate is the API server."""
    kubelet = pki.issue("kubelet-client", "system:node:node-1", organization="system:nodes")
    status, text = call(server, pki, "POST", "/mutate", kubelet)
    assert status == 403 and "this one is for system:node:node-1" in text
    assert api.calls == []


def test_the_api_servers_certificate_is_answered(
    server: WebhookServer, pki: ClusterPki, api: RecordingApi
) -> None:
    apiserver = pki.issue("apiserver-webhook-client", API_SERVER)
    status, text = call(server, pki, "POST", "/mutate", apiserver)
    assert status == 200 and json.loads(text)["response"]["allowed"]
    assert ("claim", "victim", "victims-claim") in api.calls


def test_a_certificate_of_another_ca_fails_the_handshake(
    server: WebhookServer, pki: ClusterPki, tmp_path: Path
) -> None:
    stranger = ClusterPki(tmp_path).issue("apiserver-webhook-client", API_SERVER)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        call(server, pki, "POST", "/mutate", stranger)


def test_probes_and_metrics_need_no_certificate(server: WebhookServer, pki: ClusterPki) -> None:
    assert call(server, pki, "GET", "/healthz") == (200, "ok")
    assert call(server, pki, "GET", "/metrics")[0] == 200


def test_certificate_names_are_the_common_and_dns_names() -> None:
    peer = {
        "subject": ((("organizationName", "system:masters"),), (("commonName", "apiserver"),)),
        "subjectAltName": (("DNS", "kube-apiserver"), ("IP Address", "10.0.0.1")),
    }
    assert certificate_names(peer) == {"apiserver", "kube-apiserver"}


def test_a_ca_file_that_does_not_load_is_an_error(tmp_path: Path) -> None:
    broken = tmp_path / "ca.crt"
    broken.write_text("not a certificate")
    with pytest.raises(ssl.SSLError):
        ClientAuth(str(broken))
