"""A tenant's pod posts hand-made AdmissionReviews straight to the webhook's Service (issue 34).

The webhook's Service answers any caller that reaches it (the chart's NetworkPolicy is off by
default), so a review need not come from the API server. Before: ``/mutate-hami`` created the
templates a review named, in the namespace it named, with the webhook's own rights (64 appeared in
another tenant's opted-in namespace, whose own HAMi pod of a new shape was then denied: the
per-namespace cap was shared with the attacker), and read that namespace's labels and claims.

After: ``/mutate-hami`` answers from the review alone, and the controller makes a translated pod's
templates from the pod the API server stored, owned by it. Here the forged reviews reach the
webhook and get their answers, and nothing appears anywhere; the answers are the same whichever
namespace a review names (the webhook read nothing of it); the victim's own HAMi pod still gets
its template, which is deleted with the pod; and every card and namespace stays within bounds.

``/mutate`` must follow the claims a pod names to their class, so a review naming another
namespace's claims learns whether they exist and are ours. Where the admin makes the API server
present a client certificate to webhooks (the local cluster does: dev/hami_dra_dev/cluster/configs.py),
``webhook.clientAuth`` has the webhook answer reviews only over its connections: the forger then
gets no answer at all, and the API server's own reviews still are.

The forger runs the driver's own image (it has Python; the node is offline) as the tenant.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from dra_driver.webhook.hami_resources import NAMESPACE_LABEL, TEMPLATE_LABEL, TRANSLATED_ANNOTATION
from hami_dra_dev.cluster.configs import WEBHOOK_CLIENT_NAME
from hami_dra_dev.cluster.layout import Layout
from tests.cluster.drivers import CHART_NAMESPACE, COMPONENT_LABEL, ChartDriver, DriverUnderTest
from tests.cluster.tenancy import OTHER_NS, TENANT_NS, Tenancy, claim
from tests.cluster.test_e2e import POD_TIMEOUT
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

#: Distinct shapes the forger asks for: before, each was one more template in the victim's namespace.
FORGED_SHAPES = 16

#: Posts every review in $REVIEWS to the webhook and prints one JSON line per answer.
FORGER = """
import json, os, ssl, urllib.error, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
for path, review in json.loads(os.environ["REVIEWS"]):
    request = urllib.request.Request(
        os.environ["WEBHOOK"] + path, data=json.dumps(review).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as reply:
            answer = {"status": reply.status, "body": json.loads(reply.read())}
    except urllib.error.HTTPError as err:
        answer = {"status": err.code, "error": err.read().decode(errors="replace")}
    except Exception as err:
        answer = {"status": 0, "error": str(err)}
    print(json.dumps({"path": path, "namespace": review["request"]["namespace"], **answer}), flush=True)
"""


def hami_review(uid: str, namespace: str, memory_mib: int) -> dict[str, Any]:
    """What the API server would send for a pod asking for HAMi resources in ``namespace``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"forged-{uid}", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}},
                }
            ]
        },
    }
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def claim_review(namespace: str, claim_name: str) -> dict[str, Any]:
    """A /mutate review for a pod naming ``claim_name`` of ``namespace``: its answer would say
    whether that claim exists and is ours."""
    review = hami_review("claims", namespace, 1)
    spec = review["request"]["object"]["spec"]
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return review


def forger_pod(image: str, webhook: str, reviews: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forger"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "forger",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", FORGER],
                    "env": [
                        {"name": "WEBHOOK", "value": webhook},
                        {"name": "REVIEWS", "value": json.dumps(reviews)},
                    ],
                }
            ],
        },
    }


def victim_pod(name: str, memory_mib: int) -> dict[str, Any]:
    container = {
        "name": "app",
        "image": "busybox:1.36",
        "command": ["sleep", "86400"],
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": OTHER_NS},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
    }


