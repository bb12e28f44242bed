"""The driver end to end on real upstream Kubernetes (``hami-dra cluster up``; see conftest.py),
once as host processes and once installed by its Helm chart (the ``driver`` fixture).

Real kube-apiserver validates our ResourceSlice and allocations, real kube-scheduler binds the pods
our controller placed, the real kubelet calls our NodePrepareResources/NodeUnprepareResources over
its plugin registry, and containerd injects our CDI spec into the container.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.quantity import parse_quantity
from hami_dra_dev.cluster.layout import CDI_DIR, NODE_NAME
from hami_dra_dev.demo import manifests
from hami_dra_dev.demo.manifests import DemoPod
from tests.cluster.conftest import NAMESPACE, RealCluster
from tests.cluster.drivers import DriverUnderTest
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

DRIVER = manifests.DRIVER
#: What a simulated T4 publishes: nvidia-smi's 15360 MiB total minus 393 MiB reserved.
T4_MEMORY = (15360 - 393) * 2**20
POD_TIMEOUT = 90.0
TAINT_KEY = "gpu.hami.io/policy-managed"


def apply(cluster: RealCluster, *objects: dict[str, Any]) -> None:
    """``kubectl apply`` of one ``v1 List``, as users apply multi-object manifests."""
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


def wait_running(cluster: RealCluster, name: str) -> dict[str, Any]:
    cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={POD_TIMEOUT:.0f}s")
    pod: dict[str, Any] = cluster.get("pod", name)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] == NODE_NAME
    return pod


def claim_of(cluster: RealCluster, pod_name: str) -> dict[str, Any]:
    def named() -> str | None:
        statuses = cluster.get("pod", pod_name).get("status", {}).get("resourceClaimStatuses") or []
        return statuses[0].get("resourceClaimName") if statuses else None

    claim: dict[str, Any] = cluster.get("resourceclaim", wait_for(named, 30, f"claim of {pod_name}"))
    return claim


def device_of(claim: dict[str, Any]) -> str | None:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return str(results[0]["device"]) if results else None


def pod_events(cluster: RealCluster, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("events", "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    return items


def memory_per_device(cluster: RealCluster) -> dict[str, int]:
    """Consumed memory of every allocated claim of our driver, whoever allocated it, per device."""
    used: dict[str, int] = {}
    for claim in cluster.get("resourceclaims", "-A")["items"]:
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []:
            if result["driver"] != DRIVER:
                continue
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            amount = int(parse_quantity(consumed)) if consumed else T4_MEMORY
            used[result["device"]] = used.get(result["device"], 0) + amount
    return used


def assert_no_overcommit(cluster: RealCluster) -> None:
    used = memory_per_device(cluster)
    assert all(total <= T4_MEMORY for total in used.values()), f"GPU memory overcommitted: {used}"


def checkpoint_claims(cluster: RealCluster) -> dict[str, Any]:
    path = cluster.state_dir / "kubelet" / "plugins" / DRIVER / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text()).get("claims") or {}
    return claims


def cdi_spec(uid: str) -> Path:
    return CDI_DIR / CdiNames(DRIVER).spec_file_name(uid)


def recipe_classes(driver: DriverUnderTest, *recipes: str) -> list[dict[str, Any]]:
    """The seed's DeviceClasses, unless the driver installed them (the chart's recipe classes)."""
    return [] if driver.provides_recipe_classes else [manifests.device_class(r) for r in recipes]


@pytest.fixture
def lab(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[RealCluster]:
    """The seed's classes and templates; afterwards every pod is deleted and must leave nothing."""
    recipes = list(manifests.CLASS_POLICIES)
    apply(
        real_cluster,
        *recipe_classes(driver, *recipes),
        *(manifests.claim_template(r) for r in recipes),
    )
    yield real_cluster
    real_cluster.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=90s")
    wait_for(lambda: not real_cluster.get("resourceclaims")["items"], 60, "claims deleted with their pods")


