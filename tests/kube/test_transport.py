"""What our requests carry now that they go straight on the client's connection pool
(dra_driver/kube/transport.py): the client's credentials (a rotated token as soon as its refresh
hook gives it), headers, query and body, and the API's errors as ``KubeError``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client

from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Kube
from dra_driver.kube.errors import KubeError


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request with what it received (or a Status error for paths under /fail)."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = {
            "method": self.command,
            "path": self.path,
            "headers": {key.lower(): value for key, value in self.headers.items()},
            "body": json.loads(body) if body else None,
            "client_port": self.client_address[1],
        }
        self.seen.append(record)
        if "/fail/" in self.path:
            status = {
                "kind": "Status",
                "code": 409,
                "reason": "Conflict",
                "message": "the object was modified",
            }
            payload, code = json.dumps(status).encode(), 409
        else:
            payload, code = json.dumps({"echo": record}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _client(server: ThreadingHTTPServer, tokens: list[str]) -> Any:
    """An ApiClient whose token hook hands out ``tokens`` one per request, as a rotating
    service-account token would be read again."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    configuration.api_key = {"authorization": tokens[0]}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    pending = list(tokens)

    def refresh(config: Any) -> None:
        config.api_key["authorization"] = pending.pop(0) if len(pending) > 1 else pending[0]

    configuration.refresh_api_key_hook = refresh
    api_client = client.ApiClient(configuration)
    api_client.user_agent = "hami-dra-test/1"
    return api_client


def test_each_request_carries_the_token_current_at_that_moment(server: ThreadingHTTPServer) -> None:
    kube = Kube(_client(server, ["first", "second", "third"]))
    kube.get(PODS, "team-a", "p")
    kube.get(PODS, "team-a", "p")
    kube.get(PODS, "team-a", "p")
    tokens = [record["headers"].get("authorization") for record in _Recorder.seen]
    assert tokens == ["Bearer first", "Bearer second", "Bearer third"]
    assert all(record["headers"]["user-agent"] == "hami-dra-test/1" for record in _Recorder.seen)


def test_body_query_and_content_type_reach_the_server(server: ThreadingHTTPServer) -> None:
    kube = Kube(_client(server, ["t"]))
    claim = {"metadata": {"name": "c", "namespace": "team-a"}, "status": {"allocation": {"x": "ü"}}}
    answer = kube.update(RESOURCE_CLAIMS, claim, status=True)
    assert answer["echo"]["method"] == "PUT"
    assert answer["echo"]["path"] == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c/status"
    assert answer["echo"]["body"] == claim
    assert answer["echo"]["headers"]["content-type"] == "application/json"
    kube.patch(PODS, "team-a", "p", [{"op": "remove", "path": "/spec/schedulingGates/0"}])
    assert _Recorder.seen[-1]["headers"]["content-type"] == "application/json-patch+json"
    kube.list(RESOURCE_CLAIMS, field_selector="spec.x=a b", limit=5)
    assert _Recorder.seen[-1]["path"] == (
        "/apis/resource.k8s.io/v1/resourceclaims?fieldSelector=spec.x%3Da+b&limit=5"
    )
    kube.get(PODS, "team-a", "p")
    assert "content-type" not in _Recorder.seen[-1]["headers"]  # a GET sends no body


def test_an_api_error_is_the_kube_error_of_its_status(server: ThreadingHTTPServer) -> None:
    kube = Kube(_client(server, ["t"]))
    with pytest.raises(KubeError) as raised:
        kube.request("PUT", "/fail/x", body={"a": 1})
    assert raised.value.status == 409
    assert "the object was modified" in str(raised.value)


def test_an_unreachable_server_is_a_kube_error_without_status(server: ThreadingHTTPServer) -> None:
    api_client = _client(server, ["t"])
    api_client.configuration.host = "http://127.0.0.1:9"  # discard: nothing listens
    with pytest.raises(KubeError) as raised:
        Kube(api_client, request_timeout=5).get(PODS, "team-a", "p")
    assert raised.value.status == 0


def test_requests_reuse_one_kept_alive_connection(server: ThreadingHTTPServer) -> None:
    """Every request of ours on a new connection would cost the API server a TLS handshake each:
    answered requests must hand their connection back to the pool, errors included."""
    kube = Kube(_client(server, ["t"]))
    for i in range(10):
        kube.get(PODS, "default", f"p-{i}")
    with pytest.raises(KubeError):
        kube.update(RESOURCE_CLAIMS, {"metadata": {"name": "c", "namespace": "fail"}})
    kube.get(PODS, "default", "last")
    assert len(_Recorder.seen) == 12
    assert {record["client_port"] for record in _Recorder.seen} == {_Recorder.seen[0]["client_port"]}
