"""Hold a gang half-committed for as long as a test wants: the API server refuses one member's
allocation write.

The controller commits a gang in two phases (dra_driver/controller/gangs.py): every member's
allocation is written with its gate kept, then the gates are lifted. A crash between the two
leaves some members allocated and every member gated. To reach that window on the real cluster
without a hook in the product, ``AllocationRefusal`` installs a ValidatingAdmissionPolicy (the
API server's own CEL admission, GA since Kubernetes 1.30) that refuses to write an allocation
into a claim labelled ``REFUSED_LABEL``: a gang one of whose members' claims carries the label
(its ResourceClaimTemplate copies the label into the claim) has its other members' allocations
written, and the controller plans it again and again, every gate kept, until the test kills it.
Clearing an allocation (a released gang) and every other write stay allowed.
"""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING, Any

from dra_driver.controller import GATE_NAME
from hami_dra_dev.demo import manifests
from tests.waiting import wait_for

if TYPE_CHECKING:
    from tests.cluster.conftest import RealCluster

#: Claims with this label get no allocation while the refusal is installed.
REFUSED_LABEL = "hami-dra.test/allocation-refused"
POLICY = "hami-dra-test-refuse-allocation"
PROBE = "allocation-refusal-probe"


def policy_objects() -> list[dict[str, Any]]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "objectSelector": {"matchLabels": {REFUSED_LABEL: "true"}},
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["resourceclaims/status"],
                    }
                ],
            },
            "validations": [
                {
                    "expression": "!has(object.status) || !has(object.status.allocation)",
                    "message": "the fault suite refuses an allocation for this claim",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {"policyName": POLICY, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def refused_template(name: str, namespace: str, request: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims carry ``REFUSED_LABEL`` (copied in from its metadata)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "metadata": {"labels": {REFUSED_LABEL: "true"}},
            "spec": {"devices": {"requests": [request]}},
        },
    }


class AllocationRefusal:
    def __init__(self, cluster: RealCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def _apply(self, *objects: dict[str, Any]) -> None:
        body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def install(self) -> None:
        """Create the policy and return once the API server enforces it (a server-side dry run of
        an allocation into a labelled probe claim is refused by it)."""
        self._apply(*policy_objects())
        request = {"name": "gpu", "exactly": {"deviceClassName": "hami-dra-test-refusal-probe"}}
        self._apply({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": PROBE, "namespace": self.namespace, "labels": {REFUSED_LABEL: "true"}},
            "spec": {"devices": {"requests": [request]}},
        })  # fmt: skip
        result = {"request": "gpu", "driver": manifests.DRIVER, "pool": "probe", "device": "probe"}
        patch = json.dumps({"status": {"allocation": {"devices": {"results": [result]}}}})
        seen: list[str] = []

        def refused() -> bool:
            answer = subprocess.run(
                [str(self.cluster.toolchain.path("kubectl")), "--kubeconfig", str(self.cluster.kubeconfig),
                 "patch", "resourceclaim", PROBE, "-n", self.namespace, "--subresource=status",
                 "--type=merge", "-p", patch, "--dry-run=server"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            seen[:] = [answer.stderr.strip()]
            return answer.returncode != 0 and POLICY in answer.stderr

        try:
            wait_for(refused, 60, f"the API server enforcing {POLICY}", 0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}; its last answer to a probe: {seen}") from None
        finally:
            self.cluster.kubectl("delete", "resourceclaim", PROBE, "-n", self.namespace, "--ignore-not-found")

    def remove(self) -> None:
        self.cluster.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            POLICY,
            "--ignore-not-found",
        )


def _claim_name(pod: dict[str, Any]) -> str | None:
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    return str(statuses[0].get("resourceClaimName")) if statuses else None


def half_committed(cluster: RealCluster, namespace: str, members: list[str], refused: str) -> bool:
    """The window a crash mid-gang leaves: every member gated, every member's claim but the
    refused one's allocated."""
    pods = {p["metadata"]["name"]: p for p in cluster.get("pods", "-n", namespace)["items"]}
    claims = {c["metadata"]["name"]: c for c in cluster.get("resourceclaims", "-n", namespace)["items"]}
    for name in members:
        pod = pods.get(name)
        if pod is None or not any(
            g.get("name") == GATE_NAME for g in pod["spec"].get("schedulingGates") or ()
        ):
            return False
        claim = claims.get(_claim_name(pod) or "")
        if claim is None or bool((claim.get("status") or {}).get("allocation")) == (name == refused):
            return False
    return True
