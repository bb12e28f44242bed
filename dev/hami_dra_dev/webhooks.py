"""Our admission webhooks as a development cluster registers them by URL: the sandbox (``sandbox
up``, the demo), the local cluster (hami_dra_dev/cluster/driver.py) and the tests on the real
control plane.

The objects mirror what the Helm chart installs, match conditions included: ``hami-resources.<driver>``
(mutating, only in namespaces labelled ``gpu.hami.io/hami-resources=enabled``: HAMi's
``nvidia.com/*`` resources become claims, see webhook/hami_resources.py), ``pods.<driver>``
(mutating: adds the gate on pod CREATE, pods with claims only) and one validating entry per kind
(DeviceClasses, ResourceClaims, ResourceClaimTemplates: GpuConfig, objects with opaque config for
our driver only), reached by URL instead of a Service: the webhook runs on the host.
With ``claim_finalizer``, also ``claims.<driver>`` (mutating, failurePolicy Ignore: our finalizer on
new claims of our classes, webhook/claims.py), which the chart installs where the API server has
no MutatingAdmissionPolicy (webhook/policy.py).
"""

from __future__ import annotations

from typing import Any

from dra_driver.webhook.hami_resources import NAMESPACE_LABEL as HAMI_NAMESPACE_LABEL
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL_VALUE as HAMI_NAMESPACE_LABEL_VALUE
from dra_driver.webhook.pod_gate import ASKS_FOR_HAMI_RESOURCES, WEBHOOK_KEEPS
from dra_driver.webhook.policy import has_config_for

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"

_POD_RULES = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
_CLAIM_RULES = [
    {
        "operations": ["CREATE"],
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "resources": ["resourceclaims"],
    }
]
#: As the chart's (charts/hami-dra/templates/webhook-admission.yaml): one validating entry per kind,
#: DeviceClasses on CREATE and UPDATE, claims and templates on CREATE only (their spec is immutable),
#: so that a webhook outage with failurePolicy Fail never blocks a claim's finalizer removal, hence
#: its deletion; each only for objects that carry opaque config for our driver (its match
#: condition), so kube-apiserver makes no round trip for the claims of a pod that sets none: the
#: benchmark measures the API server's work per pod as the chart installs it.
_CONFIG_KINDS = (
    ("deviceclasses", ["CREATE", "UPDATE"], "Cluster", "Ignore", "object.spec.?config"),
    ("resourceclaims", ["CREATE"], "Namespaced", "Fail", "object.spec.?devices.?config"),
    ("resourceclaimtemplates", ["CREATE"], "Namespaced", "Fail", "object.spec.?spec.?devices.?config"),
)
#: The chart's match condition of the ``pods`` entry: only pods that name claims are sent.
USES_RESOURCE_CLAIMS = {
    "name": "uses-resource-claims",
    "expression": "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0",
}


def webhook_configurations(
    base_url: str,
    ca_bundle: str,
    driver_name: str,
    *,
    name: str = "hami-dra",
    timeout_seconds: int = 10,
    claim_finalizer: bool = False,
    pod_gate: str = "webhook",
) -> list[tuple[str, dict[str, Any]]]:
    """``(kind, object)`` for the mutating and validating configuration; ``ca_bundle`` is base64 PEM.

    ``pod_gate`` policy: the pod gate's MutatingAdmissionPolicy gates pods (webhook/pod_gate.py,
    created by the caller), so ``pods`` matches only what it leaves: bound pods and pods asking for
    HAMi's resources."""
    pods_extra: dict[str, Any] = {"matchConditions": [dict(USES_RESOURCE_CLAIMS)]}
    if pod_gate == "policy":
        pods_extra["matchConditions"].append(dict(WEBHOOK_KEEPS))
    claims = (
        [
            webhook_entry(
                base_url,
                ca_bundle,
                driver_name,
                timeout_seconds,
                "claims",
                "/mutate-claims",
                _CLAIM_RULES,
                failurePolicy="Ignore",
                matchPolicy="Equivalent",
            )
        ]
        if claim_finalizer
        else []
    )

    def webhook(webhook_name: str, path: str, rules: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return webhook_entry(
            base_url, ca_bundle, driver_name, timeout_seconds, webhook_name, path, rules, **extra
        )

    return [
        (
            kind,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name},
                "webhooks": hooks,
            },
        )
        for kind, hooks in (
            (
                MUTATING,
                [
                    # First, so the gate webhook below sees the translated pod (as kube-apiserver
                    # calls the webhooks of one configuration in order).
                    webhook(
                        "hami-resources",
                        "/mutate-hami",
                        _POD_RULES,
                        namespaceSelector={"matchLabels": {HAMI_NAMESPACE_LABEL: HAMI_NAMESPACE_LABEL_VALUE}},
                        matchConditions=[
                            {"name": "asks-for-hami-resources", "expression": ASKS_FOR_HAMI_RESOURCES}
                        ],
                    ),
                    webhook("pods", "/mutate", _POD_RULES, **pods_extra),
                    *claims,
                ],
            ),
            (
                VALIDATING,
                [
                    webhook(
                        resource,
                        "/validate",
                        [
                            {
                                "operations": operations,
                                "apiGroups": ["resource.k8s.io"],
                                "apiVersions": ["v1"],
                                "resources": [resource],
                                "scope": scope,
                            }
                        ],
                        failurePolicy=failure_policy,
                        matchPolicy="Equivalent",
                        matchConditions=[
                            {
                                "name": "has-gpuconfig-for-driver",
                                "expression": has_config_for(path, driver_name),
                            }
                        ],
                    )
                    for resource, operations, scope, failure_policy, path in _CONFIG_KINDS
                ],
            ),
        )
    ]


def webhook_entry(
    base_url: str, ca_bundle: str, driver_name: str, timeout_seconds: int, webhook_name: str, path: str,
    rules: list[dict[str, Any]], **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """One webhook of a configuration; ``extra`` adds or overrides fields (failurePolicy: Fail)."""
    return {
        "name": f"{webhook_name}.{driver_name}",
        "clientConfig": {"url": f"{base_url}{path}", "caBundle": ca_bundle},
        "rules": rules,
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    } | extra
