"""The planner (dra_driver/controller/planner.py): one pod's claims through the engine on one node,
with the pod's earlier requests counted; why it does not fit, in HAMi's words."""

from __future__ import annotations

import dataclasses

from dra_driver.config.resolve import CardFilter, ResolvedConfig
from dra_driver.controller.allocation import build_allocation
from dra_driver.controller.allocator import format_decision
from dra_driver.controller.eligibility import Eligible
from dra_driver.controller.planner import PlanInput, placement_request
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import DeviceShare, NodePolicy, PlacementRequest, ScoringWeights, parse_policy_chain
from dra_driver.quantity import MIB
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.requests import RequestSpec, claim_requests
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.harness import CFG, DRIVER, claim, device_class, exactly
from tests.controller.worlds import PLANNER_CLASSES, plan_one, planner


def test_our_policy_taint_is_ignored_and_all_mode_takes_every_device() -> None:
    _, p = planner()
    plan = plan_one(
        claim("c", exactly("all", allocationMode="All", capacity={"requests": {"memory": "1Gi"}})), p
    )
    assert plan.reason is None
    assert [r.device.device for r in plan.claims[0].results] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_admin_access_takes_no_capacity() -> None:
    ledger, p = planner()
    plan = plan_one(claim("c", exactly("adm", adminAccess=True, count=2)), p)
    results = plan.claims[0].results
    assert [r.admin_access for r in results] == [True, True]
    allocation = build_allocation(plan.claims[0], "n1", PLANNER_CLASSES.get, {"adm": DRIVER})
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
    plan = plan_one(claim("c", exactly("a"), exactly("b"), config={"policy": "mutex"}), p)
    assert [r.device.device for r in plan.claims[0].results] == ["gpu-0", "gpu-1"]
    third = plan_one(claim("c", exactly("a"), exactly("b"), exactly("c"), config={"policy": "mutex"}), p)
    assert third.reason is not None and "request c" in third.reason


def test_unknown_policy_names_become_warnings_not_failures() -> None:
    _, p = planner()
    plan = plan_one(claim("c", exactly("a"), config={"policy": "binpack,gang"}), p)
    assert plan.reason is None
    assert any("gang" in warning for warning in plan.warnings)


def test_an_invalid_class_config_is_a_pending_reason() -> None:
    _, p = planner(classes={DRIVER: device_class(DRIVER, {"numaBind": "yes"})})
    plan = plan_one(claim("c", exactly("a")), p)
    assert plan.reason is not None and "DeviceClass gpu.hami.io config[0]: numaBind" in plan.reason


def test_claim_constraints_are_checked_on_the_choice() -> None:
    _, p = planner()
    same_numa = [{"matchAttribute": "resource.kubernetes.io/numaNode"}]
    ok = claim("c", exactly("a", count=2))
    ok["spec"]["devices"]["constraints"] = same_numa
    assert plan_one(ok, p).reason is None  # gpu-0 and gpu-1 share NUMA node 0
    spread = claim("c", exactly("a", count=3))
    spread["spec"]["devices"]["constraints"] = same_numa
    reason = plan_one(spread, p).reason
    assert reason is not None and "do not share resource.kubernetes.io/numaNode" in reason
    distinct = claim("c", exactly("a", count=2))
    distinct["spec"]["devices"]["constraints"] = [{"distinctAttribute": "gpu.hami.io/index"}]
    assert plan_one(distinct, p).reason is None


def test_selector_exclusions_are_named_as_such_in_pending_reasons() -> None:
    _, p = planner()
    only_gpu3 = exactly(
        "a", count=2, selectors=[{"cel": {"expression": 'device.attributes["gpu.hami.io"].index == 3'}}]
    )
    reason = plan_one(claim("c", only_gpu3), p).reason
    assert reason is not None and "3/4 DeviceSelectorMismatch" in reason and "CardUuidMismatch" not in reason


def test_a_pending_reason_names_the_tainted_devices_the_selectors_chose() -> None:
    """An unhealthy GPU is tainted by its node's plugin: a pod that only that GPU would fit says so."""
    gpus = profile_gpus("t4", node_name="n1", gpus=2)
    gpus[1] = dataclasses.replace(gpus[1], healthy=False)
    slices = build_resource_slices(
        gpus, node_name="n1", driver_name=DRIVER, policy_taint=True, taint_unhealthy=True
    )
    _, p = planner(slices=slices)
    uuid = gpus[1].uuid
    selector = [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]
    plan = plan_one(claim("c", exactly("a", selectors=selector)), p)
    assert plan.reason is not None and f"tainted: n1/gpu-1 ({DRIVER}/unhealthy)" in plan.reason
    assert plan_one(claim("c", exactly("a")), p).claims[0].results[0].device.device == "gpu-0"


def test_a_plans_decision_line_names_the_chosen_card_and_where_its_policy_came_from() -> None:
    _, p = planner()
    plan = plan_one(claim("c", exactly("a", capacity={"requests": {"memory": "1Gi"}})), p)
    subject, decision, config = plan.decisions[0]
    line = format_decision(subject, decision, config)
    assert "-> n1 gpu-0" in line and "n1/gpu-0=0.000000*" in line and "policy=binpack(class)" in line


