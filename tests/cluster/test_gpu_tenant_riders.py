"""Riders and version holes (issue 34), attacked as a tenant through real kubectl.

A rider is a pod created with ``spec.nodeName`` (no scheduler, no gate) that names a running pod's
claim: kube-controller-manager reserves the claim for it and the kubelet, finding the claim
prepared, runs it without asking our plugin. Before the fix three riders ran beside the holder of
a 6Gi share, each container limited to 6Gi by HAMi-core: 24Gi used against 6Gi booked. Now the
webhook refuses them, the ``bound-pods`` policy refuses them while the webhook is down, and the
``claim-reservations`` policy keeps a limited claim reserved for one pod, whoever writes it, also
for a rider created before its claim. A whole-card claim is shared as Kubernetes shares claims.

The version holes: a v1beta1 claim reached the v1-shaped policy expressions unconverted; a claim
swapped in after its pod was admitted ungated (no device taints: 1.34/1.35, or the taint off) was
allocated first-fit by kube-scheduler past the quota. See docs/multi-tenant.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hami_dra_dev.cluster.layout import NODE_NAME
from tests.cluster.drivers import CHART_NAMESPACE, COMPONENT_LABEL, DRIVER, ChartDriver
from tests.cluster.tenancy import (
    CLASS,
    OTHER_NS,
    TENANT_NS,
    Tenancy,
    claim,
    manifest,
    pod,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

WEBHOOK_REFUSAL = "of a hami-dra DeviceClass"  # dra_driver/webhook/admission.py bound_pod_refusal
POLICY_REFUSAL = f"of a {DRIVER} DeviceClass: such claims are allocated and shared only by"
RESERVATION_REFUSAL = "may not reserve it for a further pod"
OTHER_CLASS = "other.example.com"


def rider(name: str, claim_name: str) -> dict[str, Any]:
    """A pod bound to the node at creation, naming ``claim_name``."""
    body = pod(name, claim_name)
    body["spec"]["nodeName"] = NODE_NAME
    return body


def reserved_for(tenancy: Tenancy, namespace: str, claim_name: str) -> list[str]:
    claim_now = tenancy.cluster.get("resourceclaim", claim_name, "-n", namespace)
    return [entry["name"] for entry in (claim_now.get("status") or {}).get("reservedFor") or ()]


def absent(tenancy: Tenancy, namespace: str, pod_name: str) -> bool:
    pods = tenancy.cluster.get("pods", "-n", namespace, "--field-selector", f"metadata.name={pod_name}")
    return not pods["items"]


def cleanup(tenancy: Tenancy, namespace: str, *pods: str) -> None:
    for name in pods:
        tenancy.cluster.kubectl(
            "delete", "pod", name, "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=90s"
        )


@pytest.fixture
def webhook_down(tenancy: Tenancy) -> Iterator[None]:
    """The webhook scaled to zero and its pod configuration set to Ignore (what
    ``webhook.failurePolicy=Ignore`` does during an outage); restored afterwards."""
    cluster = tenancy.cluster
    (deployment,) = cluster.get("deployments", "-n", CHART_NAMESPACE, "-l", f"{COMPONENT_LABEL}=webhook")[
        "items"
    ]
    name, replicas = deployment["metadata"]["name"], deployment["spec"]["replicas"]
    (config,) = cluster.get("mutatingwebhookconfigurations", "-l", f"{COMPONENT_LABEL}=webhook")["items"]
    index = next(i for i, hook in enumerate(config["webhooks"]) if hook["name"] == f"pods.{DRIVER}")
    policy = config["webhooks"][index]["failurePolicy"]

    def set_policy(value: str) -> None:
        patch = [{"op": "replace", "path": f"/webhooks/{index}/failurePolicy", "value": value}]
        cluster.kubectl(
            "patch",
            "mutatingwebhookconfiguration",
            config["metadata"]["name"],
            "--type=json",
            "-p",
            json.dumps(patch),
        )

    set_policy("Ignore")
    cluster.kubectl("scale", "deployment", name, "-n", CHART_NAMESPACE, "--replicas=0")
    wait_for(
        lambda: not cluster.get("pods", "-n", CHART_NAMESPACE, "-l", f"{COMPONENT_LABEL}=webhook")["items"],
        90,
        "no webhook pod left",
    )
    try:
        yield
    finally:
        cluster.kubectl("scale", "deployment", name, "-n", CHART_NAMESPACE, f"--replicas={replicas}")
        cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", CHART_NAMESPACE, "--timeout=180s")
        set_policy(policy)


def test_a_rider_on_a_running_share_is_refused(tenancy: Tenancy) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("held", "6Gi"), pod("holder", "held")))
    tenancy.running(TENANT_NS, "holder")
    for index in range(3):
        out = tenancy.refused(
            "-n", TENANT_NS, "create", "-f", "-", stdin=json.dumps(rider(f"rider-{index}", "held"))
        )
        assert WEBHOOK_REFUSAL in out and "leave spec.nodeName out" in out, out
        assert absent(tenancy, TENANT_NS, f"rider-{index}")
    assert reserved_for(tenancy, TENANT_NS, "held") == ["holder"]
    tenancy.assert_contained()


def test_a_rider_is_refused_by_the_api_server_while_the_webhook_is_down(
    tenancy: Tenancy, webhook_down: None
) -> None:
    # The holder of the previous test still runs on its 6Gi share.
    out = tenancy.refused("-n", TENANT_NS, "create", "-f", "-", stdin=json.dumps(rider("rider-down", "held")))
    assert POLICY_REFUSAL in out and "uses ResourceClaim held" in out, out
    assert absent(tenancy, TENANT_NS, "rider-down")
    assert reserved_for(tenancy, TENANT_NS, "held") == ["holder"]
    tenancy.assert_contained()


def test_a_rider_created_before_its_claim_never_shares_it(tenancy: Tenancy) -> None:
    """Neither the webhook nor a policy can tell the class of a claim that does not exist yet; the
    rider is admitted, then kube-controller-manager's reservation of the share for it is refused."""
    created = tenancy.tenant("create", "-f", "-", stdin=json.dumps(rider("early-rider", "later")))
    assert "created" in created
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("later", "4Gi"), pod("later-holder", "later")))
    tenancy.running(TENANT_NS, "later-holder")
    kcm = "kube-controller-manager"
    wait_for(
        lambda: RESERVATION_REFUSAL in tenancy.cluster.log(kcm),
        90,
        f"{kcm} refused reserving the share for the rider",
    )
    assert reserved_for(tenancy, TENANT_NS, "later") == ["later-holder"]
    early = tenancy.cluster.get("pod", "early-rider", "-n", TENANT_NS)
    assert early["status"].get("phase") == "Pending", early["status"]
    tenancy.assert_contained()
    cleanup(tenancy, TENANT_NS, "early-rider", "later-holder", "holder")


