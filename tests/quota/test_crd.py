"""The GpuQuota CRD: generated files current, schema refusals, status subresource, kubectl columns.

Refusals, the status subresource and the columns are checked on a real kube-apiserver with the CRD
installed (tests/apiserver_fixtures.py), each test in its own namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.kube.api import GPU_QUOTAS, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.quota import crd
from tests.apiserver_fixtures import install_crd
from tests.kube_validate import assert_valid

ROOT = Path(__file__).resolve().parents[2]
Kubectl = Callable[..., subprocess.CompletedProcess[str]]

#: Quotas the schema must refuse, with a fragment of the API server's answer.
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("negative-memory", {"hard": {"memory": "-1Gi"}}, "spec.hard.memory in body should match"),
    ("negative-cores", {"hard": {"cores": -5}}, "should be greater than or equal to 0"),
    ("cores-as-text", {"hard": {"cores": "lots"}}, "must be of type integer"),
    ("bad-quantity", {"hard": {"memory": "64 GB"}}, "spec.hard.memory in body should match"),
    ("empty-hard", {"hard": {}}, "should have at least 1 properties"),
    ("no-hard", {}, "spec.hard: Required value"),
    # An unknown key is pruned (the server's default field validation only warns), which leaves
    # ``hard`` empty; test_unknown_keys_are_pruned_or_refused_when_strict says more.
    ("unknown-key", {"hard": {"gpus": 2}}, "spec.hard in body should have at least 1 properties"),
    ("repeated-class", {"hard": {"devices": 1}, "deviceClassNames": ["a", "a"]}, "Duplicate value"),
]
#: How kubectl (strict field validation by default) is refused where its answer differs from a
#: client's that asks for none (the cases above).
KUBECTL_REFUSALS: dict[str, str] = {"unknown-key": 'unknown field "spec.hard.gpus"'}


def quota(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def kube(api_kube: Kube) -> Kube:
    """The shared API server with the GpuQuota CRD installed (once; later tests find it there)."""
    install_crd(api_kube, crd.manifest())
    return api_kube


def test_committed_crds_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-crd.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    chart = yaml.safe_load((ROOT / "charts" / "hami-dra" / "crds" / f"{crd.CRD_NAME}.yaml").read_text())
    assert chart == crd.manifest()


def test_the_crd_itself_is_a_valid_object() -> None:
    assert_valid(crd.manifest())


def test_the_schema_is_structural_where_kube_apiserver_checks_it() -> None:
    """The rule the real server enforced on our first CRD: in an int-or-string ``anyOf`` the
    branches hold only ``type`` ("must be empty to be structural"), never checks."""

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for branch in node.get("anyOf") or ():
                assert set(branch) == {"type"}, f"{path}.anyOf: {branch}"
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(crd.schema(), "openAPIV3Schema")


@pytest.mark.parametrize(("name", "spec", "why"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_quotas_are_refused(
    kube: Kube, api_namespace: str, name: str, spec: dict[str, Any], why: str
) -> None:
    with pytest.raises(KubeError) as caught:
        kube.create(GPU_QUOTAS, api_namespace, quota(name, spec, api_namespace))
    assert caught.value.status in (400, 422)
    assert why in caught.value.message


def test_unknown_keys_are_pruned_or_refused_when_strict(kube: Kube, api_namespace: str) -> None:
    """What kube-apiserver does with a misspelt key: a client asking for strict field validation
    (kubectl does by default) is refused with the field's name; any other gets it pruned."""
    ns = api_namespace
    spec = {"hard": {"memory": "1Gi", "gpus": 2}}
    path = GPU_QUOTAS.path(ns)
    with pytest.raises(KubeError) as caught:
        kube.request("POST", path, quota("strict", spec, ns), query={"fieldValidation": "Strict"})
    assert caught.value.status in (400, 422)
    assert 'unknown field "spec.hard.gpus"' in caught.value.message
    created = kube.create(GPU_QUOTAS, ns, quota("pruned", spec, ns))
    assert created["spec"]["hard"] == {"memory": "1Gi"}


def test_valid_quotas_are_accepted_and_status_is_a_subresource(kube: Kube, api_namespace: str) -> None:
    ns = api_namespace
    created = kube.create(
        GPU_QUOTAS,
        ns,
        {
            **quota("team-a", {"hard": {"memory": "64Gi", "cores": 200, "devices": 8}}, ns),
            "status": {"used": {"cores": 9}},
        },
    )
    assert "status" not in created  # ignored on create, as for every resource with a status subresource
    for spec in ({"hard": {"memory": 68719476736}}, {"hard": {"devices": 0}, "deviceClassNames": ["x"]}):
        kube.create(GPU_QUOTAS, ns, quota(f"ok-{len(json.dumps(spec))}", spec, ns))
    created["status"] = {"used": {"memory": "1Gi", "cores": 10, "devices": 1}}
    written = kube.update(GPU_QUOTAS, created, status=True)
    assert written["status"]["used"]["cores"] == 10
    assert written["metadata"]["generation"] == 1  # a status write is not a spec change
    written["spec"]["hard"]["cores"] = 300
    written["status"] = {}
    updated = kube.update(GPU_QUOTAS, written)
    assert updated["metadata"]["generation"] == 2
    assert updated["status"]["used"]["cores"] == 10  # the main resource cannot change status
    assert_valid(updated)


def test_kubectl_shows_used_and_hard(kube: Kube, api_namespace: str, api_kubectl: Kubectl) -> None:
    ns, kubectl = api_namespace, api_kubectl
    created = kube.create(GPU_QUOTAS, ns, quota("team-a", {"hard": {"memory": "64Gi", "cores": 200}}, ns))
    created["status"] = {"used": {"memory": "24Gi", "cores": 60, "devices": 3}}
    kube.update(GPU_QUOTAS, created, status=True)
    header, row = kubectl("get", "gpuquotas", "-n", ns).stdout.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "MEMORY", "USED", "MEMORY", "HARD", "CORES", "USED"]
    assert row.split()[:6] == ["team-a", "24Gi", "64Gi", "60", "200", "3"]
    refused = kubectl(
        "apply", "-f", "-", check=False, stdin=yaml.safe_dump(quota("bad", {"hard": {"gpus": 1}}, ns))
    )
    assert refused.returncode != 0 and "gpus" in refused.stderr
