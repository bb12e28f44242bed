"""``/mutate-claims`` (dra_driver/webhook/claims.py): our finalizer on new claims of our classes.

The finalizer is an optimisation (the controller adds it to a claim that lacks it), so anything
unknown leaves the claim as it is rather than failing its creation."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.contract import FINALIZER
from dra_driver.kube.errors import KubeError
from dra_driver.webhook.admission import review_response
from dra_driver.webhook.claims import finalize_claim
from dra_driver.webhook.server import WebhookServer
from tests.webhook.test_webhook import FakeLookup, _post, claim_spec, req, review


def claim(*requests: dict[str, Any], finalizers: list[str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "p-gpu-", "namespace": "ns"}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": claim_spec(*requests)}  # fmt: skip


def admitted(obj: dict[str, Any], lookup: Any) -> dict[str, Any]:
    """``obj`` as the API server stores it after our answer (the JSONPatch applied)."""
    request = review(obj, kind="ResourceClaim")
    answer = review_response(request, finalize_claim(request, lookup))
    response = answer["response"]
    assert response["allowed"]
    result = json.loads(json.dumps(obj))
    for op in json.loads(base64.b64decode(response["patch"])) if "patch" in response else ():
        assert op["op"] == "add"
        parts = op["path"].strip("/").split("/")
        target = result
        for part in parts[:-1]:
            target = target[part]
        if parts[-1] == "-":
            target.append(op["value"])
        else:
            # RFC 6902: an add to an existing member replaces it, so only an empty one may be there.
            assert not target.get(parts[-1]), "an add must not replace finalizers that are there"
            target[parts[-1]] = op["value"]
    return result


def finalizers(obj: dict[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def test_a_claim_of_our_class_gets_our_finalizer_after_the_others() -> None:
    lookup = FakeLookup()
    assert finalizers(admitted(claim(req("gpu")), lookup)) == [FINALIZER]
    assert finalizers(admitted(claim(req("gpu"), finalizers=[]), lookup)) == [FINALIZER]
    kept = admitted(claim(req("gpu"), finalizers=["someone.else/keep"]), lookup)
    assert finalizers(kept) == ["someone.else/keep", FINALIZER]
    assert finalizers(admitted(claim(req("gpu"), finalizers=[FINALIZER]), lookup)) == [FINALIZER]


def test_a_first_available_alternative_or_a_second_request_of_our_class_counts() -> None:
    lookup = FakeLookup()
    choices = [{"name": "a", "deviceClassName": "other"}, {"name": "b", "deviceClassName": "gpu.hami.io"}]
    alternatives = {"name": "g", "firstAvailable": choices}
    assert finalizers(admitted(claim(alternatives), lookup)) == [FINALIZER]
    assert finalizers(admitted(claim(req("x", klass="other"), req("g")), lookup)) == [FINALIZER]


def test_claims_of_other_or_unknown_classes_and_other_operations_are_left_alone() -> None:
    lookup = FakeLookup()
    assert finalizers(admitted(claim(req("x", klass="other")), lookup)) == []
    assert finalizers(admitted(claim(req("x", klass="missing")), lookup)) == []
    assert finalizers(admitted(claim(), lookup)) == []
    update = review(claim(req("gpu")), kind="ResourceClaim", operation="UPDATE")
    assert finalize_claim(update, lookup).patch is None
    template = review({"spec": {"spec": claim_spec(req("gpu"))}}, kind="ResourceClaimTemplate")
    assert finalize_claim(template, lookup).patch is None


def test_an_unreadable_class_admits_the_claim_unchanged_for_the_controller() -> None:
    class Failing(FakeLookup):
        def is_our_class(self, name: str) -> bool | None:
            if name == "flaky":
                raise KubeError(500, "etcd timeout")
            return super().is_our_class(name)

    lookup = Failing()
    assert finalizers(admitted(claim(req("x", klass="flaky")), lookup)) == []
    # Another request's class that can be read still decides.
    assert finalizers(admitted(claim(req("x", klass="flaky"), req("g")), lookup)) == [FINALIZER]


@pytest.fixture
def served(certs: tuple[Path, Path]) -> Any:
    from dra_driver.webhook.server import tls_context

    server = WebhookServer(FakeLookup(), "gpu.hami.io", host="127.0.0.1", port=0,
                           ssl_context=tls_context(str(certs[0]), str(certs[1])))  # fmt: skip
    server.start()
    yield server
    server.stop()


def test_the_server_answers_claim_reviews_on_mutate_claims(
    served: WebhookServer, certs: tuple[Path, Path]
) -> None:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": review(claim(req("gpu")), kind="ResourceClaim")}  # fmt: skip
    status, data = _post(served, certs, "/mutate-claims", json.dumps(body).encode())
    response = json.loads(data)["response"]
    assert status == 200 and response["allowed"] and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
    ]
