"""``hami-dra explain`` of MIG pods (issue 37): the chosen instance, where it sits on its card and
what taking it left free; for a pending one, why each instance lost and what would make it fit.
The same for cards in MIG on demand: the chosen placement (profile and start), placements that
overlap one in use (MigPlacementTaken), and those that lost on what they would leave free."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.controller.offline import ClusterObjects
from dra_driver.explain.render import render
from dra_driver.explain.report import explain
from dra_driver.kube.api import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS
from tests.controller.harness import DRIVER, NS
from tests.controller.mig_world import mig_slices
from tests.controller.test_mig_flow import mig_tenant, mig_world
from tests.controller.test_mig_on_demand_flow import on_demand_slices, on_demand_world, tenant
from tests.controller.worlds import World

CARDS: list[list[str] | None] = [["3g.71gb", "1g.18gb@4", "1g.18gb@5"]]


def objects(world: World, plural: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(body) for (kind, _, _), body in world.kube.objects.items() if kind == plural]


def explained(world: World, name: str, slices: list[dict[str, Any]] | None = None) -> Any:
    pod = world.kube.stored(PODS, NS, name)
    claims = {c["metadata"]["name"]: c for c in objects(world, RESOURCE_CLAIMS.plural)}
    cluster = ClusterObjects(
        pods=objects(world, PODS.plural),
        claims=objects(world, RESOURCE_CLAIMS.plural),
        slices=slices if slices is not None else mig_slices(CARDS, node="node-1"),
        classes=objects(world, DEVICE_CLASSES.plural),
        nodes=objects(world, NODES.plural),
        gpu_quotas=[],
        resource_quotas=[],
    )
    return explain(pod, claims=claims, cluster=cluster, driver=DRIVER)


def test_a_placed_mig_pod_names_its_instance_and_why_the_others_lost() -> None:
    world = mig_world(CARDS)
    mig_tenant(world, "a", "1g.18gb")
    assert world.place("a-pod").outcome == "bound"
    text = render(explained(world, "a-pod"))
    assert "chosen: node-1/gpu-0-mig-11-0" in text
    assert "1g.18gb at slice 4 of gpu-0 (0 in use); leaves free blocks 4+2+1 (of 8)" in text
    lines = text.splitlines()
    mismatch = next(line for line in lines if "node-1/gpu-0-mig-1-0" in line)
    assert mismatch.rstrip().endswith("DeviceSelectorMismatch")


def test_a_pending_mig_pod_names_the_instances_in_use_and_the_fix() -> None:
    world = mig_world(CARDS)
    for name in ("a", "b"):
        mig_tenant(world, name, "1g.18gb")
        assert world.place(f"{name}-pod").outcome == "bound"
    mig_tenant(world, "c", "1g.18gb")
    world.decide("c-pod")
    explanation = explained(world, "c-pod")
    assert explanation.reasons == {"MigInstanceInUse": 2, "DeviceSelectorMismatch": 1}
    text = render(explanation, wide=True)
    assert "2 card(s) MigInstanceInUse: its claim ends, or the admin creates more instances" in text


def test_an_on_demand_pod_names_its_placement_and_why_the_others_lost() -> None:
    world = on_demand_world(cards=2)
    for name in ("a", "b"):
        tenant(world, name, "1g.18gb")
        assert world.place(f"{name}-pod").outcome == "bound"
    explanation = explained(world, "b-pod", on_demand_slices(2))
    text = render(explanation, wide=True)
    assert "chosen: node-1/gpu-0-mig-1g18gb-at-1" in text
    lines = text.splitlines()

    def result(device: str) -> tuple[str, str]:
        at = next(i for i, line in enumerate(lines) if f"node-1/{device} " in line)
        return lines[at], lines[at + 1].strip()

    row, note = result("gpu-0-mig-1g18gb-at-1")
    assert "chosen" in row
    assert note == "1g.18gb at slice 1 of gpu-0 (1 in use); leaves free blocks 4+2 (of 4+2+1)"
    row, _ = result("gpu-0-mig-1g18gb-at-0")  # a's placement
    assert "MigInstanceInUse" in row
    # Eligible placements that lost on the policy: what they would have left free is worse.
    row, note = result("gpu-0-mig-1g18gb-at-4")
    assert "eligible" in row
    assert note == "1g.18gb at slice 4 of gpu-0 (1 in use); leaves free blocks 2+2+1+1 (of 4+2+1)"


def test_a_pending_on_demand_pod_names_the_overlapping_placement_and_the_fix() -> None:
    world = on_demand_world(cards=1)
    tenant(world, "small", "1g.18gb")
    assert world.place("small-pod").outcome == "bound"
    tenant(world, "whole", "7g.141gb")
    world.decide("whole-pod")
    explanation = explained(world, "whole-pod", on_demand_slices(1))
    assert explanation.reasons["MigPlacementTaken"] == 1
    text = render(explanation, wide=True)
    row = next(line for line in text.splitlines() if "node-1/gpu-0-mig-7g141gb-at-0 " in line)
    assert "MigPlacementTaken" in row
    assert "1 card(s) MigPlacementTaken: the instances on the slices it needs end (MIG on demand)" in text
