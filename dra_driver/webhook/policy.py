"""The claim finalizer as a MutatingAdmissionPolicy: what ``/mutate-claims`` does, in the API server.

Where kube-apiserver serves ``admissionregistration.k8s.io/v1`` MutatingAdmissionPolicy (GA and
on by default from Kubernetes 1.36; beta and off by default in 1.34 and 1.35), the finalizer is
added by CEL in process: no TLS round trip per claim create, no webhook pod in the path. The chart
renders the same objects (charts/hami-dra/templates/claim-finalizer.yaml; tests/chart compares
them), the local cluster harness creates them from here.

Which claims: those naming (in ``exactly`` or a ``firstAvailable`` alternative) a DeviceClass of
ours, decided like ``dra_driver.config.classes.is_driver_class``: the class is the policy's
parameter (``paramKind`` DeviceClass, every class selected by the binding), so the policy is
evaluated once per DeviceClass in the cluster and needs no list of class names; classes an admin
adds later count at once. A claim that gets no finalizer here (an API server without the policy
API, a class whose selector names the driver some other way) is finalized by the controller
before its allocation, as before.
"""

from __future__ import annotations

from typing import Any

from dra_driver.contract import FINALIZER

API_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
#: The resource the API server lists when it serves the policy API (discovery of ``API_VERSION``).
POLICY_RESOURCE = "mutatingadmissionpolicies"
#: Kind -> the resource's plural, for REST paths.
PLURALS = {POLICY_KIND: POLICY_RESOURCE, BINDING_KIND: "mutatingadmissionpolicybindings"}


def has_config_for(config_path: str, driver: str) -> str:
    """CEL: the config list at ``config_path`` (an optional field path, e.g. ``object.spec.?config``)
    has an opaque entry for ``driver``; the chart's validating webhooks match on the same test."""
    return f"{config_path}.orValue([]).exists(c, c.?opaque.?driver.orValue('') == '{driver}')"


def class_is_ours_expression(driver: str) -> str:
    """CEL over ``params`` (a DeviceClass): ``is_driver_class`` (named after the driver, opaque
    config for it, or a selector ``device.driver == "<driver>"``)."""
    escaped = driver.replace(".", r"\.")
    pattern = rf"device\s*\.\s*driver\s*==\s*[\x22\x27]{escaped}[\x22\x27]"
    return (
        f"params.metadata.name == '{driver}' || "
        f"{has_config_for('params.spec.?config', driver)} || "
        f"params.spec.?selectors.orValue([]).exists(s, s.?cel.?expression.orValue('').matches(r'{pattern}'))"
    )


#: CEL: the claim names the class in ``params`` in one of its requests or alternatives.
CLAIM_NAMES_CLASS = (
    "object.spec.?devices.?requests.orValue([]).exists(r, "
    "r.?exactly.?deviceClassName.orValue('') == params.metadata.name || "
    "r.?firstAvailable.orValue([]).exists(s, s.?deviceClassName.orValue('') == params.metadata.name))"
)
#: CEL: the claim does not carry our finalizer yet (a second class of ours finds it there).
NOT_FINALIZED = f"!('{FINALIZER}' in object.metadata.?finalizers.orValue([]))"
#: CEL: the JSONPatch that appends our finalizer (or adds the list).
ADD_FINALIZER = (
    f'has(object.metadata.finalizers) ? [JSONPatch{{op: "add", path: "/metadata/finalizers/-", '
    f'value: "{FINALIZER}"}}] : '
    f'[JSONPatch{{op: "add", path: "/metadata/finalizers", value: ["{FINALIZER}"]}}]'
)


def match_expression(driver: str) -> str:
    """The policy's one match condition: the claim is not finalized, names the class in ``params``
    and that class is ours, in this order.

    One expression, not three conditions: the API server evaluates every match condition of a
    policy for every parameter (every DeviceClass in the cluster) on every claim created, while
    CEL's ``&&`` stops at the first false term. Measured (bench_cluster --profile-apiserver, 100
    nodes, 1.37.2) as three conditions, the policy took 5.7% of kube-apiserver's CPU on our path,
    as much as the pod webhook's call; the class test (a regular expression over the class's
    selectors) now runs only for the class the claim names."""
    return f"{NOT_FINALIZED} && {CLAIM_NAMES_CLASS} && ({class_is_ours_expression(driver)})"


def claim_finalizer_policy(driver: str, name: str) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy ``name`` and its binding: our finalizer on new claims of our
    classes. ``failurePolicy: Ignore``: the finalizer saves a write, it is never needed to admit."""
    policy = {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "paramKind": {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"},
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["resourceclaims"],
                    }
                ],
            },
            "matchConditions": [{"name": "ours-not-finalized", "expression": match_expression(driver)}],
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": ADD_FINALIZER}}],
        },
    }
    binding = {
        "apiVersion": API_VERSION,
        "kind": BINDING_KIND,
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
        },
    }
    return [policy, binding]
