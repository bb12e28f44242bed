"""Planner + ledger without an API server: capacity is never exceeded, and ledger edge cases."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.config import ControllerDefaults
from dra_driver.contract import DeviceId
from dra_driver.controller.allocation import build_allocation
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.planner import PlanInput, Planner
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import NodePolicy
from dra_driver.quantity import parse_bytes
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.requests import claim_requests
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.uses import claim_uses

DRIVER = "gpu.hami.io"
CLASS = {
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.hami.io"'}}]},
}
NODES = ("n1", "n2")


def slices() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for node in NODES:
        items += build_resource_slices(
            profile_gpus("t4", node_name=node, gpus=2), node_name=node, driver_name=DRIVER
        )
    return items


def new_planner() -> tuple[Ledger, Planner]:
    ledger = Ledger()
    ledger.set_inventory(build_inventory(slices(), DRIVER))
    planner = Planner(
        ledger,
        Matcher(DRIVER, f"{DRIVER}/policy-managed"),
        DRIVER,
        ControllerDefaults(),
        {DRIVER: DeviceClassView(CLASS, DRIVER)}.get,
    )
    return ledger, planner


def claim_obj(uid: str, memory: str | None, cores: int, count: int, policy: str) -> dict[str, Any]:
    capacity: dict[str, str] = {"cores": str(cores)}
    if memory:
        capacity["memory"] = memory
    body = {"deviceClassName": DRIVER, "count": count, "capacity": {"requests": capacity}}
    config = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "policy": policy},
        }
    }
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}], "config": [config]}},
    }


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("create"),
            st.sampled_from([None, "1Gi", "4000Mi", "8Gi", "15Gi"]),
            st.sampled_from([0, 30, 50, 100]),
            st.integers(1, 2),
            st.sampled_from(["spread", "binpack", "mutex,binpack", "numa,spread", "topology-aware"]),
        ),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_random_create_delete_never_exceeds_capacity(ops: list[tuple[Any, ...]]) -> None:
    ledger, planner = new_planner()
    live: dict[str, dict[str, Any]] = {}
    for number, op in enumerate(ops):
        if op[0] == "delete":
            if live:
                uid = sorted(live)[op[1] % len(live)]
                del live[uid]
                ledger.remove_claim(uid)
        else:
            uid = f"c{number}"
            claim = claim_obj(uid, op[1], op[2], op[3], op[4])
            requests, _ = claim_requests(claim, lambda name: name == DRIVER)
            plan = planner.plan(
                PodView.parse({}), [PlanInput(ClaimView(claim, DRIVER), requests)], frozenset(NODES), None
            )
            if plan.node is None:
                continue
            classes = {spec.name: spec.class_name for request in requests for spec in request.alternatives}
            view = DeviceClassView(CLASS, DRIVER)
            allocation = build_allocation(plan.claims[0], plan.node, {DRIVER: view}.get, classes)
            claim["status"] = {"allocation": allocation}
            live[uid] = claim
            ledger.set_claim(uid, claim_uses(claim, DRIVER))
        check_capacity(ledger, live)
    check_same_as_rebuilt(ledger)


def engine_view(ledger: Ledger) -> tuple[Any, ...]:
    """Every card's usage, every node's score and both node rankings of the engine state."""
    state = ledger.state
    usage = {
        (name, index): (u.used_memory, u.used_cores, u.tenants)
        for name, node in state.nodes.items()
        for index, u in node.usage.items()
    }
    scores = {name: node.score for name, node in state.nodes.items()}
    rankings = [
        [node.name for node in state.ranked_nodes(policy, with_idle_card=idle)]
        for policy in NodePolicy
        for idle in (False, True)
    ]
    return usage, scores, rankings


def check_same_as_rebuilt(ledger: Ledger) -> None:
    """The engine state kept incrementally (a placement's trial undone by releases, a new claim
    added on its own) is the one a rebuild of every node from the recorded claims gives."""
    kept = engine_view(ledger)
    for node in NODES:
        ledger._rebuild(node)
    assert engine_view(ledger) == kept


def check_capacity(ledger: Ledger, live: dict[str, dict[str, Any]]) -> None:
    used: dict[tuple[str, str], list[int]] = {}
    for claim in live.values():
        for result in claim["status"]["allocation"]["devices"]["results"]:
            consumed = result["consumedCapacity"]
            entry = used.setdefault((result["pool"], result["device"]), [0, 0, 0])
            entry[0] += parse_bytes(consumed["memory"])
            entry[1] += int(consumed["cores"])
            entry[2] += int(consumed["slots"])
    for (pool, name), (memory, cores, tenants) in used.items():
        device = ledger.device(DeviceId(DRIVER, pool, name))
        assert device is not None
        card = device.card
        assert memory <= card.memory and cores <= card.cores and tenants <= card.slots, (pool, name)
        usage = ledger.state.nodes[device.node].usage[card.index]
        assert (usage.used_memory, usage.used_cores, usage.tenants) == (memory, cores, tenants)


def test_claim_allocated_before_its_slice_is_counted_when_the_slice_appears() -> None:
    ledger = Ledger()
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1", "shareID": "x",
                         "consumedCapacity": {"memory": "2Gi", "cores": "20", "slots": "1"}},
                        {"request": "gpu", "driver": "other.io", "pool": "n1", "device": "gpu-0"},
                        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0",
                         "adminAccess": True},
                    ]
                }
            }
        }
    }  # fmt: skip
    ledger.set_claim("early", claim_uses(claim, DRIVER))
    assert "n1" not in ledger.state.nodes
    ledger.set_inventory(build_inventory(slices(), DRIVER))
    usage = ledger.state.nodes["n1"].usage
    assert (usage[1].used_memory, usage[1].used_cores, usage[1].tenants) == (2 * 2**30, 20, 1)
    assert usage[0].tenants == 0  # other drivers and admin access take nothing
    ledger.remove_claim("early")
    assert ledger.state.nodes["n1"].usage[1].tenants == 0


def test_only_complete_newest_pools_count() -> None:
    items = slices()
    stale = {**items[0], "spec": {**items[0]["spec"], "pool": {**items[0]["spec"]["pool"], "generation": 0}}}
    partial = {
        **items[1],
        "spec": {**items[1]["spec"], "pool": {**items[1]["spec"]["pool"], "resourceSliceCount": 2}},
    }
    nodes = build_inventory([stale, items[0], partial], DRIVER)
    assert set(nodes) == {"n1"}
    assert sorted(device.name for device in nodes["n1"].devices.values()) == ["gpu-0", "gpu-1"]
