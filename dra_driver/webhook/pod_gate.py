"""The pod gate as a MutatingAdmissionPolicy: the scheduling gate added in the API server.

The webhook's ``/mutate`` (admission.py) gates a pod after reading its claims and templates, so
that only pods of our DeviceClasses wait for the controller. That costs every pod with
``spec.resourceClaims`` a TLS round trip from kube-apiserver to the webhook (about 1 ms of the
API server's CPU per pod and as much of the webhook's, docs/performance.md). Where kube-apiserver
serves ``admissionregistration.k8s.io/v1`` MutatingAdmissionPolicy (1.36+), the chart can add the
gate in process instead (``webhook.podGate``: charts/hami-dra/templates/pod-gate.yaml renders the
same objects as :func:`pod_gate_policy`, tests/chart compares them).

CEL cannot read a pod's templates or claims, so the policy gates every pod that has
``spec.resourceClaims``, in the namespaces the webhook would serve, unless it

* sets ``spec.nodeName`` (a bound pod cannot be gated; the webhook keeps those, refusing one
  that uses our classes),
* carries our gate already (a translated HAMi pod, gated by ``/mutate-hami``), or
* asks for HAMi's ``nvidia.com/gpu*`` resources: those keep going to the webhook (translation,
  then ``/mutate``), whose ``pods`` entry then matches only them and bound pods.

The trade-off: a pod of another DRA driver in those namespaces waits on our gate until our
controller reads its claims, finds none of ours and lifts it (one pod write; controller
allocator.py, ``Placed`` with nothing to write), and a pod whose containers would break
HAMi-core's per-container limits is admitted and held pending by the controller with the reason
``GpuLimitsConflict`` (controller/containers.py) instead of being refused at admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.contract import GATE_NAME
from dra_driver.webhook.policy import API_VERSION, BINDING_KIND, POLICY_KIND

#: ``webhook.podGate`` / ``--ours-pod-gate``: the webhook's ``/mutate``, or this policy.
POD_GATE_MODES = ("webhook", "policy")

#: CEL: the pod names at least one claim (directly or from a template).
HAS_CLAIMS = "size(object.spec.?resourceClaims.orValue([])) > 0"
#: CEL: the pod is not bound at creation (a gate on a bound pod is refused by the API server).
NOT_BOUND = "object.spec.?nodeName.orValue('') == ''"
#: CEL: the pod does not carry our gate yet.
NOT_GATED = f"!object.spec.?schedulingGates.orValue([]).exists(g, g.name == '{GATE_NAME}')"
#: CEL: a container asks for one of HAMi's ``nvidia.com/gpu*`` resources (the chart's
#: ``hami-resources`` webhook entry matches the same pods).
ASKS_FOR_HAMI_RESOURCES = (
    "(object.spec.containers + object.spec.?initContainers.orValue([])).exists(c, "
    "c.?resources.?limits.orValue({}).exists(k, k.startsWith('nvidia.com/gpu')) || "
    "c.?resources.?requests.orValue({}).exists(k, k.startsWith('nvidia.com/gpu')))"
)
#: CEL: the JSONPatch that appends our gate (or adds the list).
ADD_GATE = (
    f'has(object.spec.schedulingGates) ? [JSONPatch{{op: "add", path: "/spec/schedulingGates/-", '
    f'value: {{"name": "{GATE_NAME}"}}}}] : '
    f'[JSONPatch{{op: "add", path: "/spec/schedulingGates", value: [{{"name": "{GATE_NAME}"}}]}}]'
)


def match_expression() -> str:
    """The policy's one match condition, cheapest terms first (``&&`` stops at the first false):
    most pods have no claims and cost one size test."""
    return f"{HAS_CLAIMS} && {NOT_BOUND} && {NOT_GATED} && !({ASKS_FOR_HAMI_RESOURCES})"


#: The webhook ``pods`` entry's extra match condition where the policy gates the rest: the pods
#: asking for HAMi's resources, and bound pods (rare: its ``/mutate`` refuses one that names a
#: claim or template of our classes with the reason, which no policy can read).
WEBHOOK_KEEPS = {
    "name": "bound-or-asks-for-hami-resources",
    "expression": f"object.spec.?nodeName.orValue('') != '' || {ASKS_FOR_HAMI_RESOURCES}",
}


def pod_gate_policy(
    name: str, namespace_selector: Mapping[str, Any] | None = None, failure_policy: str = "Fail"
) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy ``name`` and its binding: our scheduling gate on new pods with
    claims (see the module's docstring for which). ``namespace_selector``: the webhook's (the chart's
    ``hami-dra.podWebhookNamespaceSelector``); None: every namespace. ``failure_policy``: the
    webhook's, since the policy stands in for it (with Ignore a pod the policy could not evaluate
    is admitted ungated; the controller still allocates its claims of ours, kube-scheduler waiting)."""
    constraints: dict[str, Any] = {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
        ],
    }
    if namespace_selector is not None:
        constraints["namespaceSelector"] = dict(namespace_selector)
    policy = {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": constraints,
            "matchConditions": [{"name": "claims-not-gated", "expression": match_expression()}],
            "failurePolicy": failure_policy,
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": ADD_GATE}}],
        },
    }
    binding = {
        "apiVersion": API_VERSION,
        "kind": BINDING_KIND,
        "metadata": {"name": name},
        "spec": {"policyName": name},
    }
    return [policy, binding]