def test_the_engine_request_carries_every_resolved_field() -> None:
    spec = RequestSpec("gpu", DRIVER, (), False, 2, None, 30, False)
    eligible = Eligible(frozenset({("n1", 0), ("n1", 1)}), frozenset({"n1"}))
    resolved = ResolvedConfig(
        policy=parse_policy_chain("mutex,binpack"),
        node_policy=NodePolicy.SPREAD,
        weights=ScoringWeights(slot=2, core=3, memory=4),
        numa_bind=True,
        memory_percent=40,
        card_filter=CardFilter(("T4",), ("A100",), ("GPU-1",), ("GPU-2",)),
        unenforced_shares=True,
    )
    assert placement_request(spec, eligible, resolved, 3, frozenset({"n1"})) == PlacementRequest(
        name="gpu",
        count=3,
        memory=None,
        memory_percent=40,  # the request names no memory: HAMi's percentage applies
        cores=30,
        policy=resolved.policy,
        node_policy=NodePolicy.SPREAD,
        weights=ScoringWeights(slot=2, core=3, memory=4),
        numa_bind=True,
        include_products=("T4",),
        exclude_products=("A100",),
        include_uuids=("GPU-1",),
        exclude_uuids=("GPU-2",),
        allowed_nodes=frozenset({"n1"}),
        allowed_devices=frozenset({("n1", 0), ("n1", 1)}),
        unenforced_shares=True,
    )
    sized = dataclasses.replace(spec, memory=1024 * MIB)
    request = placement_request(sized, eligible, resolved, 1, frozenset({"n1"}))
    assert request.memory == 1024 * MIB and request.memory_percent is None


def test_a_placed_request_records_its_node_share_and_tolerations_and_its_decision() -> None:
    _, p = planner()
    toleration = {"key": "maintenance", "operator": "Exists"}
    plan = plan_one(claim("c", exactly("a", count=2, tolerations=[toleration])), p)
    results = plan.claims[0].results
    assert [(r.request, r.node, r.admin_access) for r in results] == [("a", "n1", False), ("a", "n1", False)]
    assert all(r.tolerations == (toleration,) for r in results)
    assert [(r.device.device, r.share.index) for r in results] == [("gpu-0", 0), ("gpu-1", 1)]
    (decision,) = plan.decisions
    assert decision.subject == "claim default/c request a" and decision.config.startswith(
        "policy=binpack(class)"
    )


def test_admin_access_takes_exactly_as_many_devices_as_asked_or_refuses() -> None:
    _, p = planner(gpus=2)
    toleration = {"key": "k", "operator": "Exists"}
    plan = plan_one(claim("c", exactly("adm", adminAccess=True, count=2, tolerations=[toleration])), p)
    assert [(r.node, r.device.device, r.share) for r in plan.claims[0].results] == [
        ("n1", "gpu-0", DeviceShare(0, 0, 0, 0)),
        ("n1", "gpu-1", DeviceShare(1, 0, 0, 0)),
    ]
    assert all(r.tolerations == (toleration,) for r in plan.claims[0].results)
    assert plan.decisions == []  # no engine decision: admin access takes no capacity
    refused = plan_one(claim("c", exactly("adm", adminAccess=True, count=3)), p)
    assert refused.reason == "claim default/c request adm: not enough devices for admin access request adm"


def test_each_alternative_says_why_it_did_not_fit() -> None:
    _, p = planner(gpus=1)
    body = claim("c")
    body["spec"]["devices"]["requests"] = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "missing", "deviceClassName": "nowhere"},
                {"name": "big", "deviceClassName": DRIVER, "count": 2},
            ],
        }
    ]
    requests, _ = claim_requests(body, lambda name: name in (DRIVER, "nowhere"))
    plan = p.plan(PodView.parse({}), [PlanInput(ClaimView(body, DRIVER), requests)], frozenset({"n1"}), None)
    assert plan.reason is not None and plan.reason.startswith(
        "claim default/c request gpu: DeviceClass nowhere not found; "
    )
    assert plan.claims == [] and plan.node is None


def test_the_claims_config_applies_to_its_requests_and_the_pods_annotations_win() -> None:
    _, p = planner(gpus=2)
    body = claim("c", exactly("a"), exactly("b"))
    body["spec"]["devices"]["config"] = [
        {"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {**CFG, "policy": "spread"}}}
    ]
    requests, _ = claim_requests(body, lambda name: name == DRIVER)
    inputs = [PlanInput(ClaimView(body, DRIVER), requests)]
    plan = p.plan(PodView.parse({}), inputs, frozenset({"n1"}), None)
    assert [d.config.split()[0] for d in plan.decisions] == ["policy=binpack(class)", "policy=spread(claim)"]
    annotated = PodView.parse(
        {"metadata": {"annotations": {"hami.io/gpu-scheduler-policy": "mutex,binpack"}}}
    )
    plan = p.plan(annotated, inputs, frozenset({"n1"}), None)
    assert [d.config.split()[0] for d in plan.decisions] == ["policy=mutex,binpack(annotation)"] * 2


def test_unknown_policy_names_are_listed_in_one_warning() -> None:
    _, p = planner()
    plan = plan_one(claim("c", exactly("a"), config={"policy": "binpack,gang,fair"}), p)
    assert plan.warnings == ["claim default/c: unknown policy name(s) ignored: gang, fair"]


def test_an_invalid_claim_config_names_the_claim() -> None:
    _, p = planner()
    plan = plan_one(claim("c", exactly("a"), config={"numaBind": "yes"}), p)
    assert plan.reason is not None and plan.reason.startswith("claim default/c config[0]: numaBind")


def test_with_no_node_left_the_pod_plan_says_so() -> None:
    _, p = planner()
    requests, _ = claim_requests(claim("c", exactly("a")), lambda name: name == DRIVER)
    inputs = [PlanInput(ClaimView(claim("c", exactly("a")), DRIVER), requests)]
    assert p.plan(PodView.parse({}), inputs, frozenset(), None).reason == "no node can run the pod"
    pinned = p.plan(PodView.parse({}), inputs, frozenset({"n1"}), "n2")
    assert pinned.reason == "claims already allocated on node n2, where the pod cannot run"
    assert pinned.claims == [] and pinned.node is None