def test_a_whole_card_claim_is_shared_by_the_pods_of_its_namespace(tenancy: Tenancy) -> None:
    """Allowed, as Kubernetes allows it: the card is booked whole for the claim (nobody else gets
    any of it) and charged once to the namespace, and no HAMi-core limit is multiplied."""
    cluster = tenancy.cluster
    whole = claim("whole", "1Gi")
    del whole["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    cluster.kubectl(
        "apply",
        "-n",
        OTHER_NS,
        "-f",
        "-",
        stdin=manifest(whole, pod("whole-a", "whole"), pod("whole-b", "whole")),
    )
    tenancy.running(OTHER_NS, "whole-a", "whole-b")
    assert sorted(reserved_for(tenancy, OTHER_NS, "whole")) == ["whole-a", "whole-b"]
    # Bound past the controller is refused for every claim of ours, whole cards included.
    out = cluster.kubectl(
        "create", "-n", OTHER_NS, "-f", "-", stdin=json.dumps(rider("whole-rider", "whole")), check=False
    )
    assert WEBHOOK_REFUSAL in out and absent(tenancy, OTHER_NS, "whole-rider"), out
    tenancy.assert_contained()
    cleanup(tenancy, OTHER_NS, "whole-a", "whole-b")


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_older_shapes_of_a_bypassing_claim_are_refused_where_served(tenancy: Tenancy, version: str) -> None:
    served = tenancy.cluster.kubectl("api-versions").split()
    request: dict[str, Any] = {"name": "gpu"}
    body = {"deviceClassName": CLASS, "tolerations": [{"operator": "Exists"}]}
    if version == "v1beta1":
        request.update(body)  # v1beta1: the request itself names the class
    else:
        request["exactly"] = body
    obj = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": f"tolerant-{version}"},
        "spec": {"devices": {"requests": [request]}},
    }
    out = tenancy.tenant("create", "-f", "-", stdin=json.dumps(obj), check=False)
    assert "created" not in out, out
    if f"resource.k8s.io/{version}" in served:
        assert "may not tolerate the taint" in out, out
    else:
        assert f'no matches for kind "ResourceClaim" in version "resource.k8s.io/{version}"' in out, out