def place(cluster: RealCluster, demo_pod: DemoPod) -> dict[str, Any]:
    apply(cluster, manifests.pod(demo_pod))
    wait_running(cluster, demo_pod.name)
    claim = claim_of(cluster, demo_pod.name)
    assert device_of(claim) == demo_pod.expected_device, demo_pod.why
    return claim


def decision_scores(cluster: RealCluster, pod: str) -> dict[str, str]:
    """The controller's per-card scores for ``pod`` from its decision log line."""
    lines = [
        line for line in cluster.driver_log("controller").splitlines() if f"pod {NAMESPACE}/{pod} " in line
    ]
    assert lines, f"no decision logged for {pod}"
    scores = lines[-1].split("scores: ", 1)[1]
    return dict(re.findall(rf"{NODE_NAME}/(gpu-\d+)=(\d+\.\d+)", scores))


def explained(cluster: RealCluster, pod: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``hami-dra explain pod/NAME -o json`` against the real cluster, as a user runs it."""
    from dra_driver.cli import main

    capsys.readouterr()
    assert (
        main(
            ["explain", f"pod/{pod}", "-n", NAMESPACE, "--kubeconfig", str(cluster.kubeconfig), "-o", "json"]
        )
        == 0
    )
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_resourceslice_lists_the_four_gpus(real_cluster: RealCluster, driver: DriverUnderTest) -> None:
    table = real_cluster.kubectl("get", "resourceslices")
    assert NODE_NAME in table and DRIVER in table
    slices = [s for s in real_cluster.get("resourceslices")["items"] if s["spec"]["nodeName"] == NODE_NAME]
    assert len(slices) == 1
    devices = slices[0]["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert {d["attributes"]["productName"]["string"] for d in devices} == {"Tesla T4"}
    assert {d["capacity"]["memory"]["value"] for d in devices} == {"14967Mi"}  # total minus reserved
    node = real_cluster.get("node", NODE_NAME)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_seed_lab_places_mutex_binpack_on_gpu_2_and_runs_it(
    lab: RealCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    for tenant in manifests.TENANTS:
        place(lab, tenant)
    # What if: `simulate --from-cluster` places the latency claim on a snapshot of this cluster
    # exactly as the controller then does (gpu-2, the same four scores).
    from dra_driver.cli import main

    claims = lab.state_dir / "what-if.yaml"
    claims.write_text("- {name: latency-tier, policy: 'mutex,binpack', memory: 1000Mi}\n")
    capsys.readouterr()
    what_if = ["simulate", "--from-cluster", "--kubeconfig", str(lab.kubeconfig), "--claims", str(claims)]
    assert main([*what_if, "-o", "json"]) == 0
    (simulated,) = json.loads(capsys.readouterr().out)["results"]
    assert [d["index"] for d in simulated["devices"]] == [2]
    snapshot_scores = [c["score"] for c in simulated["candidates"] if c["node"] == NODE_NAME]
    assert snapshot_scores == list(manifests.EXPECTED_SCORES)
    latency = place(lab, manifests.LATENCY)
    scores = decision_scores(lab, manifests.LATENCY.name)
    expected = dict(zip(("gpu-0", "gpu-1", "gpu-2", "gpu-3"), manifests.EXPECTED_SCORES, strict=True))
    assert {card: float(value) for card, value in scores.items()} == expected
    # The same four scores, recorded on the pod when it was placed, through `hami-dra explain`.
    (request,) = explained(lab, manifests.LATENCY.name, capsys)["requests"]
    assert request["devices"] == ["gpu-2"] and request["config"].startswith("policy=mutex,binpack")
    recorded = {card["device"].split("/")[-1]: card["score"] for card in request["cards"]}
    assert recorded == expected
    # `hami-dra top` names the latency pod among gpu-2's tenants.
    from dra_driver.cli import main

    capsys.readouterr()
    assert main(["top", "-A", "--kubeconfig", str(lab.kubeconfig), "-o", "json"]) == 0
    top = json.loads(capsys.readouterr().out)
    (node,) = [n for n in top["nodes"] if n["name"] == NODE_NAME]
    gpu2 = next(d for d in node["devices"] if d["device"] == "gpu-2")
    assert any(manifests.LATENCY.name in tenant["pods"] for tenant in gpu2["tenants"]), gpu2
    logs = lab.kubectl("logs", manifests.LATENCY.name)
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=1000m" in logs.splitlines()
    assert cdi_spec(latency["metadata"]["uid"]).is_file()
    assert_no_overcommit(lab)


def test_mutex_pod_waits_for_an_idle_card(lab: RealCluster, capsys: pytest.CaptureFixture[str]) -> None:
    for tenant in (*manifests.TENANTS, manifests.LATENCY, manifests.FILLER):
        place(lab, tenant)
    apply(lab, manifests.pod(manifests.EXCLUSIVE))

    def described() -> str | None:
        text = lab.kubectl("describe", "pod", manifests.EXCLUSIVE.name)
        return text if "4/4 ExclusiveDeviceAllocateConflict" in text else None

    wait_for(described, 60, "the mutex pod's ExclusiveDeviceAllocateConflict")
    why = explained(lab, manifests.EXCLUSIVE.name, capsys)
    assert why["state"] == "pending" and why["pending"]["message"]
    assert [(r["reason"], r["cards"]) for r in why["reasonsNow"]] == [("ExclusiveDeviceAllocateConflict", 4)]
    pod = lab.get("pod", manifests.EXCLUSIVE.name)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    lab.kubectl("delete", "pod", manifests.FILLER.name, "--wait=true", "--timeout=60s")
    wait_running(lab, manifests.EXCLUSIVE.name)
    assert device_of(claim_of(lab, manifests.EXCLUSIVE.name)) == "gpu-3"


def test_deleting_pods_unprepares_and_leaves_nothing(
    real_cluster: RealCluster, driver: DriverUnderTest
) -> None:
    recipe = "binpack"
    apply(real_cluster, *recipe_classes(driver, recipe), manifests.claim_template(recipe))
    pods = [DemoPod(f"short-lived-{i}", recipe, "gpu-0", "binpack stacks") for i in range(2)]
    uids = [place(real_cluster, pod)["metadata"]["uid"] for pod in pods]
    assert all(cdi_spec(uid).is_file() for uid in uids)
    assert set(uids) <= set(checkpoint_claims(real_cluster))
    real_cluster.kubectl("delete", "pods", "--all", "--wait=true", "--timeout=90s")
    wait_for(lambda: not real_cluster.get("resourceclaims")["items"], 60, "claims deleted")
    wait_for(lambda: not any(cdi_spec(uid).exists() for uid in uids), 30, "CDI specs removed")
    assert not set(uids) & set(checkpoint_claims(real_cluster))
    plugin_log = real_cluster.driver_log("kubelet-plugin")
    for uid in uids:
        assert f"NodeUnprepareResources claim {uid}: unprepared" in plugin_log


def first_fit_class(name: str) -> dict[str, Any]:
    """A class the webhook does not know as ours (no driver pin): kube-scheduler allocates its claims."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].productName == "Tesla T4"'}}]
        },
    }


