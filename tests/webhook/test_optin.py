"""A review that does not come from the API server makes the webhook neither write nor read.

The webhook's Service answers any caller that reaches it, so these tests post hand-made reviews
straight to the HTTPS server, as a tenant's pod could, with a lookup that records every API call
the server makes. ``/mutate-hami`` answers from the review alone. Where translation applies (the
namespace's opt-in) is decided by the controller, which makes the templates from pods that exist
(tests/controller/test_hami_templates.py); its gate is tested here.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller.hami_templates import KubeNamespaces
from dra_driver.kube.api import Kube, Resource
from dra_driver.resource.refs import RequestRef
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL
from dra_driver.webhook.optin import (
    NamespaceGate,
    namespace_gate,
    parse_selector,
    selector_matches,
    selector_problems,
)
from dra_driver.webhook.server import WebhookServer, tls_context
from tests.webhook.test_hami_resources import seed_pod

DRIVER = "gpu.hami.io"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)


class RecordingApi:
    """A ``Lookup`` that records every call: for /mutate-hami there must be none."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def claim_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        self.calls.append(("claim", namespace, name))
        return None

    def template_requests(self, namespace: str, name: str) -> tuple[RequestRef, ...] | None:
        self.calls.append(("template", namespace, name))
        return None

    def is_our_class(self, name: str) -> bool | None:
        self.calls.append(("class", name))
        return name == DRIVER


def serve(certs: tuple[Path, Path], api: RecordingApi, **options: Any) -> WebhookServer:
    context = tls_context(str(certs[0]), str(certs[1]))
    server = WebhookServer(api, DRIVER, host="127.0.0.1", port=0, ssl_context=context, **options)
    server.start()
    return server


@pytest.fixture
def api() -> RecordingApi:
    return RecordingApi()


@pytest.fixture
def server(certs: tuple[Path, Path], api: RecordingApi) -> Iterator[WebhookServer]:
    instance = serve(certs, api)
    yield instance
    instance.stop()


def mutate_hami(
    server: WebhookServer, certs: tuple[Path, Path], namespace: str, pod: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    request = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": pod or seed_pod(),
    }
    body = json.dumps({"request": request}).encode()
    http = urllib.request.Request(f"https://127.0.0.1:{server.port}/mutate-hami", data=body, method="POST")
    context = ssl.create_default_context(cafile=str(certs[0]))
    with urllib.request.urlopen(http, context=context, timeout=5) as reply:
        response: dict[str, Any] = json.loads(reply.read())["response"]
    return response


@pytest.mark.parametrize("namespace", ["team", "kube-system", "missing", "../../apis/x"])
def test_a_forged_review_naming_any_namespace_gets_a_patch_and_causes_no_api_call(
    server: WebhookServer, certs: tuple[Path, Path], api: RecordingApi, namespace: str
) -> None:
    """Before: the webhook created templates in the named namespace with its own rights (64 in a
    victim's namespace, exhausting its per-namespace cap) and read its Namespace and claims."""
    pod = seed_pod()
    pod["spec"]["resourceClaims"] = [{"name": "victims", "resourceClaimName": "victims-claim"}]
    response = mutate_hami(server, certs, namespace, pod)
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert any(op["path"] == "/spec/resourceClaims/-" for op in patch)
    assert api.calls == [], "no read and no write for whoever sent the review"


def test_translate_off_serves_no_mutate_hami(certs: tuple[Path, Path]) -> None:
    server = serve(certs, RecordingApi(), hami_translate="off")
    try:
        assert "/mutate-hami" not in server.handlers
    finally:
        server.stop()


# --- the controller's gate: where templates are made ---------------------------------------------

NAMESPACE_LABELS = {
    "team": {NAMESPACE_LABEL: "enabled"},
    "kube-system": {"kubernetes.io/metadata.name": "kube-system"},
    "other": {},
}


class Namespaces:
    def __init__(self) -> None:
        self.read: list[str] = []

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        self.read.append(name)
        return NAMESPACE_LABELS.get(name)


@pytest.mark.parametrize(
    ("namespace", "reason"),
    [
        ("team", None),
        (
            "kube-system",
            "namespace kube-system has not opted in to HAMi resource translation "
            f"(label it {NAMESPACE_LABEL}=enabled)",
        ),
        ("other", "namespace other has not opted in"),
        ("missing", "namespace missing does not exist"),
    ],
)
def test_the_gate_follows_the_opt_in_label(namespace: str, reason: str | None) -> None:
    refusal = namespace_gate("namespaces", {}, Namespaces()).refusal(namespace)
    assert refusal == reason if reason is None else reason in str(refusal)


def test_a_name_that_is_no_namespace_is_never_read() -> None:
    reader = Namespaces()
    refusal = NamespaceGate(reader, {}, "").refusal("../../apis/x")
    assert refusal is not None and "is not a namespace name" in refusal and reader.read == []


def test_translate_all_applies_the_configurations_namespace_selector() -> None:
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    gate = namespace_gate("all", selector, Namespaces())
    assert gate.refusal("other") is None, "no label needed with translate=all"
    assert "outside the webhook's namespaceSelector" in str(gate.refusal("kube-system"))


def test_selector_flags_are_parsed_with_the_flag_named() -> None:
    assert parse_selector('{"matchLabels": {"a": "1"}}') == {"matchLabels": {"a": "1"}}
    with pytest.raises(ValueError, match="--hami-namespace-selector is not JSON"):
        parse_selector("{")
    with pytest.raises(ValueError, match="--hami-namespace-selector is not a label selector: unknown field"):
        parse_selector('{"matchLabel": {}}')


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selector_semantics(selector: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert not selector_problems(selector)
    assert selector_matches(selector, labels) is matches


def test_invalid_selectors_are_named() -> None:
    assert selector_problems([]) == [
        "a label selector must be an object with matchLabels and/or matchExpressions"
    ]
    assert selector_problems({"matchLabel": {}}) == ["unknown field 'matchLabel'"]
    assert selector_problems({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}) == [
        "matchExpressions[0]: Exists takes no values"
    ]
    assert selector_problems({"matchExpressions": [{"key": "a", "operator": "Has"}]})[0].startswith(
        "matchExpressions[0]: operator must be one of"
    )


def test_namespace_labels_are_read_from_the_api(api_kube: Kube, api_namespace: str) -> None:
    """On the real kube-apiserver (the shared tier: this test's own namespace)."""
    api_kube.patch(NAMESPACES, None, api_namespace, {"metadata": {"labels": {NAMESPACE_LABEL: "enabled"}}})
    namespaces = KubeNamespaces(api_kube)
    labels = namespaces.namespace_labels(api_namespace)
    assert labels is not None and labels[NAMESPACE_LABEL] == "enabled"
    assert namespaces.namespace_labels(f"{api_namespace}-missing") is None
