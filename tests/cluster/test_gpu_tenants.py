"""Attacks of an untrusted tenant, through real kubectl, against the chart-installed driver.

The tenant is a ServiceAccount holding only a namespace Role (pods, pods/exec, resourceclaims,
resourceclaimtemplates: every verb), impersonated with ``kubectl --as``, so the real API server
applies RBAC and the chart's admission policies (templates/tenant-policies.yaml) exactly as it
would to that tenant's own token. Each attack is refused or contained; after each, no card is over
its capacity and no namespace over its GpuQuota. A stolen controller token is tried the same way.

The module's name sorts before test_helm_install.py, whose last test uninstalls the chart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dra_driver.quantity import parse_bytes
from dra_driver.quota import crd
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, COMPONENT_LABEL, DRIVER, DriverUnderTest
from tests.cluster.faults import _capacities, _results
from tests.cluster.test_e2e import POD_TIMEOUT
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

TENANT_NS = "tenant-a"
OTHER_NS = "tenant-b"
TENANT = f"system:serviceaccount:{TENANT_NS}:tenant"
CLASS = f"binpack.{DRIVER}"
TAINT = f"{DRIVER}/policy-managed"
QUOTA_MEMORY = "12Gi"
#: Accepted by the API server (estimated cost within its limit), over cel-cpp's iteration budget.
_LIST = "[" + ", ".join(str(index) for index in range(100)) + "]"
COSTLY_SELECTOR = f"{_LIST}.all(x, {_LIST}.all(y, x + y >= 0))"


@dataclass
class Tenancy:
    cluster: RealCluster
    controller_user: str

    def tenant(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """kubectl as the tenant, in its namespace."""
        return self.cluster.kubectl("--as", TENANT, "-n", TENANT_NS, *args, stdin=stdin, check=check)

    def refused(self, *args: str, stdin: str | None = None, user: str = TENANT) -> str:
        """kubectl as ``user`` that must fail (refused, not a conflict); returns what it printed."""
        out = self.cluster.kubectl("--as", user, *args, stdin=stdin, check=False)
        assert "created" not in out and "configured" not in out and "patched" not in out, out
        assert "denied" in out or "forbidden" in out.lower(), out
        return out

    def described(self, namespace: str, pod: str, text: str) -> str:
        def found() -> str | None:
            out = self.cluster.kubectl("describe", "pod", pod, "-n", namespace)
            return out if text in out else None

        result: str = wait_for(found, 90, f"{text!r} in kubectl describe pod {namespace}/{pod}")
        return result

    def running(self, namespace: str, *pods: str) -> None:
        for pod in pods:
            waited = self.cluster.kubectl(
                "wait", "--for=condition=Ready", f"pod/{pod}", "-n", namespace,
                f"--timeout={POD_TIMEOUT:.0f}s", check=False,
            )  # fmt: skip
            if "condition met" not in waited:
                described = self.cluster.kubectl("describe", "pod", pod, "-n", namespace, check=False)
                controller = self.cluster.driver_log("controller")[-4000:]
                raise AssertionError(f"{namespace}/{pod} not running: {waited}\n{described}\n{controller}")

    def gated(self, namespace: str, pod: str) -> bool:
        gates = self.cluster.get("pod", pod, "-n", namespace)["spec"].get("schedulingGates") or ()
        return any(gate["name"] == f"{DRIVER}/allocation" for gate in gates)

    def assert_contained(self) -> None:
        """No card over its capacity, no namespace over its GpuQuota (every namespace's claims)."""
        capacity = _capacities(self.cluster)
        used: dict[str, int] = {}
        for claim in self.cluster.get("resourceclaims", "-A")["items"]:
            for result in _results(claim):
                device = str(result["device"])
                consumed = (result.get("consumedCapacity") or {}).get("memory")
                used[device] = used.get(device, 0) + (
                    parse_bytes(consumed) if consumed else capacity[device].memory
                )
        over = {device: memory for device, memory in used.items() if memory > capacity[device].memory}
        assert not over, f"cards over capacity: {over}"
        quota = self.cluster.get(crd.PLURAL, "team", "-n", TENANT_NS)
        memory = (quota.get("status") or {}).get("used", {}).get("memory", "0")
        assert parse_bytes(memory) <= parse_bytes(QUOTA_MEMORY), quota.get("status")


def claim(name: str, memory: str, **exactly: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "capacity": {"requests": {"memory": memory}},
                            **exactly,
                        },
                    }
                ]
            }
        },
    }


