"""The webhook survives untrusted tenants: two replicas and a PDB by default, its limits passed to
the server, an optional NetworkPolicy that must name who may call it, /mutate-hami with no rights
to write, and the controller (which makes the translated pods' templates) told where it may."""

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
    } <= set(_args(render()))
    assert {
        "--max-connections=32",
        "--connection-timeout=5.5",
        "--max-request-bytes=1048576",
        "--max-inflight-bytes=2097152",
    } <= set(_args(render(values_file=ALL_ON)))


def _controller_args(objects: list[dict]) -> list[str]:
    return list(container(find(objects, "Deployment", "controller"))["args"])


def test_translate_all_hands_the_configurations_selector_to_the_controller(render: Render) -> None:
    """The controller makes the templates, so it applies the opt-in."""
    objects = render(values_file=ALL_ON)
    (hami,) = [
        h for h in find(objects, "MutatingWebhookConfiguration")["webhooks"] if h["name"].startswith("hami")
    ]
    args = _controller_args(objects)
    flags = [a for a in args if a.startswith("--hami-namespace-selector=")]
    assert len(flags) == 1
    assert json.loads(flags[0].split("=", 1)[1]) == hami["namespaceSelector"]
    for flags_of in (args, _args(objects)):
        assert {"--hami-translate=all", "--hami-device-class=a100-latency.gpu.hami.io"} <= set(flags_of)
    assert not [a for a in _args(objects) if a.startswith("--hami-namespace-selector")], (
        "the webhook decides nothing by namespace"
    )
    default = render()
    assert "--hami-translate=namespaces" in _controller_args(default)
    assert not [a for a in _controller_args(default) if a.startswith("--hami-namespace-selector")], (
        "label mode: no selector"
    )
    off = render(values={"webhook": {"enabled": False}})
    assert "--hami-translate=off" in _controller_args(off), "no webhook translates, no templates"


def _rules(objects: list[dict], component: str) -> list[dict]:
    role = next(r for r in all_of(objects, "ClusterRole") if r["metadata"]["name"].endswith(f"-{component}"))
    return list(role["rules"])


def _verbs(rules: list[dict], resource: str) -> set[str]:
    return {verb for rule in rules if resource in rule["resources"] for verb in rule["verbs"]}


def test_the_webhook_cannot_write_and_the_controller_makes_the_templates(render: Render) -> None:
    """Before: the webhook created templates with its own rights for any caller of its Service."""
    objects = render()
    webhook = _rules(objects, "webhook")
    assert all(set(rule["verbs"]) <= {"get", "list"} for rule in webhook), webhook
    assert _verbs(webhook, "namespaces") == set()
    controller = _rules(objects, "controller")
    assert "create" in _verbs(controller, "resourceclaimtemplates")
    assert _verbs(controller, "namespaces") == {"get"}
    off = _rules(render(values={"webhook": {"hamiResources": {"translate": "off"}}}), "controller")
    assert _verbs(off, "resourceclaimtemplates") == set()


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
        ({"webhook": {"hamiResources": {"maxTemplatesPerNamespace": 64}}}, "maxTemplatesPerNamespace"),
        ({"webhook": {"networkPolicy": {"enabled": True, "from": [{"ipBlok": {}}]}}}, "ipBlok"),
    ],
)
def test_schema_rejects_bad_webhook_limits(render: Render, values: dict, where: str) -> None:
    with pytest.raises(HelmError) as caught:
        render(values=values)
    assert where in str(caught.value)


def test_client_auth_mounts_the_api_servers_ca_and_names_its_certificate(render: Render) -> None:
    import base64

    assert not [a for a in _args(render()) if a.startswith("--client-")], "off by default"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    values = {
        "webhook": {
            "clientAuth": {
                "enabled": True,
                "caBundle": base64.b64encode(pem.encode()).decode(),
                "names": ["kube-apiserver-webhook-client"],
            }
        }
    }
    objects = render(values=values)
    args = _args(objects)
    assert "--client-ca-file=/etc/hami-dra/client-ca/ca.crt" in args
    assert "--client-name=kube-apiserver-webhook-client" in args
    configmap = find(objects, "ConfigMap", "webhook-client-ca")
    assert configmap["data"]["ca.crt"] == pem
    deploy = find(objects, "Deployment", "webhook")
    pod = deploy["spec"]["template"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "client-ca"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container(deploy)["volumeMounts"]}
    assert mounts["client-ca"] == "/etc/hami-dra/client-ca"
    assert pod["metadata"]["annotations"]["checksum/client-ca"], "a new CA rolls the pods"
    with pytest.raises(HelmError, match=r"webhook\.clientAuth\.caBundle must be"):
        render(values={"webhook": {"clientAuth": {"enabled": True}}})
