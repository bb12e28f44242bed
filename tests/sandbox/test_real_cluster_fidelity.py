"""What a new user met with kubectl on the sandbox, compared with the real API server.

Each case behaved differently on ``hami-dra cluster up`` (real kube-apiserver): it either works
the same now, or is refused with a message naming what the sandbox does not serve.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess

import pytest

from hami_dra_dev.demo import manifests
from hami_dra_dev.sandbox import protobuf
from hami_dra_dev.sandbox.errors import ApiError

Kubectl = Callable[..., CompletedProcess[str]]


def test_apply_of_a_v1_list_works(kubectl: Kubectl) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            manifests.device_class("binpack"),
            manifests.claim_template("binpack"),
            manifests.pod(manifests.TENANTS[0]),
        ],
    }
    result = kubectl("apply", "-f", "-", stdin=json.dumps(body))
    assert result.stdout.split("\n")[:3] == [
        "deviceclass.resource.k8s.io/binpack.gpu.hami.io created",
        "resourceclaimtemplate.resource.k8s.io/binpack-1000mi created",
        "pod/tenant-a created",
    ]
    assert (
        json.loads(kubectl("get", "pod", "tenant-a", "-o", "json").stdout)["metadata"]["name"] == "tenant-a"
    )


def test_a_list_with_an_unknown_field_is_still_rejected(kubectl: Kubectl) -> None:
    bad = manifests.device_class("binpack")
    bad["spec"]["colour"] = "blue"
    body = {"apiVersion": "v1", "kind": "List", "items": [bad]}
    result = kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert result.returncode != 0 and "colour" in result.stderr


def test_create_namespace_works_over_protobuf(kubectl: Kubectl) -> None:
    assert kubectl("create", "namespace", "team-a").stdout.strip() == "namespace/team-a created"
    namespace = json.loads(kubectl("get", "namespace", "team-a", "-o", "json").stdout)
    assert namespace["metadata"]["name"] == "team-a" and namespace["status"]["phase"] == "Active"


@pytest.mark.parametrize(
    ("args", "resource"),
    [
        (("create", "deployment", "web", "--image=busybox:1.36"), "deployments (apps/v1)"),
        (("create", "configmap", "settings", "--from-literal=a=b"), "configmaps (v1)"),
    ],
)
def test_resources_the_sandbox_does_not_serve_are_named(
    kubectl: Kubectl, args: tuple[str, ...], resource: str
) -> None:
    result = kubectl(*args, check=False)
    assert result.returncode != 0
    assert f"the sandbox API server does not serve {resource}" in result.stderr
    assert "hami-dra cluster up" in result.stderr


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return protobuf.MAGIC + _field(1, type_meta) + _field(2, raw)


def test_protobuf_namespace_with_labels_decodes() -> None:
    label = _field(1, b"team") + _field(2, b"a")
    meta = _field(1, b"team-a") + _field(11, label) + _field(4, b"")
    assert protobuf.decode(_envelope("v1", "Namespace", _field(1, meta) + _field(2, b""))) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "labels": {"team": "a"}},
        "spec": {},
    }


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (_envelope("v1", "ConfigMap", _field(1, _field(1, b"c"))), "not v1 ConfigMap"),
        (_envelope("v1", "Namespace", _field(1, _field(13, b"owner"))), "metadata field 13"),
        (b"\x0a\x05hello", "no k8s protobuf envelope"),
        (protobuf.MAGIC + b"\x0a\xff", "truncated"),
    ],
)
def test_protobuf_bodies_it_cannot_decode_are_refused_by_name(body: bytes, named: str) -> None:
    with pytest.raises(ApiError) as refused:
        protobuf.decode(body)
    assert refused.value.code == 415 and named in refused.value.message
