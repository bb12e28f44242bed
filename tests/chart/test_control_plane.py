"""Controller and webhook Deployments, leader election, certificates and admission configurations."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.chart.combos import CERT_MANAGER, CERT_MANAGER_ISSUER, EXISTING_CERT, HA, PLUGIN_ONLY
from tests.chart.helpers import NAMESPACE, HelmError, Render, all_of, container, find

GATE = "gpu.hami.io/allocation"


def test_controller_args_and_leader_election(render: Render) -> None:
    objects = render()
    deploy = find(objects, "Deployment", "controller")
    assert deploy["spec"]["replicas"] == 1
    args = container(deploy)["args"]
    assert args[:2] == ["-v", "controller"]
    assert {
        "--driver-name=gpu.hami.io",
        "--leader-elect",
        f"--leader-elect-namespace={NAMESPACE}",
        "--default-policy=spread",
        "--default-node-policy=binpack",
        "--gang-timeout=60",
        "--metrics-bind-address=:8080",
    } <= set(args)
    role = find(objects, "Role", "controller-leader-election")
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    binding = find(objects, "RoleBinding", "controller-leader-election")
    assert binding["subjects"][0]["name"] == deploy["spec"]["template"]["spec"]["serviceAccountName"]


def test_two_controller_replicas(render: Render) -> None:
    objects = render(values=HA)
    deploy = find(objects, "Deployment", "controller")
    assert deploy["spec"]["replicas"] == 2
    assert "--leader-elect" in container(deploy)["args"]
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    pdbs = {p["metadata"]["name"]: p["spec"]["minAvailable"] for p in all_of(objects, "PodDisruptionBudget")}
    assert pdbs == {"t-hami-dra-controller": 1, "t-hami-dra-webhook": 1}


def test_two_replicas_without_leader_election_is_refused(render: Render) -> None:
    with pytest.raises(HelmError, match=r"needs controller\.leaderElection\.enabled"):
        render(values={"controller": {"replicas": 2, "leaderElection": {"enabled": False}}})


def test_controller_metrics_service(render: Render) -> None:
    objects = render()
    svc = find(objects, "Service", "controller-metrics")
    pod_labels = find(objects, "Deployment", "controller")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_webhook_deployment_and_service(render: Render) -> None:
    objects = render()
    deploy = find(objects, "Deployment", "webhook")
    c = container(deploy)
    assert c["args"][:2] == ["-v", "webhook"]
    assert {
        "--tls-cert-file=/etc/hami-dra/tls/tls.crt",
        "--tls-key-file=/etc/hami-dra/tls/tls.key",
        "--port=8443",
        "--driver-name=gpu.hami.io",
    } <= set(c["args"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == find(objects, "Secret", "webhook-tls")["metadata"]["name"]
    svc = find(objects, "Service", "webhook")
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    for workload in (deploy, find(objects, "Deployment", "controller")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container(workload)["securityContext"]["readOnlyRootFilesystem"] is True


#: The API version that lets the chart render its admission policies (1.36+ serves it).
MAP = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def _webhooks(objects: list[dict]) -> list[dict]:
    hooks: list[dict] = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks += find(objects, kind)["webhooks"]
    return hooks


def test_mutating_webhook_gates_pods_with_claims(render: Render) -> None:
    config = find(render(), "MutatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["gpu.hami.io/scheduling-gate"] == GATE
    hami, hook, claims = config["webhooks"]  # claims: test_claim_finalizer.py
    assert claims["name"] == "claims.gpu.hami.io"
    assert hami["name"] == "hami-resources.gpu.hami.io", "translation first, then the gate"
    assert hami["clientConfig"]["service"]["path"] == "/mutate-hami" and hami["sideEffects"] == "None"
    assert hook["name"] == "pods.gpu.hami.io"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ], "scheduling gates can only be added when the pod is created"
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["failurePolicy"] == "Fail"
    assert hook["clientConfig"]["service"] == {
        "name": "t-hami-dra-webhook", "namespace": NAMESPACE, "path": "/mutate", "port": 443,
    }  # fmt: skip
    assert "resourceClaims" in hook["matchConditions"][0]["expression"]


def test_validating_webhooks_cover_our_config(render: Render) -> None:
    config = find(render(), "ValidatingWebhookConfiguration")
    by_name = {h["name"]: h for h in config["webhooks"]}
    assert set(by_name) == {
        "deviceclasses.gpu.hami.io",
        "resourceclaims.gpu.hami.io",
        "resourceclaimtemplates.gpu.hami.io",
    }
    for name, hook in by_name.items():
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["resource.k8s.io"] and rule["apiVersions"] == ["v1"]
        assert rule["resources"] == [name.split(".")[0]]
        assert "'gpu.hami.io'" in hook["matchConditions"][0]["expression"]
        assert hook["clientConfig"]["service"]["path"] == "/validate"
    # The chart installs DeviceClasses next to the webhook: Fail would reject its own install.
    assert by_name["deviceclasses.gpu.hami.io"]["failurePolicy"] == "Ignore"
    assert by_name["resourceclaims.gpu.hami.io"]["rules"][0]["operations"] == ["CREATE"]


def test_self_signed_ca_bundle_is_present_and_matches_the_secret(render: Render) -> None:
    objects = render()
    secret = find(objects, "Secret", "webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = secret["data"]["ca.crt"]
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    assert base64.b64decode(secret["data"]["tls.key"]).startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    for hook in _webhooks(objects):
        assert hook["clientConfig"]["caBundle"] == ca, hook["name"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
def test_self_signed_certificate_verifies_for_the_service(render: Render, tmp_path: Path) -> None:
    data = find(render(), "Secret", "webhook-tls")["data"]
    for key in ("ca.crt", "tls.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(data[key]))
    service_dns = f"t-hami-dra-webhook.{NAMESPACE}.svc"
    command = ["openssl", "verify", "-CAfile", tmp_path / "ca.crt", "-verify_hostname", service_dns]
    proc = subprocess.run([*command, tmp_path / "tls.crt"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cert_manager_mode(render: Render) -> None:
    objects = render(values=CERT_MANAGER)
    assert not [s for s in all_of(objects, "Secret")], "cert-manager writes the Secret"
    cert = find(objects, "Certificate")
    issuer = find(objects, "Issuer")
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    deploy = find(objects, "Deployment", "webhook")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert f"t-hami-dra-webhook.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = find(objects, kind)
        inject = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert inject == f"{NAMESPACE}/{cert['metadata']['name']}"
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"]), "cainjector fills it"


def test_cert_manager_with_an_existing_issuer(render: Render) -> None:
    objects = render(values=CERT_MANAGER_ISSUER)
    assert not all_of(objects, "Issuer")
    assert find(objects, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "ca"}


def test_existing_certificate_mode(render: Render) -> None:
    objects = render(values=EXISTING_CERT)
    assert not all_of(objects, "Secret") and not all_of(objects, "Certificate")
    deploy = find(objects, "Deployment", "webhook")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "my-tls"
    assert {h["clientConfig"]["caBundle"] for h in _webhooks(objects)} == {"LS0tLS1CRUdJTg=="}
    with pytest.raises(HelmError, match=r"existing\.caBundle is required"):
        render(values={"webhook": {"certificate": {"mode": "existing", "existing": {"secretName": "x"}}}})


def test_components_can_be_turned_off(render: Render) -> None:
    objects = render(values=PLUGIN_ONLY)
    kinds = {o["kind"] for o in objects}
    assert "MutatingWebhookConfiguration" not in kinds and "ValidatingAdmissionPolicy" not in kinds
    assert [o["metadata"]["name"] for o in all_of(objects, "Deployment")] == []
    assert [o["metadata"]["name"] for o in all_of(objects, "DeviceClass")] == ["gpu.hami.io"]
    assert [o["metadata"]["name"] for o in all_of(objects, "ServiceAccount")] == ["t-hami-dra-kubelet-plugin"]


def test_gate_annotation_names_the_gate_the_webhook_adds() -> None:
    webhook = pytest.importorskip("dra_driver.webhook", reason="the webhook package is not written yet")
    assert webhook.GATE_NAME == GATE


def test_hami_translation_is_opt_in_per_namespace_or_cluster_wide(render: Render) -> None:
    def hooks(values: dict[str, Any]) -> list[str]:
        return [h["name"] for h in find(render(values=values), "MutatingWebhookConfiguration")["webhooks"]]

    assert hooks({"webhook": {"hamiResources": {"translate": "off"}}}) == [
        "pods.gpu.hami.io",
        "claims.gpu.hami.io",
    ]
    everywhere = find(render(values={"webhook": {"hamiResources": {"translate": "all"}}}),
                      "MutatingWebhookConfiguration")["webhooks"][0]  # fmt: skip
    # Every namespace, but never kube-system, the release's, or one an admin switched off.
    assert everywhere["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "hami-system"],
            },
            {"key": "gpu.hami.io/admission", "operator": "NotIn", "values": ["disabled"]},
        ]
    }


def test_the_pod_gate_never_covers_system_namespaces_and_keeps_the_admins_selector(render: Render) -> None:
    values = {
        "webhook": {"namespaceSelector": {"matchLabels": {"team": "gpu"}}, "excludeNamespaces": ["ops"]}
    }
    hooks = find(render(values=values), "MutatingWebhookConfiguration")["webhooks"]
    gate = next(h for h in hooks if h["name"] == "pods.gpu.hami.io")
    assert gate["namespaceSelector"]["matchLabels"] == {"team": "gpu"}
    names = gate["namespaceSelector"]["matchExpressions"][0]
    assert names == {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", "hami-system", "ops"],
    }
    assert "objectSelector" not in gate, "a pod label a tenant sets must never take a pod past the gate"
    args = container(find(render(), "Deployment", "t-hami-dra-webhook"))["args"]
    assert "--hami-device-class=gpu.hami.io" in args, "the first DeviceClass by default"


def test_the_development_clusters_register_the_operations_the_chart_does(render: Render) -> None:
    """The webhook configuration the development clusters register (the sandbox, the local cluster,
    the tests on the real control plane) must not be stricter than the chart's (or looser)."""
    from hami_dra_dev.webhooks import webhook_configurations

    def operations(hooks: list[dict]) -> dict[tuple[str, str], set[str]]:
        covered: dict[tuple[str, str], set[str]] = {}
        for hook in hooks:
            for rule in hook["rules"]:
                for resource in rule["resources"]:
                    kind = (
                        "mutating" if hook["name"].startswith(("pods.", "hami-resources.")) else "validating"
                    )
                    covered.setdefault((kind, resource), set()).update(rule["operations"])
        return covered

    def mutating_order(hooks: list[dict]) -> list[tuple[str, Any]]:
        """Mutating hooks in call order, with the namespaces each serves (the chart's exclusion of
        kube-system and its own namespace aside: the development clusters run the webhook off-cluster)."""
        return [
            (
                hook["name"],
                {k: v for k, v in (hook.get("namespaceSelector") or {}).items() if k != "matchExpressions"},
            )
            for hook in hooks
            if hook["name"].startswith(("pods.", "hami-resources."))
        ]

    dev_hooks = [
        hook
        for _, body in webhook_configurations("https://x", "", "gpu.hami.io")
        for hook in body["webhooks"]
    ]
    chart_hooks = _webhooks(render())
    assert operations(dev_hooks) == operations(chart_hooks)
    assert mutating_order(dev_hooks) == mutating_order(chart_hooks)
    assert mutating_order(dev_hooks)[0] == (
        "hami-resources.gpu.hami.io",
        {"matchLabels": {"gpu.hami.io/hami-resources": "enabled"}},
    ), "HAMi translation runs first, only in opted-in namespaces"