def pod(name: str, claim_name: str | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "busybox:1.36", "command": ["sleep", "86400"]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if claim_name is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def unconditional(obj: dict[str, Any]) -> dict[str, Any]:
    """An object to replace whatever its version now (the kubelet keeps changing a new pod)."""
    obj["metadata"].pop("resourceVersion", None)
    return obj


def manifest(*objects: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})


@pytest.fixture(scope="module")
def tenancy(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[Tenancy]:
    cluster = real_cluster
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenant", "namespace": TENANT_NS},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "pods/exec", "pods/log"], "verbs": ["*"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims", "resourceclaimtemplates"],
                "verbs": ["*"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant", "namespace": TENANT_NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}],
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "tenant", "namespace": TENANT_NS},
    }
    quota = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": "team", "namespace": TENANT_NS},
        "spec": {"hard": {"memory": QUOTA_MEMORY, "devices": 2}},
    }
    for namespace in (TENANT_NS, OTHER_NS):
        cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", "-", stdin=manifest(account, role, binding, quota))
    deployment = cluster.get("deployments", "-n", CHART_NAMESPACE, "-l", f"{COMPONENT_LABEL}=controller")
    (controller,) = deployment["items"]
    account_name = controller["spec"]["template"]["spec"]["serviceAccountName"]
    try:
        yield Tenancy(cluster, f"system:serviceaccount:{CHART_NAMESPACE}:{account_name}")
    finally:
        for namespace in (TENANT_NS, OTHER_NS):
            cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")


def test_a_tenant_cannot_lift_our_gate_to_escape_its_quota(tenancy: Tenancy) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("big", "14Gi"), pod("big", "big")))
    tenancy.described(TENANT_NS, "big", "GpuQuotaExceeded")
    out = tenancy.refused(
        "-n", TENANT_NS, "patch", "pod", "big", "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )  # fmt: skip
    assert f"only the {DRIVER} controller may remove the scheduling gate {DRIVER}/allocation" in out
    assert tenancy.gated(TENANT_NS, "big")
    tenancy.assert_contained()
    tenancy.tenant("delete", "pod", "big", "--wait=true", "--timeout=60s")


@pytest.mark.parametrize(
    ("what", "body", "message"),
    [
        (
            "a claim tolerating the policy taint",
            claim(
                "tolerant", "1Gi", tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
            ),
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a claim tolerating every taint",
            claim("everything", "1Gi", tolerations=[{"operator": "Exists"}]),
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a template tolerating every taint",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "everything"},
                "spec": {"spec": claim("x", "1Gi", tolerations=[{"operator": "Exists"}])["spec"]},
            },
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a claim asking for ten slots",
            claim("slots", "1Mi", capacity={"requests": {"memory": "1Mi", "slots": "10"}}),
            "may not ask for slots",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value else "",
)
def test_claims_that_would_bypass_the_controller_are_refused(
    tenancy: Tenancy, what: str, body: dict[str, Any], message: str
) -> None:
    out = tenancy.refused("-n", TENANT_NS, "create", "-f", "-", stdin=json.dumps(body))
    assert message in out, what


def test_a_running_claims_share_survives_its_tenant(tenancy: Tenancy) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("holder", "10Gi"), pod("holder", "holder")))
    tenancy.running(TENANT_NS, "holder")
    out = tenancy.refused(
        "-n", TENANT_NS, "patch", "resourceclaim", "holder", "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )  # fmt: skip
    assert f"the finalizer {DRIVER}/allocation keeps an allocated claim's GPU share booked" in out
    # Deleting it is allowed, and changes nothing while the pod runs: the share stays booked.
    tenancy.tenant("delete", "resourceclaim", "holder", "--wait=false")
    held = tenancy.cluster.get("resourceclaim", "holder", "-n", TENANT_NS)
    assert held["metadata"].get("deletionTimestamp") and held["status"].get("allocation")
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("more", "4Gi"), pod("more", "more")))
    tenancy.described(TENANT_NS, "more", "GpuQuotaExceeded")  # 10Gi still counted: 10 + 4 > 12
    tenancy.assert_contained()
    # The pod ends: the claim goes, and its share with it.
    tenancy.tenant("delete", "pod", "holder", "--wait=true", "--timeout=60s")
    wait_for(
        lambda: (
            not tenancy.cluster.get(
                "resourceclaims", "-n", TENANT_NS, "--field-selector", "metadata.name=holder"
            )["items"]
        ),
        60,
        "the deleted claim released once its pod ended",
    )
    tenancy.running(TENANT_NS, "more")
    tenancy.assert_contained()
    tenancy.tenant("delete", "pod", "more", "--wait=true", "--timeout=60s")


