"""Unit tests of the controller's pure parts: node fit, requests, planning modes, allocation shape."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import generate_latest

from dra_driver.config import ControllerDefaults
from dra_driver.contract import DeviceId
from dra_driver.controller.allocation import build_allocation, node_selector, pinned_node
from dra_driver.controller.inventory import build_inventory, nvlink_pair_scores
from dra_driver.controller.ledger import Ledger, Use
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.objects import ClaimView, PodView
from dra_driver.controller.planner import PlanInput, Planner
from dra_driver.controller.pods import NodeView, node_fit_problem, pod_claim_names, pod_requests
from dra_driver.controller.reconciler import format_decision
from dra_driver.controller.requests import Matcher, RequestError, claim_requests
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import DeviceShare, Placement
from dra_driver.kubeletplugin.slices import build_resource_slices

DRIVER = "gpu.hami.io"
CFG = {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig"}
CLASS = {
    "metadata": {"name": DRIVER},
    "spec": {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.hami.io"'}}],
        "config": [{"opaque": {"driver": DRIVER, "parameters": {**CFG, "policy": "binpack"}}}],
    },
}
CLASSES = {DRIVER: CLASS, "other": {"metadata": {"name": "other"}, "spec": {}}}


def node(name: str = "n1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"zone": "a", "gpu": "t4"}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": [], **spec}}


TAINT = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}


def required(term: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def requests(**amounts: str) -> list[dict[str, Any]]:
    return [{"name": "c", "resources": {"requests": amounts}}]


GPU_A100 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
NAME_N1 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}


@pytest.mark.parametrize(
    ("pod_spec", "node_spec", "expected"),
    [
        ({}, {}, None),
        ({"nodeSelector": {"zone": "b"}}, {}, "NodeSelectorMismatch"),
        ({"nodeName": "n2"}, {}, "NodeName"),
        ({}, {"unschedulable": True}, "NodeUnschedulable"),
        ({"tolerations": [UNSCHEDULABLE]}, {"unschedulable": True}, None),
        ({}, {"taints": [TAINT]}, "TaintToleration"),
        ({"tolerations": [TAINT]}, {"taints": [TAINT]}, None),
        ({}, {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, None),
        ({"affinity": required(GPU_A100)}, {}, "NodeAffinityMismatch"),
        ({"affinity": required(NAME_N1)}, {}, None),
        ({"containers": requests(cpu="3")}, {}, "InsufficientCPU"),
        ({"containers": requests(memory="7Gi")}, {}, "InsufficientMemory"),
    ],
)
def test_node_fit(pod_spec: dict[str, Any], node_spec: dict[str, Any], expected: str | None) -> None:
    bound = {"cpu": 2.0, "memory": float(2 * 2**30)}
    assert node_fit_problem(pod(**pod_spec), NodeView.parse(node(**node_spec)), bound) == expected


def test_pod_requests_take_init_containers_and_overhead() -> None:
    spec = {
        "containers": requests(cpu="500m") + requests(cpu="1"),
        "initContainers": requests(cpu="2", memory="1Gi"),
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(pod(**spec)) == {"cpu": 2.1, "memory": float(2**30)}


def test_pod_claim_names_resolve_templates_through_status() -> None:
    obj = pod(
        resourceClaims=[
            {"name": "a", "resourceClaimName": "direct"},
            {"name": "b", "resourceClaimTemplateName": "t"},
        ]
    )
    assert pod_claim_names(obj) == [("a", "direct"), ("b", None)]
    obj["status"] = {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-xyz"}]}
    assert pod_claim_names(obj) == [("a", "direct"), ("b", "p-b-xyz")]


def claim(*requests: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config:
        devices["config"] = config
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "c-uid"}, "spec": {"devices": devices}}


def exact(name: str, **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **body}}


def test_claim_requests_capacity_rounding_and_errors() -> None:
    ours = exact("a", capacity={"requests": {"memory": "1000.5Mi", "cores": "30"}})
    theirs = {"name": "x", "exactly": {"deviceClassName": "other"}}
    parsed, foreign = claim_requests(claim(ours, theirs), lambda name: name == DRIVER)
    assert foreign == ["x"]
    spec = parsed[0].alternatives[0]
    assert spec.memory == 1001 * 2**20 and spec.cores == 30
    with pytest.raises(RequestError, match="cores 150 exceeds 100"):
        claim_requests(claim(exact("a", capacity={"requests": {"cores": "150"}})), lambda name: True)
    with pytest.raises(RequestError, match="memory 'lots'"):
        claim_requests(claim(exact("a", capacity={"requests": {"memory": "lots"}})), lambda name: True)


def planner(gpus: int = 4) -> tuple[Ledger, Planner]:
    ledger = Ledger()
    slices = build_resource_slices(
        profile_gpus("t4", node_name="n1", gpus=gpus), node_name="n1", driver_name=DRIVER, policy_taint=True
    )
    ledger.set_inventory(build_inventory(slices, DRIVER))
    return ledger, Planner(
        ledger, Matcher(DRIVER, f"{DRIVER}/policy-managed"), DRIVER, ControllerDefaults(), CLASSES.get
    )


def plan_one(obj: dict[str, Any], p: Planner) -> Any:
    requests, _ = claim_requests(obj, lambda name: name == DRIVER)
    return p.plan(PodView.parse({}), [PlanInput(ClaimView(obj, DRIVER), requests)], frozenset({"n1"}), None)


def test_policy_taint_is_ignored_and_all_mode_takes_every_device() -> None:
    _, p = planner()
    plan = plan_one(claim(exact("all", allocationMode="All", capacity={"requests": {"memory": "1Gi"}})), p)
    assert plan.reason is None
    assert [r.device.device for r in plan.claims[0].results] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_admin_access_takes_no_capacity() -> None:
    ledger, p = planner()
    plan = plan_one(claim(exact("adm", adminAccess=True, count=2)), p)
    results = plan.claims[0].results
    assert [r.admin_access for r in results] == [True, True]
    allocation = build_allocation(plan.claims[0], "n1", CLASSES.get, {"adm": DRIVER})
    assert allocation["devices"]["results"][0] == {
        "request": "adm",
        "driver": DRIVER,
        "pool": "n1",
        "device": "gpu-0",
        "adminAccess": True,
    }
    assert all(usage.tenants == 0 for usage in ledger.state.nodes["n1"].usage.values())


def test_two_requests_of_one_claim_share_the_node_and_count_each_other() -> None:
    _, p = planner(gpus=2)
    mutex = [{"opaque": {"driver": DRIVER, "parameters": {**CFG, "policy": "mutex"}}}]
    plan = plan_one(claim(exact("a"), exact("b"), config=mutex), p)
    assert [r.device.device for r in plan.claims[0].results] == ["gpu-0", "gpu-1"]
    third = plan_one(claim(exact("a"), exact("b"), exact("c"), config=mutex), p)
    assert third.reason is not None and "request c" in third.reason


def test_allocation_config_order_and_sources() -> None:
    _, p = planner()
    claim_config = [
        {"requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {**CFG, "numaBind": True}}},
        {"opaque": {"driver": "other.io", "parameters": {"x": 1}}},
    ]
    obj = claim(exact("a"), config=claim_config)
    plan = plan_one(obj, p)
    allocation = build_allocation(plan.claims[0], "n1", CLASSES.get, {"a": DRIVER}, new_uid=lambda: "uid-1")
    assert [entry["source"] for entry in allocation["devices"]["config"]] == [
        "FromClass",
        "FromClaim",
        "FromClaim",
    ]
    assert allocation["devices"]["config"][0]["requests"] == ["a"]
    assert "requests" not in allocation["devices"]["config"][2]
    assert allocation["devices"]["results"][0]["shareID"] == "uid-1"
    assert pinned_node(allocation) == "n1"
    assert pinned_node({"nodeSelector": node_selector("x")}) == "x" and pinned_node(None) is None


def test_unknown_policy_names_become_warnings_not_failures() -> None:
    _, p = planner()
    config = [{"opaque": {"driver": DRIVER, "parameters": {**CFG, "policy": "binpack,gang"}}}]
    plan = plan_one(claim(exact("a"), config=config), p)
    assert plan.reason is None
    assert any("gang" in warning for warning in plan.warnings)


def test_invalid_class_config_is_a_pending_reason() -> None:
    ledger, _ = planner()
    bad = {
        **CLASS,
        "spec": {
            **CLASS["spec"],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {**CFG, "numaBind": "yes"}}}],
        },
    }
    p = Planner(
        ledger, Matcher(DRIVER, f"{DRIVER}/policy-managed"), DRIVER, ControllerDefaults(), {DRIVER: bad}.get
    )
    plan = plan_one(claim(exact("a")), p)
    assert plan.reason is not None and "DeviceClass gpu.hami.io config[0]: numaBind" in plan.reason


def test_format_decision_and_metrics() -> None:
    ledger, p = planner()
    plan = plan_one(claim(exact("a", capacity={"requests": {"memory": "1Gi"}})), p)
    subject, decision, config = plan.decisions[0]
    line = format_decision(subject, decision, config)
    assert "-> n1 gpu-0" in line and "n1/gpu-0=0.000000*" in line and "policy=binpack(class)" in line
    metrics = ControllerMetrics()
    ledger.state.allocate(
        plan.claims
        and __import__("dra_driver.controller.planner", fromlist=["x"]).placement_of(plan.claims[0].results)
    )
    metrics.update_gpus(ledger)
    text = generate_latest(metrics.registry).decode()
    card = ledger.state.nodes["n1"].card(0)
    labels = f'device="gpu-0",model="{card.product_name}",node="n1",uuid="{card.uuid}"'
    assert f"hami_dra_gpu_allocated_memory_bytes{{{labels}}} 1.073741824e+09" in text
    by_name = {"node": "n1", "device": "gpu-0", "uuid": card.uuid, "model": card.product_name}
    assert metrics.registry.get_sample_value("hami_dra_gpu_memory_capacity_bytes", by_name) == card.memory
    assert f"hami_dra_gpu_allocated_slots{{{labels}}} 1.0" in text


def test_nvlink_peers_parse() -> None:
    assert nvlink_pair_scores("18:1-3;4:5") == {1: 1800, 2: 1800, 3: 1800, 5: 400}


def test_claim_constraints_are_checked_on_the_choice() -> None:
    _, p = planner()
    same_numa = [{"matchAttribute": "resource.kubernetes.io/numaNode"}]
    ok = claim(exact("a", count=2))
    ok["spec"]["devices"]["constraints"] = same_numa
    assert plan_one(ok, p).reason is None  # gpu-0 and gpu-1 share NUMA node 0
    spread = claim(exact("a", count=3))
    spread["spec"]["devices"]["constraints"] = same_numa
    reason = plan_one(spread, p).reason
    assert reason is not None and "do not share resource.kubernetes.io/numaNode" in reason
    distinct = claim(exact("a", count=2))
    distinct["spec"]["devices"]["constraints"] = [{"distinctAttribute": "gpu.hami.io/index"}]
    assert plan_one(distinct, p).reason is None


def test_selector_exclusions_are_named_as_such_in_pending_reasons() -> None:
    _, p = planner()
    only_gpu3 = exact(
        "a", count=2, selectors=[{"cel": {"expression": 'device.attributes["gpu.hami.io"].index == 3'}}]
    )
    reason = plan_one(claim(only_gpu3), p).reason
    assert reason is not None and "3/4 DeviceSelectorMismatch" in reason and "CardUuidMismatch" not in reason


@pytest.mark.parametrize(
    ("requested", "reason"),
    [({"memory": "-1Gi"}, "memory -1Gi is negative"), ({"cores": "-5"}, "cores -5 is negative")],
)
def test_negative_capacity_requests_are_refused_not_clamped(requested: dict[str, str], reason: str) -> None:
    with pytest.raises(RequestError, match=reason):
        claim_requests(claim(exact("a", capacity={"requests": requested})), lambda name: True)


def test_two_pools_of_one_node_with_the_same_gpu_index_keep_the_first_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine knows a card as (node, index): a second pool reusing an index would be the same
    card to it, so the inventory keeps one and says why; a placement maps back by index."""
    gpus = profile_gpus("t4", node_name="n1", gpus=2)
    first = build_resource_slices(gpus, node_name="n1", driver_name=DRIVER)
    second = build_resource_slices(gpus[:1], node_name="n1", driver_name=DRIVER, pool_name="n1-extra")
    second[0]["metadata"]["name"] = "n1-extra"
    nodes = build_inventory([*first, *second], DRIVER)
    assert sorted(nodes["n1"].devices) == [DeviceId(DRIVER, "n1", "gpu-0"), DeviceId(DRIVER, "n1", "gpu-1")]
    assert nodes["n1"].device_at(1).name == "gpu-1" and nodes["n1"].device_at(0).pool == "n1"
    assert "device n1-extra/gpu-0 has index 0 like n1/gpu-0; ignored" in caplog.text


