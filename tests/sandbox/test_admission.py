"""Admission webhooks are called over HTTPS with AdmissionReview v1, trusting only the caBundle."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.sandbox import SandboxServer
from tests.sandbox.helpers import claim_obj, pod_obj

NS = "default"


class Reviewer(BaseHTTPRequestHandler):
    """Mutating: adds a label and a scheduling gate. Validating: denies claims named deny-*."""

    reviews: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Reviewer.reviews.append(review)
        req = review["request"]
        response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        if self.path == "/mutate":
            patch = [
                {"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}},
                {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "gpu.hami.io/allocation"}]},
            ]
            response.update(
                patchType="JSONPatch",
                patch=base64.b64encode(json.dumps(patch).encode()).decode(),
                warnings=['policy "foo" is unknown'],
            )
        elif req["name"].startswith("deny-"):
            response.update(
                allowed=False, status={"code": 403, "message": "claims named deny-* are not allowed"}
            )
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[str, str]]:
    pair = make_self_signed(tmp_path / "tls", "webhook", ("127.0.0.1", "hami-dra-webhook.kube-system.svc"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Reviewer)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pair.cert_file, pair.key_file)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Reviewer.reviews = []
    yield f"https://127.0.0.1:{server.server_port}", base64.b64encode(pair.ca_pem).decode()
    server.shutdown()
    server.server_close()


def _config(
    kind: str, url: str, ca: str, resources: list[str], group: str, policy: str = "Fail"
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": f"test-{kind.lower()}"},
        "webhooks": [
            {
                "name": "test.gpu.hami.io",
                "clientConfig": {"url": url, "caBundle": ca},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "resources": resources,
                    }
                ],
                "failurePolicy": policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }


def test_mutating_webhook_patches_pods(sandbox_client: Any, webhook: tuple[str, str]) -> None:
    url, ca = webhook
    adm = client.AdmissionregistrationV1Api(sandbox_client)
    adm.create_mutating_webhook_configuration(
        _config("MutatingWebhookConfiguration", url + "/mutate", ca, ["pods"], "")
    )
    pod = client.CoreV1Api(sandbox_client).create_namespaced_pod(NS, pod_obj("p1"))
    assert pod.metadata.labels == {"mutated": "yes"}
    assert [g.name for g in pod.spec.scheduling_gates] == ["gpu.hami.io/allocation"]
    review = Reviewer.reviews[-1]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["request"]["operation"] == "CREATE"
    assert review["request"]["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    # other resources are not sent to the webhook
    client.ResourceV1Api(sandbox_client).create_namespaced_resource_claim(NS, claim_obj("c1"))
    assert len(Reviewer.reviews) == 1


def test_validating_webhook_denies(sandbox_client: Any, webhook: tuple[str, str]) -> None:
    url, ca = webhook
    adm = client.AdmissionregistrationV1Api(sandbox_client)
    adm.create_validating_webhook_configuration(
        _config(
            "ValidatingWebhookConfiguration", url + "/validate", ca, ["resourceclaims"], "resource.k8s.io"
        )
    )
    res = client.ResourceV1Api(sandbox_client)
    res.create_namespaced_resource_claim(NS, claim_obj("ok"))
    with pytest.raises(ApiException) as exc:
        res.create_namespaced_resource_claim(NS, claim_obj("deny-me"))
    assert exc.value.status == 403
    message = json.loads(exc.value.body)["message"]
    assert (
        message
        == 'admission webhook "test.gpu.hami.io" denied the request: claims named deny-* are not allowed'
    )


def test_failure_policy(sandbox: SandboxServer, sandbox_client: Any, webhook: tuple[str, str]) -> None:
    url, _ca = webhook
    other_ca = base64.b64encode(make_self_signed(sandbox.state_dir / "other", "other").ca_pem).decode()
    adm = client.AdmissionregistrationV1Api(sandbox_client)
    core = client.CoreV1Api(sandbox_client)
    # the webhook's certificate is not signed by this caBundle: TLS fails, failurePolicy decides
    adm.create_mutating_webhook_configuration(
        _config("MutatingWebhookConfiguration", url + "/mutate", other_ca, ["pods"], "", policy="Ignore")
    )
    pod = core.create_namespaced_pod(NS, pod_obj("ignored"))
    assert pod.metadata.labels is None and not Reviewer.reviews
    adm.patch_mutating_webhook_configuration(
        "test-mutatingwebhookconfiguration",
        [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}],
    )
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_obj("failed"))
    assert exc.value.status == 500 and "failed calling webhook" in exc.value.body


def test_webhook_warnings_reach_the_client(
    sandbox: SandboxServer, sandbox_client: Any, webhook: tuple[str, str]
) -> None:
    from tests.sandbox.test_protocol import call

    url, ca = webhook
    client.AdmissionregistrationV1Api(sandbox_client).create_mutating_webhook_configuration(
        _config("MutatingWebhookConfiguration", url + "/mutate", ca, ["pods"], "")
    )
    code, headers, _ = call(sandbox, "POST", "/api/v1/namespaces/default/pods", pod_obj("p1"))
    assert code == 201 and headers["Warning"] == "299 - \"policy 'foo' is unknown\""


def test_service_client_config_through_the_resolver(
    sandbox: SandboxServer, sandbox_client: Any, webhook: tuple[str, str]
) -> None:
    url, ca = webhook
    config = _config("MutatingWebhookConfiguration", url, ca, ["pods"], "")
    config["webhooks"][0]["clientConfig"] = {
        "service": {"namespace": "kube-system", "name": "hami-dra-webhook", "port": 443, "path": "/mutate"},
        "caBundle": ca,
    }
    client.AdmissionregistrationV1Api(sandbox_client).create_mutating_webhook_configuration(config)
    core = client.CoreV1Api(sandbox_client)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod_obj("unresolved"))
    assert "is not registered in the sandbox" in json.loads(exc.value.body)["message"]
    host_port = url.removeprefix("https://")
    sandbox.api.admission.service_resolver = lambda ns, name, port: (
        host_port if (ns, name, port) == ("kube-system", "hami-dra-webhook", 443) else None
    )
    assert core.create_namespaced_pod(NS, pod_obj("resolved")).metadata.labels == {"mutated": "yes"}


def test_service_certificates_are_checked_for_the_service_name(
    sandbox: SandboxServer, sandbox_client: Any, webhook: tuple[str, str]
) -> None:
    url, ca = webhook
    config = _config("MutatingWebhookConfiguration", url, ca, ["pods"], "")
    config["webhooks"][0]["clientConfig"] = {
        "service": {"namespace": "other-ns", "name": "hami-dra-webhook", "path": "/mutate"},
        "caBundle": ca,
    }
    client.AdmissionregistrationV1Api(sandbox_client).create_mutating_webhook_configuration(config)
    sandbox.api.admission.service_resolver = lambda ns, name, port: url.removeprefix("https://")
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(sandbox_client).create_namespaced_pod(NS, pod_obj("p1"))
    assert "hami-dra-webhook.other-ns.svc" in json.loads(exc.value.body)["message"]
