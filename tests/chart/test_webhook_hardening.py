"""The webhook survives untrusted tenants: two replicas and a PDB by default, its limits passed to
the server, an optional NetworkPolicy that must name who may call it, and the server told which
namespaces /mutate-hami may write to."""

from __future__ import annotations

import json

import pytest

from tests.chart.helpers import ALL_ON, HelmError, Render, all_of, container, find

WEBHOOK_LABEL = {"app.kubernetes.io/component": "webhook"}


def _args(objects: list[dict]) -> list[str]:
    return list(container(find(objects, "Deployment", "webhook"))["args"])


def test_two_replicas_spread_with_a_disruption_budget_by_default(render: Render) -> None:
    objects = render()
    deploy = find(objects, "Deployment", "webhook")
    assert deploy["spec"]["replicas"] == 2
    term = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert WEBHOOK_LABEL.items() <= term["labelSelector"]["matchLabels"].items()
    pdb = find(objects, "PodDisruptionBudget", "webhook")
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )


def test_one_replica_has_no_disruption_budget(render: Render) -> None:
    objects = render(values={"webhook": {"replicas": 1}})
    assert not [
        p for p in all_of(objects, "PodDisruptionBudget") if p["metadata"]["name"].endswith("webhook")
    ]
    assert "affinity" not in find(objects, "Deployment", "webhook")["spec"]["template"]["spec"]


def test_limits_reach_the_server(render: Render) -> None:
    assert {
        "--max-connections=64",
        "--connection-timeout=10",
        "--max-request-bytes=3145728",
        "--max-inflight-bytes=4194304",
        "--hami-translate=namespaces",
        "--hami-max-templates-per-namespace=64",
    } <= set(_args(render()))
    assert {
        "--max-connections=32",
        "--connection-timeout=5.5",
        "--max-request-bytes=1048576",
        "--max-inflight-bytes=2097152",
        "--hami-max-templates-per-namespace=16",
    } <= set(_args(render(values_file=ALL_ON)))


def test_translate_all_hands_the_configurations_selector_to_the_server(render: Render) -> None:
    objects = render(values_file=ALL_ON)
    (hami,) = [
        h for h in find(objects, "MutatingWebhookConfiguration")["webhooks"] if h["name"].startswith("hami")
    ]
    flags = [a for a in _args(objects) if a.startswith("--hami-namespace-selector=")]
    assert len(flags) == 1
    assert json.loads(flags[0].split("=", 1)[1]) == hami["namespaceSelector"]
    assert "--hami-translate=all" in _args(objects)
    assert not [a for a in _args(render()) if a.startswith("--hami-namespace-selector")], (
        "label mode: no selector"
    )


def test_network_policy_admits_only_the_named_peers_to_the_webhook_port(render: Render) -> None:
    assert not all_of(render(), "NetworkPolicy"), "off by default"
    objects = render(values_file=ALL_ON)
    policy = find(objects, "NetworkPolicy", "webhook")
    deploy = find(objects, "Deployment", "webhook")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": container(deploy)["ports"][0]["containerPort"]}]
    assert rule["from"][0] == {"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.128/25"]}}


def test_network_policy_without_peers_is_refused(render: Render) -> None:
    with pytest.raises(HelmError, match=r"webhook\.networkPolicy\.from must list who may call the webhook"):
        render(values={"webhook": {"networkPolicy": {"enabled": True}}})


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"webhook": {"server": {"maxConnections": 0}}}, "/webhook/server/maxConnections"),
        (
            {"webhook": {"server": {"connectionTimeoutSeconds": 0}}},
            "/webhook/server/connectionTimeoutSeconds",
        ),
        ({"webhook": {"hamiResources": {"maxTemplatesPerNamespace": 0}}}, "maxTemplatesPerNamespace"),
        ({"webhook": {"networkPolicy": {"enabled": True, "from": [{"ipBlok": {}}]}}}, "ipBlok"),
    ],
)
def test_schema_rejects_bad_webhook_limits(render: Render, values: dict, where: str) -> None:
    with pytest.raises(HelmError) as caught:
        render(values=values)
    assert where in str(caught.value)
