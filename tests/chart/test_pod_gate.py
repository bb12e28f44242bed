"""The pod gate at admission (``webhook.podGate``; charts/hami-dra/templates/pod-gate.yaml and the
webhook's ``pods`` entry): the webhook by default; a MutatingAdmissionPolicy, the one
dra_driver/webhook/pod_gate.py builds, where asked for (``policy``) or served (``auto``), the
webhook then keeping only pods that ask for HAMi's resources and bound ones. The match conditions
are evaluated with cel-expr-python: every new pod with claims that can be gated is the policy's
or the webhook's, never both, never neither."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from dra_driver.contract import GATE_NAME
from dra_driver.webhook.pod_gate import WEBHOOK_KEEPS, pod_gate_policy
from tests.chart.helpers import CHART, NAMESPACE, RELEASE, HelmError, Render, all_of, find

MAP = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
POLICY = {"webhook": {"podGate": "policy"}}
AUTO = {"webhook": {"podGate": "auto"}}


def gate_policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in all_of(objects, "MutatingAdmissionPolicy")
        + all_of(objects, "MutatingAdmissionPolicyBinding")
        if o["metadata"]["name"].endswith("-pod-gate")
    ]


def pods_entry(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (hook,) = [
        h for h in find(objects, "MutatingWebhookConfiguration")["webhooks"] if h["name"].startswith("pods.")
    ]
    return hook


@pytest.mark.parametrize(
    ("values", "served", "policy"),
    [
        ({}, True, False),
        (AUTO, True, True),
        (AUTO, False, False),
        (POLICY, False, True),
        (POLICY, True, True),
        ({"webhook": {"podGate": "webhook"}}, True, False),
    ],
    ids=["default-served", "auto-served", "auto", "policy-forced", "policy-served", "webhook"],
)
def test_the_mode_picks_the_policy_or_the_webhook(
    render: Render, values: dict[str, Any], served: bool, policy: bool
) -> None:
    objects = render(values, api_versions=(MAP,) if served else ())
    assert bool(gate_policies(objects)) is policy
    conditions = [c["name"] for c in pods_entry(objects)["matchConditions"]]
    expected = ["uses-resource-claims", WEBHOOK_KEEPS["name"]] if policy else ["uses-resource-claims"]
    assert conditions == expected


def test_without_the_webhook_nothing_gates(render: Render) -> None:
    objects = render({"webhook": {"enabled": False, "podGate": "policy"}}, api_versions=(MAP,))
    assert gate_policies(objects) == [] and all_of(objects, "MutatingWebhookConfiguration") == []


def test_an_unknown_mode_is_refused(render: Render) -> None:
    with pytest.raises(HelmError, match="podGate"):
        render({"webhook": {"podGate": "cel"}})


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "failurePolicy": "Ignore",
            "namespaceSelector": {"matchLabels": {"team": "gpu"}},
            "excludeNamespaces": ["batch-system"],
        },
    ],
    ids=["defaults", "selector-and-ignore"],
)
def test_the_policy_is_pod_gate_py_s_in_the_webhooks_namespaces(
    render: Render, values: dict[str, Any]
) -> None:
    webhook = {"podGate": "policy", **values}
    objects = render({"webhook": webhook})
    rendered = gate_policies(objects)
    name = rendered[0]["metadata"]["name"]
    assert name == f"{RELEASE}-hami-dra-pod-gate"
    selector = pods_entry(objects)["namespaceSelector"]
    expected = pod_gate_policy(name, selector, values.get("failurePolicy", "Fail"))
    assert [(o["kind"], o["spec"]) for o in rendered] == [(o["kind"], o["spec"]) for o in expected]
    excluded = selector["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and {"kube-system", NAMESPACE} <= set(excluded["values"])
    if "excludeNamespaces" in values:
        assert "batch-system" in excluded["values"] and selector["matchLabels"] == {"team": "gpu"}


def test_the_hami_entry_and_the_policy_agree_on_which_pods_ask_for_hami_resources(render: Render) -> None:
    objects = render(POLICY)
    hooks = find(objects, "MutatingWebhookConfiguration")["webhooks"]
    (hami,) = [h for h in hooks if h["name"].startswith("hami-resources.")]
    (asks,) = hami["matchConditions"]
    assert pods_entry(objects)["matchConditions"][1] == WEBHOOK_KEEPS
    assert WEBHOOK_KEEPS["expression"].endswith(f" || {asks['expression']}")
    assert f"!({asks['expression']})" in gate_policies(objects)[0]["spec"]["matchConditions"][0]["expression"]


# --- NOTES ----------------------------------------------------------------------------------------


def notes(helm: str, *sets: str) -> str:
    """What ``helm install`` prints after installing (``--dry-run=client``: no cluster; its
    capabilities are Helm's defaults, which have no MutatingAdmissionPolicy)."""
    args = [helm, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client"]
    for value in sets:
        args += ["--set", value]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def test_notes_say_what_gates_pods(helm: str) -> None:
    fallback = notes(helm, "webhook.podGate=auto")
    assert "webhook.podGate is auto, but this API server does not serve" in fallback
    policy = notes(helm, "webhook.podGate=policy")
    assert "pod-gate" in policy and "pods of other DRA drivers there wait" in policy
    default = notes(helm)
    assert "podGate" not in default and "pod-gate" not in default


# --- the match conditions, evaluated --------------------------------------------------------------

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is not installed")


def _holds(conditions: list[dict[str, Any]], pod: dict[str, Any]) -> bool:
    from tests.chart.test_admission_cel import admission_env

    env = admission_env()
    inputs = {"object": pod, "oldObject": None, "request": {}, "variables": {}, "params": None}
    for condition in conditions:
        value = env.compile(condition["expression"]).eval(env.Activation(inputs))
        assert value.type() != cel.Type.ERROR, (condition["name"], value.value())
        if value.plain_value() is not True:
            return False
    return True


def pod(
    claims: int = 1,
    node: str = "",
    gates: tuple[str, ...] = (),
    limits: dict[str, str] | None = None,
    init_requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if claims:
        spec["resourceClaims"] = [{"name": f"g{i}", "resourceClaimTemplateName": "t"} for i in range(claims)]
    if node:
        spec["nodeName"] = node
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if limits:
        spec["containers"][0]["resources"] = {"limits": limits}
    if init_requests:
        spec["initContainers"] = [{"name": "i", "image": "x", "resources": {"requests": init_requests}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


PODS = {
    # name: (pod, the policy gates it, the webhook's pods entry is called)
    "claims": (pod(), True, False),
    "two claims": (pod(claims=2), True, False),
    "another gate": (pod(gates=("someone.else/wait",)), True, False),
    "no claims": (pod(claims=0), False, False),
    "no claims, nvidia.com/gpu": (pod(claims=0, limits={"nvidia.com/gpu": "1"}), False, False),
    "bound": (pod(node="node-a"), False, True),
    "bound, no claims": (pod(claims=0, node="node-a"), False, False),
    "gated already": (pod(gates=(GATE_NAME,)), False, False),
    "nvidia.com/gpu": (pod(limits={"nvidia.com/gpu": "1"}), False, True),
    "nvidia.com/gpumem": (pod(limits={"nvidia.com/gpumem": "1000"}), False, True),
    "init container nvidia.com/gpu": (pod(init_requests={"nvidia.com/gpu": "1"}), False, True),
    "cpu only": (pod(limits={"cpu": "1"}), True, False),
}


@pytest.mark.parametrize("case", PODS, ids=list(PODS))
def test_each_pod_with_claims_is_gated_by_exactly_one_of_them(render: Render, case: str) -> None:
    """Bound pods with claims still go to the webhook (its ``/mutate`` refuses one of our classes,
    saying why); a gated one goes to neither."""
    objects = render(POLICY)
    policy_conditions = gate_policies(objects)[0]["spec"]["matchConditions"]
    webhook_conditions = pods_entry(objects)["matchConditions"]
    body, gated, called = PODS[case]
    assert _holds(policy_conditions, body) is gated
    assert _holds(webhook_conditions, body) is called
    assert not (gated and called)
