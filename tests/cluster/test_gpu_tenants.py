"""Attacks of an untrusted tenant, through real kubectl, against the chart-installed driver.

The tenant (tests/cluster/tenancy.py) is a ServiceAccount holding only a namespace Role,
impersonated with ``kubectl --as``. Each attack is refused or contained; after each, no card is
over its capacity and no namespace over its GpuQuota. A stolen controller token is tried the same
way. Attacks of later rounds have modules of their own (test_tenant_*.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.drivers import DRIVER
from tests.cluster.tenancy import (
    COSTLY_SELECTOR,
    OTHER_NS,
    TAINT,
    TENANT_NS,
    Tenancy,
    claim,
    manifest,
    pod,
    unconditional,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]


def test_a_tenant_cannot_lift_our_gate_to_escape_its_quota(tenancy: Tenancy) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("big", "14Gi"), pod("big", "big")))
    tenancy.described(TENANT_NS, "big", "GpuQuotaExceeded")
    out = tenancy.refused(
        "-n", TENANT_NS, "patch", "pod", "big", "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )  # fmt: skip
    assert f"only the {DRIVER} controller may remove the scheduling gate {DRIVER}/allocation" in out
    assert tenancy.gated(TENANT_NS, "big")
    tenancy.assert_contained()
    tenancy.tenant("delete", "pod", "big", "--wait=true", "--timeout=60s")


@pytest.mark.parametrize(
    ("what", "body", "message"),
    [
        (
            "a claim tolerating the policy taint",
            claim(
                "tolerant", "1Gi", tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
            ),
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a claim tolerating every taint",
            claim("everything", "1Gi", tolerations=[{"operator": "Exists"}]),
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a template tolerating every taint",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "everything"},
                "spec": {"spec": claim("x", "1Gi", tolerations=[{"operator": "Exists"}])["spec"]},
            },
            f"may not tolerate the taint {TAINT}",
        ),
        (
            "a claim asking for ten slots",
            claim("slots", "1Mi", capacity={"requests": {"memory": "1Mi", "slots": "10"}}),
            "may not ask for slots",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value else "",
)
def test_claims_that_would_bypass_the_controller_are_refused(
    tenancy: Tenancy, what: str, body: dict[str, Any], message: str
) -> None:
    out = tenancy.refused("-n", TENANT_NS, "create", "-f", "-", stdin=json.dumps(body))
    assert message in out, what


def test_a_running_claims_share_survives_its_tenant(tenancy: Tenancy) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("holder", "10Gi"), pod("holder", "holder")))
    tenancy.running(TENANT_NS, "holder")
    out = tenancy.refused(
        "-n", TENANT_NS, "patch", "resourceclaim", "holder", "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )  # fmt: skip
    assert f"the finalizer {DRIVER}/allocation keeps an allocated claim's GPU share booked" in out
    # Deleting it is allowed, and changes nothing while the pod runs: the share stays booked.
    tenancy.tenant("delete", "resourceclaim", "holder", "--wait=false")
    held = tenancy.cluster.get("resourceclaim", "holder", "-n", TENANT_NS)
    assert held["metadata"].get("deletionTimestamp") and held["status"].get("allocation")
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("more", "4Gi"), pod("more", "more")))
    tenancy.described(TENANT_NS, "more", "GpuQuotaExceeded")  # 10Gi still counted: 10 + 4 > 12
    tenancy.assert_contained()
    # The pod ends: the claim goes, and its share with it.
    tenancy.tenant("delete", "pod", "holder", "--wait=true", "--timeout=60s")
    wait_for(
        lambda: (
            not tenancy.cluster.get(
                "resourceclaims", "-n", TENANT_NS, "--field-selector", "metadata.name=holder"
            )["items"]
        ),
        60,
        "the deleted claim released once its pod ended",
    )
    tenancy.running(TENANT_NS, "more")
    tenancy.assert_contained()
    tenancy.tenant("delete", "pod", "more", "--wait=true", "--timeout=60s")


def test_poison_input_leaves_every_other_pod_placeable(tenancy: Tenancy) -> None:
    weights = {"hami.io/device-scoring-weights": f"slot=1{'0' * 400},core=1,memory=1"}
    poison = claim("poison", "1Gi", selectors=[{"cel": {"expression": COSTLY_SELECTOR}}])
    tenancy.tenant(
        "apply", "-f", "-",
        stdin=manifest(
            poison, pod("poison", "poison"), claim("weights", "1Gi"), pod("weights", "weights", weights)
        ),
    )  # fmt: skip
    others = [claim(f"good-{index}", "1Gi") for index in range(3)]
    pods = [pod(f"good-{index}", f"good-{index}") for index in range(3)]
    tenancy.cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(*others, *pods))
    tenancy.running(OTHER_NS, "good-0", "good-1", "good-2")
    # An out-of-range weight is ignored with a warning, like any invalid HAMi annotation.
    tenancy.running(TENANT_NS, "weights")
    tenancy.described(TENANT_NS, "weights", "must be at most 1000000")
    # A selector over the CEL budget is that claim's error, as kube-scheduler reports it.
    tenancy.described(TENANT_NS, "poison", "CEL runtime error: Iteration budget exceeded")
    assert tenancy.gated(TENANT_NS, "poison")
    tenancy.assert_contained()


def test_a_stolen_controller_token_cannot_rewrite_pods_or_foreign_claims(tenancy: Tenancy) -> None:
    cluster, controller = tenancy.cluster, tenancy.controller_user
    cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(pod("bystander", None)))
    # The controller writes pods with patches (its gate, annotations, condition): any other change
    # a patch of its makes is refused by the controller-pods policy.
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example.com/evil:1"}]
    out = tenancy.refused(
        "-n", OTHER_NS, "patch", "pod", "bystander", "--type=json", "-p", json.dumps(image), user=controller
    )
    assert "the controller may not change a pod's containers, images" in out
    label = {"metadata": {"labels": {"owned": "yes"}}}
    out = tenancy.refused(
        "-n", OTHER_NS, "patch", "pod", "bystander", "--type=merge", "-p", json.dumps(label), user=controller
    )
    assert "may change only the annotations" in out
    # RBAC: the controller never sends a pod back whole, so it may not.
    bystander = unconditional(cluster.get("pod", "bystander", "-n", OTHER_NS))
    out = tenancy.refused("-n", OTHER_NS, "replace", "-f", "-", stdin=json.dumps(bystander), user=controller)
    assert "forbidden" in out.lower()
    assert cluster.kubectl(
        "auth", "can-i", "update", "pods", "-n", "kube-system", "--as", controller, check=False
    ).startswith("no")
    # The status of a claim it does not allocate (here: results of another driver).
    cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(claim("foreign", "1Gi")))
    foreign = unconditional(cluster.get("resourceclaim", "foreign", "-n", OTHER_NS))
    foreign["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-0"}]
            }
        }
    }
    out = tenancy.refused(
        "-n",
        OTHER_NS,
        "replace",
        "--subresource=status",
        "-f",
        "-",
        stdin=json.dumps(foreign),
        user=controller,
    )
    assert "the controller may write the status only of claims it allocates" in out
    assert not cluster.get("resourceclaim", "foreign", "-n", OTHER_NS).get("status", {}).get("allocation")