def test_the_development_clusters_send_the_webhook_what_the_chart_sends(render: Render) -> None:
    """Same match conditions and failure policies per webhook: the benchmark and the tests on the
    real control plane must cost kube-apiserver the round trips the chart's install costs (a claim
    without our config is not sent to ``/validate``), no more and no fewer."""
    from hami_dra_dev.webhooks import webhook_configurations

    def filters(hooks: list[dict]) -> dict[str, tuple[str, list[tuple[str, str]], list[str]]]:
        return {
            hook["name"]: (
                hook["failurePolicy"],
                [(c["name"], " ".join(c["expression"].split())) for c in hook.get("matchConditions") or []],
                sorted(r for rule in hook["rules"] for r in rule["resources"]),
            )
            for hook in hooks
        }

    for pod_gate in ("webhook", "policy"):
        dev_hooks = [
            hook
            for _, body in webhook_configurations("https://x", "", "gpu.hami.io", pod_gate=pod_gate)
            for hook in body["webhooks"]
        ]
        chart_hooks = [
            hook for hook in _webhooks(render({"webhook": {"podGate": pod_gate}}, api_versions=(MAP,)))
            if not hook["name"].startswith("claims.")  # the finalizer webhook: test_claim_finalizer.py
        ]  # fmt: skip
        assert filters(dev_hooks) == filters(chart_hooks), pod_gate
    validate = filters(dev_hooks)["resourceclaims.gpu.hami.io"]
    assert validate[1] == [
        ("has-gpuconfig-for-driver",
         "object.spec.?devices.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == 'gpu.hami.io')")
    ]  # fmt: skip


def test_our_pods_get_no_service_link_variables(render: Render) -> None:
    """The API server is found through KUBERNETES_SERVICE_* (kubelet sets them either way); one
    variable set per Service of the release's namespace would only grow every process's
    environment, which the API client used to walk before each request."""
    objects = render()
    workloads = [*all_of(objects, "Deployment"), *all_of(objects, "DaemonSet")]
    assert {w["metadata"]["name"] for w in workloads} >= {
        "t-hami-dra-controller", "t-hami-dra-webhook", "t-hami-dra-kubelet-plugin"
    }  # fmt: skip
    for workload in workloads:
        spec = workload["spec"]["template"]["spec"]
        if spec.get("automountServiceAccountToken") is False:
            continue  # talks to no API (the HAMi-core copier)
        assert spec.get("enableServiceLinks") is False, workload["metadata"]["name"]
