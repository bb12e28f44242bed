"""What every tenant attack on the real cluster shares: the tenant, its namespaces, its quota.

The tenant is a ServiceAccount holding only a namespace Role (pods, pods/exec, pods/log,
resourceclaims, resourceclaimtemplates: every verb), impersonated with ``kubectl --as``, so the
real API server applies RBAC and the chart's admission policies exactly as it would to that
tenant's own token. ``tenancy`` (module-scoped: each attack module gets fresh namespaces) sets it
up against the chart-installed driver (``tenant_namespaces``; conftest.py installs the chart again
where a module before took it away).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dra_driver.quantity import parse_bytes
from dra_driver.quota import crd
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import CHART_NAMESPACE, COMPONENT_LABEL, DRIVER, DriverUnderTest
from tests.cluster.faults import _capacities, _results
from tests.cluster.test_e2e import POD_TIMEOUT
from tests.waiting import wait_for

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


def tenant_namespaces(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[Tenancy]:
    """What conftest.py's ``tenancy`` fixture yields, and removes afterwards."""
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