def test_poison_input_leaves_every_other_pod_placeable(tenancy: Tenancy) -> None:
    weights = {"hami.io/device-scoring-weights": f"slot=1{'0' * 400},core=1,memory=1"}
    poison = claim("poison", "1Gi", selectors=[{"cel": {"expression": COSTLY_SELECTOR}}])
    tenancy.tenant(
        "apply", "-f", "-",
        stdin=manifest(
            poison, pod("poison", "poison"), claim("weights", "1Gi"), pod("weights", "weights", weights)
        ),
    )  # fmt: skip
    others = [claim(f"good-{index}", "1Gi") for index in range(3)]
    pods = [pod(f"good-{index}", f"good-{index}") for index in range(3)]
    tenancy.cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(*others, *pods))
    tenancy.running(OTHER_NS, "good-0", "good-1", "good-2")
    # An out-of-range weight is ignored with a warning, like any invalid HAMi annotation.
    tenancy.running(TENANT_NS, "weights")
    tenancy.described(TENANT_NS, "weights", "must be at most 1000000")
    # A selector over the CEL budget is that claim's error, as kube-scheduler reports it.
    tenancy.described(TENANT_NS, "poison", "CEL runtime error: Iteration budget exceeded")
    assert tenancy.gated(TENANT_NS, "poison")
    tenancy.assert_contained()


def test_a_stolen_controller_token_cannot_rewrite_pods_or_foreign_claims(tenancy: Tenancy) -> None:
    cluster, controller = tenancy.cluster, tenancy.controller_user
    cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(pod("bystander", None)))
    bystander = unconditional(cluster.get("pod", "bystander", "-n", OTHER_NS))
    bystander["spec"]["containers"][0]["image"] = "registry.example.com/evil:1"
    out = tenancy.refused("-n", OTHER_NS, "replace", "-f", "-", stdin=json.dumps(bystander), user=controller)
    assert "the controller may not change a pod's containers, images" in out
    labelled = unconditional(cluster.get("pod", "bystander", "-n", OTHER_NS))
    labelled["metadata"].setdefault("labels", {})["owned"] = "yes"
    out = tenancy.refused("-n", OTHER_NS, "replace", "-f", "-", stdin=json.dumps(labelled), user=controller)
    assert "may change only the annotations" in out
    # RBAC: the controller never patches, so it may not.
    assert cluster.kubectl(
        "auth", "can-i", "patch", "pods", "-n", "kube-system", "--as", controller, check=False
    ).startswith("no")
    # The status of a claim it does not allocate (here: results of another driver).
    cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(claim("foreign", "1Gi")))
    foreign = unconditional(cluster.get("resourceclaim", "foreign", "-n", OTHER_NS))
    foreign["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-0"}]
            }
        }
    }
    out = tenancy.refused(
        "-n",
        OTHER_NS,
        "replace",
        "--subresource=status",
        "-f",
        "-",
        stdin=json.dumps(foreign),
        user=controller,
    )
    assert "the controller may write the status only of claims it allocates" in out
    assert not cluster.get("resourceclaim", "foreign", "-n", OTHER_NS).get("status", {}).get("allocation")