def hami_templates(tenancy: Tenancy) -> list[str]:
    """Every template /mutate-hami's shapes name, in every namespace (namespace/name)."""
    items = tenancy.cluster.get("resourceclaimtemplates", "-A", "-l", TEMPLATE_LABEL)["items"]
    return sorted(f"{t['metadata']['namespace']}/{t['metadata']['name']}" for t in items)


def webhook_endpoint(tenancy: Tenancy) -> tuple[str, str]:
    """The webhook Service's address (as a tenant would find it: any ClusterIP answers) and the
    driver image the forger runs."""
    cluster = tenancy.cluster
    selector = f"{COMPONENT_LABEL}=webhook"
    (service,) = cluster.get("services", "-n", CHART_NAMESPACE, "-l", selector)["items"]
    port = service["spec"]["ports"][0]["port"]
    (deployment,) = cluster.get("deployments", "-n", CHART_NAMESPACE, "-l", selector)["items"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return f"https://{service['spec']['clusterIP']}:{port}", image


def forge(tenancy: Tenancy, reviews: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run the forger as the tenant; its answers, one per review, in order."""
    webhook, image = webhook_endpoint(tenancy)
    body = json.dumps(forger_pod(image, webhook, reviews))
    tenancy.tenant("apply", "-f", "-", stdin=body)
    wait_for(
        lambda: (
            tenancy.cluster.get("pod", "forger", "-n", TENANT_NS)["status"].get("phase")
            in ("Succeeded", "Failed")
        ),
        POD_TIMEOUT,
        "the forger done",
    )
    logs = tenancy.tenant("logs", "forger")
    tenancy.tenant("delete", "pod", "forger", "--wait=true", "--timeout=60s")
    answers = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert len(answers) == len(reviews), logs
    return answers


def test_a_forged_review_writes_and_reads_nothing_in_any_namespace(tenancy: Tenancy) -> None:
    cluster = tenancy.cluster
    cluster.kubectl("label", "namespace", OTHER_NS, f"{NAMESPACE_LABEL}=enabled", "--overwrite")
    assert hami_templates(tenancy) == []
    reviews = [("/mutate-hami", hami_review(f"forged-{i}", OTHER_NS, 1000 + i)) for i in range(FORGED_SHAPES)]
    # One review, the same but for the namespace it names: an opted-in one, one that did not opt
    # in, one that does not exist. Before, the answers differed (the webhook read the Namespace).
    probes = [("/mutate-hami", hami_review("probe", namespace, 4242))
              for namespace in (OTHER_NS, "kube-system", "no-such-namespace")]  # fmt: skip
    answers = forge(tenancy, reviews + probes)

    translated = answers[:FORGED_SHAPES]
    assert all(a["status"] == 200 and a["body"]["response"]["allowed"] for a in translated), translated
    assert all(a["body"]["response"].get("patch") for a in translated), "the webhook answered every review"
    assert hami_templates(tenancy) == [], "no write: no template in any namespace"
    assert not cluster.get("resourceclaimtemplates", "-n", OTHER_NS)["items"]
    responses = [a["body"]["response"] for a in answers[FORGED_SHAPES:]]
    assert responses[0]["patch"] and responses[1:] == responses[:1] * 2, (
        "no read: the answer does not depend on the namespace the review names"
    )

    # The victim's own HAMi pod of a new shape runs: its template is made for it, from the pod.
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(victim_pod("victim", 3000)))
    tenancy.running(OTHER_NS, "victim")
    stored = cluster.get("pod", "victim", "-n", OTHER_NS)
    template = json.loads(stored["metadata"]["annotations"][TRANSLATED_ANNOTATION])["app"]["template"]
    assert hami_templates(tenancy) == [f"{OTHER_NS}/{template}"]
    made = cluster.get("resourceclaimtemplate", template, "-n", OTHER_NS)
    owner = made["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Pod", stored["metadata"]["uid"])
    tenancy.assert_contained()
    # The template goes with its pod: nothing is left to count against the namespace.
    cluster.kubectl("delete", "pod", "victim", "-n", OTHER_NS, "--wait=true", "--timeout=60s")
    wait_for(lambda: not hami_templates(tenancy), 90, "the victim's template deleted with its pod")
    tenancy.assert_contained()


def test_a_tenant_cannot_have_the_controller_make_templates_where_translation_is_off(
    tenancy: Tenancy,
) -> None:
    """The translation's annotation is only a pod's word: written by hand into a pod of the
    tenant's own namespace (not opted in), it makes nothing; the pod waits, saying why."""
    name = "hami-1gpu-3000mi-0cores-handmade00"
    summary = {"app": {"from": {"nvidia.com/gpumem": "3000"}, "claim": "hami-app", "template": name}}
    body = victim_pod("handmade", 3000)
    body["metadata"] = {"name": "handmade", "annotations": {TRANSLATED_ANNOTATION: json.dumps(summary)}}
    container = body["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "hami-app"}]}
    body["spec"]["resourceClaims"] = [{"name": "hami-app", "resourceClaimTemplateName": name}]
    body["spec"]["schedulingGates"] = [{"name": "gpu.hami.io/allocation"}]
    tenancy.tenant("apply", "-f", "-", stdin=json.dumps(body))
    tenancy.described(TENANT_NS, "handmade", "has not opted in to HAMi resource translation")
    assert hami_templates(tenancy) == []
    assert tenancy.gated(TENANT_NS, "handmade")
    tenancy.tenant("delete", "pod", "handmade", "--wait=true", "--timeout=60s")
    tenancy.assert_contained()


def webhook_pods_verify_clients(driver: ChartDriver) -> bool:
    """Every webhook pod left runs with the client CA (none of the previous ones is still serving)."""
    pods = driver.pods("webhook")
    return bool(pods) and all(
        not pod["metadata"].get("deletionTimestamp")
        and any(arg.startswith("--client-ca-file=") for arg in pod["spec"]["containers"][0]["args"])
        for pod in pods
    )


def test_with_client_auth_a_forged_review_gets_no_answer_and_the_api_servers_still_do(
    tenancy: Tenancy, driver: DriverUnderTest
) -> None:
    assert isinstance(driver, ChartDriver)
    cluster = tenancy.cluster
    cluster.kubectl("label", "namespace", OTHER_NS, f"{NAMESPACE_LABEL}=enabled", "--overwrite")
    cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=json.dumps(claim("victims-claim", "1Gi")))
    ca = base64.b64encode(Layout(cluster.state_dir).pki.joinpath("ca.crt").read_bytes()).decode()
    driver.upgrade(
        "webhook.clientAuth.enabled=true",
        f"webhook.clientAuth.caBundle={ca}",
        f"webhook.clientAuth.names[0]={WEBHOOK_CLIENT_NAME}",
    )
    try:
        wait_for(lambda: webhook_pods_verify_clients(driver), 120, "the webhook verifying its clients")
        answers = forge(
            tenancy,
            [("/mutate", claim_review(OTHER_NS, "victims-claim")),
             ("/mutate-hami", hami_review("forged", OTHER_NS, 1000))],
        )  # fmt: skip
        for answer in answers:
            assert answer["status"] == 403 and "present its client certificate" in answer["error"], answer
        # The API server's own reviews carry its certificate: the victim's HAMi pod is translated,
        # gated and placed as before.
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(victim_pod("victim", 2000)))
        tenancy.running(OTHER_NS, "victim")
        assert hami_templates(tenancy), "translated by the webhook, its template made by the controller"
        tenancy.assert_contained()
        cluster.kubectl("delete", "pod", "victim", "-n", OTHER_NS, "--wait=true", "--timeout=60s")
    finally:
        driver.upgrade()  # back to values-local.yaml, which the other modules use
        cluster.kubectl("delete", "resourceclaim", "victims-claim", "-n", OTHER_NS, "--ignore-not-found")