def test_a_trial_is_seen_while_it_lasts_and_undone_after_it_even_on_error() -> None:
    ledger, _ = planner(gpus=2)
    ledger.set_claim("kept", (Use(DeviceId(DRIVER, "n1", "gpu-1"), 1024, 10, 1),))
    share = DeviceShare(0, 2048, 20, 1)

    def usage() -> list[tuple[int, int, int]]:
        return [
            (u.used_memory, u.used_cores, u.tenants)
            for _, u in sorted(ledger.state.nodes["n1"].usage.items())
        ]

    recorded = usage()
    assert recorded == [(0, 0, 0), (1024, 10, 1)]
    with ledger.trial() as trial:
        trial.allocate(Placement("n1", (share,)))
        assert usage() == [(2048, 20, 1), (1024, 10, 1)]  # a later request of the pod sees it
    assert usage() == recorded
    with pytest.raises(RuntimeError), ledger.trial() as trial:
        trial.allocate(Placement("n1", (share, DeviceShare(1, 1024, 10, 1))))
        raise RuntimeError("the planner failed half-way")
    assert usage() == recorded  # the claim recorded before the trial is still counted, nothing else


def test_a_pending_reason_names_the_tainted_devices_the_selectors_chose() -> None:
    """An unhealthy GPU is tainted by its node's plugin: a pod that only that GPU would fit says so."""
    gpus = profile_gpus("t4", node_name="n1", gpus=2)
    gpus[1] = dataclasses.replace(gpus[1], healthy=False)
    slices = build_resource_slices(
        gpus, node_name="n1", driver_name=DRIVER, policy_taint=True, taint_unhealthy=True
    )
    ledger = Ledger()
    ledger.set_inventory(build_inventory(slices, DRIVER))
    p = Planner(
        ledger, Matcher(DRIVER, f"{DRIVER}/policy-managed"), DRIVER, ControllerDefaults(), CLASSES.get
    )
    uuid = gpus[1].uuid
    selector = [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]
    plan = plan_one(claim(exact("a", selectors=selector)), p)
    assert plan.reason is not None and f"tainted: n1/gpu-1 ({DRIVER}/unhealthy)" in plan.reason
    assert plan_one(claim(exact("a")), p).claims[0].results[0].device.device == "gpu-0"