def test_our_class_as_an_extended_resource_is_refused(tenancy: Tenancy) -> None:
    asking = pod("extended", None)
    asking["spec"]["containers"][0]["resources"] = {
        "limits": {f"deviceclass.resource.kubernetes.io/{CLASS}": "1"}
    }
    out = tenancy.tenant("create", "-f", "-", stdin=json.dumps(asking), check=False)
    assert "created" not in out, out
    # Our policy's words where the API server accepts the name (DRAExtendedResource on), else
    # the API's own validation refuses the resource name first.
    assert "use a ResourceClaim or a ResourceClaimTemplate" in out or "Invalid value" in out, out
    assert absent(tenancy, TENANT_NS, "extended")


@pytest.fixture
def untainted(tenancy: Tenancy, driver: ChartDriver) -> Iterator[None]:
    """GPUs published without the policy taint: what kube-scheduler sees on 1.34/1.35 without
    device taints. Another driver's class, for the claim the pod is admitted with."""
    cluster = tenancy.cluster
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": OTHER_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{OTHER_CLASS}"'}}]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(other))
    driver.upgrade("kubeletPlugin.policyTaint=false")

    def taints() -> list[Any]:
        slices = cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
        return [t for s in slices for d in s["spec"].get("devices") or () for t in d.get("taints") or ()]

    wait_for(lambda: not taints(), 120, "the GPUs published without taints")
    try:
        yield
    finally:
        cleanup(tenancy, TENANT_NS, "swapper")
        cluster.kubectl("delete", "deviceclass", OTHER_CLASS, "--ignore-not-found")
        driver.upgrade()
        wait_for(taints, 120, "the GPUs tainted again")


def test_a_claim_swapped_in_after_admission_is_not_allocated_first_fit(
    tenancy: Tenancy, untainted: None
) -> None:
    """The pod is admitted ungated (its claim is another driver's), then the claim is replaced by
    one of ours over the quota. kube-scheduler sees untainted GPUs, but the scheduler fence on
    our classes leaves its first fit nothing; our controller plans the ungated pod like a gated
    one, within the quota (here: it waits with GpuQuotaExceeded)."""
    other = claim("swapped", "14Gi")
    other["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": OTHER_CLASS}
    tenancy.tenant("apply", "-f", "-", stdin=manifest(other, pod("swapper", "swapped")))
    assert not tenancy.gated(TENANT_NS, "swapper")
    tenancy.tenant("delete", "resourceclaim", "swapped", "--wait=true", "--timeout=60s")
    tenancy.tenant("create", "-f", "-", stdin=json.dumps(claim("swapped", "14Gi")))
    try:
        tenancy.described(TENANT_NS, "swapper", "GpuQuotaExceeded")  # the controller planned it
    except AssertionError as err:
        cluster = tenancy.cluster
        state = cluster.kubectl("get", "resourceclaim", "swapped", "-n", TENANT_NS, "-o", "yaml", check=False)
        described = cluster.kubectl("describe", "pod", "swapper", "-n", TENANT_NS, check=False)
        raise AssertionError(
            f"{err}\n{state}\n{described}\n{cluster.driver_log('controller')[-3000:]}"
        ) from err
    tenancy.described(TENANT_NS, "swapper", "FailedScheduling")  # kube-scheduler found nothing
    swapped = tenancy.cluster.get("resourceclaim", "swapped", "-n", TENANT_NS)
    assert not (swapped.get("status") or {}).get("allocation"), swapped["status"]
    assert not tenancy.cluster.get("pod", "swapper", "-n", TENANT_NS)["spec"].get("nodeName")
    tenancy.assert_contained()
