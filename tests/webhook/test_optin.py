"""``/mutate-hami`` writes templates only in namespaces that opted in, and only so many of them.

The API server only sends reviews for opted-in namespaces, but the webhook's Service answers any
caller, so these tests post hand-made reviews straight to the HTTPS server, as a tenant could.
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

from dra_driver.kube.api import Kube, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.sandbox import SandboxServer
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL, TranslationError, shape_of
from dra_driver.webhook.lookup import KubeLookup
from dra_driver.webhook.optin import selector_matches, selector_problems
from dra_driver.webhook.server import WebhookServer, tls_context
from tests.sandbox_fixtures import sandbox  # noqa: F401
from tests.webhook.test_hami_resources import FakeApi, seed_pod

DRIVER = "gpu.hami.io"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)


class NamespacedApi(FakeApi):
    """``FakeApi`` that also knows Namespaces and records which ones were read."""

    def __init__(self, namespaces: Mapping[str, Mapping[str, str]], fail: KubeError | None = None) -> None:
        super().__init__()
        self.namespaces = dict(namespaces)
        self.read: list[str] = []
        self.read_error = fail

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        self.read.append(name)
        if self.read_error is not None:
            raise self.read_error
        return self.namespaces.get(name)


NAMESPACE_LABELS = {
    "team": {NAMESPACE_LABEL: "enabled"},
    "kube-system": {"kubernetes.io/metadata.name": "kube-system"},
    "other": {},
}


def serve(certs: tuple[Path, Path], api: NamespacedApi, **options: Any) -> WebhookServer:
    context = tls_context(str(certs[0]), str(certs[1]))
    server = WebhookServer(api, DRIVER, host="127.0.0.1", port=0, ssl_context=context, **options)
    server.start()
    return server


@pytest.fixture
def api() -> NamespacedApi:
    return NamespacedApi(NAMESPACE_LABELS)


@pytest.fixture
def server(certs: tuple[Path, Path], api: NamespacedApi) -> Iterator[WebhookServer]:
    instance = serve(certs, api)
    yield instance
    instance.stop()


def mutate_hami(server: WebhookServer, certs: tuple[Path, Path], namespace: str) -> dict[str, Any]:
    request = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": seed_pod(),
    }
    body = json.dumps({"request": request}).encode()
    http = urllib.request.Request(f"https://127.0.0.1:{server.port}/mutate-hami", data=body, method="POST")
    context = ssl.create_default_context(cafile=str(certs[0]))
    with urllib.request.urlopen(http, context=context, timeout=5) as reply:
        response: dict[str, Any] = json.loads(reply.read())["response"]
    return response


def test_an_opted_in_namespace_is_translated(
    server: WebhookServer, certs: tuple[Path, Path], api: NamespacedApi
) -> None:
    response = mutate_hami(server, certs, "team")
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert any(op["path"] == "/spec/resourceClaims" for op in patch)
    assert api.created == ["hami-1gpu-8000mi-0cores"] and api.read == ["team"]


@pytest.mark.parametrize(
    ("namespace", "reason"),
    [
        (
            "kube-system",
            "namespace kube-system has not opted in to HAMi resource translation "
            f"(label it {NAMESPACE_LABEL}=enabled)",
        ),
        ("other", "namespace other has not opted in"),
        ("missing", "namespace missing does not exist"),
    ],
)
def test_a_namespace_that_did_not_opt_in_gets_nothing_written(
    server: WebhookServer, certs: tuple[Path, Path], api: NamespacedApi, namespace: str, reason: str
) -> None:
    response = mutate_hami(server, certs, namespace)
    assert response["allowed"] is True, "the pod is admitted unchanged, not refused"
    assert "patch" not in response
    assert any(reason in warning for warning in response["warnings"]), response["warnings"]
    assert api.created == []


def test_a_name_that_is_no_namespace_is_never_put_in_an_api_path(
    server: WebhookServer, certs: tuple[Path, Path], api: NamespacedApi
) -> None:
    response = mutate_hami(server, certs, "../../apis/x")
    assert response["allowed"] and "patch" not in response
    assert "is not a namespace name" in response["warnings"][0]
    assert api.read == [] and api.created == []


def test_a_namespace_that_cannot_be_read_denies_instead_of_guessing(certs: tuple[Path, Path]) -> None:
    api = NamespacedApi(NAMESPACE_LABELS, fail=KubeError(403, 'namespaces "team" is forbidden'))
    server = serve(certs, api)
    try:
        response = mutate_hami(server, certs, "team")
    finally:
        server.stop()
    assert response["allowed"] is False
    assert "cannot read namespace team to check that it opted in" in response["status"]["message"]
    assert api.created == []


def test_translate_all_applies_the_configurations_namespace_selector(certs: tuple[Path, Path]) -> None:
    api = NamespacedApi(NAMESPACE_LABELS)
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    server = serve(certs, api, hami_translate="all", hami_namespace_selector=selector)
    try:
        assert "patch" in mutate_hami(server, certs, "other"), "no label needed with translate=all"
        refused = mutate_hami(server, certs, "kube-system")
    finally:
        server.stop()
    assert "patch" not in refused and "outside the webhook's namespaceSelector" in refused["warnings"][0]
    assert api.created == ["hami-1gpu-8000mi-0cores"]


def test_translate_off_serves_no_mutate_hami(certs: tuple[Path, Path]) -> None:
    server = serve(certs, NamespacedApi(NAMESPACE_LABELS), hami_translate="off")
    try:
        assert "/mutate-hami" not in server.handlers
    finally:
        server.stop()


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


# --- KubeLookup against the sandbox API server: Namespace labels and the template cap -------------


def template(memory_mib: int, namespace: str = "default") -> dict[str, Any]:
    shape = shape_of("app", {"nvidia.com/gpumem": memory_mib})
    assert shape is not None
    return shape.template(namespace, DRIVER, DRIVER)


def test_namespace_labels_are_read_from_the_api(sandbox: SandboxServer) -> None:  # noqa: F811
    client = sandbox.api_client()
    try:
        Kube(client).patch(
            NAMESPACES, None, "default", {"metadata": {"labels": {NAMESPACE_LABEL: "enabled"}}}
        )
        lookup = KubeLookup(client, DRIVER)
        labels = lookup.namespace_labels("default")
        assert labels is not None and labels[NAMESPACE_LABEL] == "enabled"
        assert lookup.namespace_labels("no-such-namespace") is None
    finally:
        client.close()


def test_templates_per_namespace_are_capped(sandbox: SandboxServer) -> None:  # noqa: F811
    """Every distinct memory size is a new shape: past the cap a new shape denies the pod, while
    shapes that exist are still reused and other namespaces are not affected."""
    client = sandbox.api_client()
    try:
        Kube(client).create(NAMESPACES, None, {"metadata": {"name": "team-b"}})
        lookup = KubeLookup(client, DRIVER, max_templates_per_namespace=2)
        lookup.ensure_template(template(1000))
        lookup.ensure_template(template(2000))
        with pytest.raises(
            TranslationError, match=r"namespace default already holds 2 ResourceClaimTemplates"
        ):
            lookup.ensure_template(template(3000))
        lookup.ensure_template(template(1000))  # an existing shape: reused
        lookup.ensure_template(template(3000, namespace="team-b"))
    finally:
        client.close()