def first_fit_template(name: str, memory: str, tolerate: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": "first-fit-t4",
        "count": 1,
        "capacity": {"requests": {"memory": memory}},
    }
    if tolerate:
        exactly["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def plain_pod(name: str, template: str) -> dict[str, Any]:
    body = manifests.pod(DemoPod(name, "binpack", "", ""))
    body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    return body


def wait_unschedulable(cluster: RealCluster, name: str) -> str:
    def message() -> str | None:
        failed = [e["message"] for e in pod_events(cluster, name) if e["reason"] == "FailedScheduling"]
        return failed[-1] if failed else None

    text: str = wait_for(message, 60, f"kube-scheduler's FailedScheduling for {name}")
    assert not cluster.get("pod", name)["spec"].get("nodeName")
    return text


def test_scheduler_allocated_claims_and_ours_count_each_other(lab: RealCluster) -> None:
    apply(
        lab,
        first_fit_class("first-fit-t4"),
        first_fit_template("untolerated-1000mi", "1000Mi", tolerate=False),
        first_fit_template("tolerated-14500mi", "14500Mi", tolerate=True),
        first_fit_template("tolerated-1000mi", "1000Mi", tolerate=True),
    )
    # Without a toleration the policy-managed taint keeps kube-scheduler off our GPUs entirely.
    apply(lab, plain_pod("untolerated", "untolerated-1000mi"))
    wait_unschedulable(lab, "untolerated")
    assert device_of(claim_of(lab, "untolerated")) is None
    lab.kubectl("delete", "pod", "untolerated", "--wait=true", "--timeout=60s")

    # A claim that tolerates the taint is allocated by kube-scheduler itself, first fit.
    apply(lab, plain_pod("first-fit", "tolerated-14500mi"))
    wait_running(lab, "first-fit")
    first_fit_claim = claim_of(lab, "first-fit")
    taken = device_of(first_fit_claim)
    assert taken is not None
    assert (
        first_fit_claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"]
        == "14500Mi"
    )

    # Our controller counts it: a binpack pod would pick the busiest card, but that one is full.
    binpack = DemoPod("binpack-after-first-fit", "binpack", "", "")
    apply(lab, manifests.pod(binpack))
    wait_running(lab, binpack.name)
    ours = device_of(claim_of(lab, binpack.name))
    assert ours is not None and ours != taken
    assert float(decision_scores(lab, binpack.name)[taken]) > 0

    # kube-scheduler counts ours: fill every other card, then a 1000Mi first-fit claim fits nowhere.
    fillers = []
    for index in range(4):
        card = f"gpu-{index}"
        if card in (taken, ours):
            continue
        name = f"big-{index}"
        template = manifests.claim_template("binpack")
        template["metadata"]["name"] = f"binpack-14500mi-{index}"
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = (
            "14500Mi"
        )
        body = manifests.pod(DemoPod(name, "binpack", card, ""))
        body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template["metadata"]["name"]
        apply(lab, template, body)
        wait_running(lab, name)
        fillers.append(device_of(claim_of(lab, name)))
    template = manifests.claim_template("binpack")
    template["metadata"]["name"] = "binpack-13500mi"
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = (
        "13500Mi"
    )
    body = manifests.pod(DemoPod("big-ours", "binpack", "", ""))
    body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "binpack-13500mi"
    apply(lab, template, body)
    wait_running(lab, "big-ours")
    assert device_of(claim_of(lab, "big-ours")) == ours
    assert sorted([taken, ours, *fillers]) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    apply(lab, plain_pod("first-fit-too-late", "tolerated-1000mi"))
    wait_unschedulable(lab, "first-fit-too-late")
    assert device_of(claim_of(lab, "first-fit-too-late")) is None
    assert_no_overcommit(lab)


def test_pod_the_scheduler_rejects_after_our_allocation(lab: RealCluster) -> None:
    """Our controller does not evaluate pod anti-affinity; kube-scheduler then refuses the node.

    On a single node the allocation's node selector still matches, so the real scheduler's
    PostFilter does not clear it (it clears only claims unavailable on the node): the pod stays
    Pending with its GPU share held, and runs once the conflicting pod is gone.
    """
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker", "namespace": NAMESPACE, "labels": {"app": "blocker"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": "busybox:1.36", "command": ["sleep", "86400"]}],
        },
    }
    apply(lab, blocker)
    wait_running(lab, "blocker")
    picky = manifests.pod(DemoPod("picky", "binpack", "gpu-0", ""))
    picky["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "blocker"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    apply(lab, picky)
    message = wait_unschedulable(lab, "picky")
    assert "anti-affinity" in message
    claim = claim_of(lab, "picky")
    assert device_of(claim) == "gpu-0", "the allocation is kept while the pod waits"
    lab.kubectl("delete", "pod", "blocker", "--wait=true", "--timeout=60s")
    wait_running(lab, "picky")
    assert claim_of(lab, "picky")["metadata"]["uid"] == claim["metadata"]["uid"]
    assert device_of(claim_of(lab, "picky")) == "gpu-0"
