"""examples/mig/ against what a simulated MIG node publishes: the chart's MIG class selects MIG
devices only, the 1g and 3g claims only theirs, and the controller places them by its policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_validate import assert_valid

from dra_driver.cel.selectors import device_input, selectors_match
from dra_driver.config import ControllerDefaults
from dra_driver.config.classes import mig_selector
from dra_driver.controller.allocation import build_allocation
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.planner import PlanInput, Planner
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.refs import allocation_results
from dra_driver.resource.requests import claim_requests
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.uses import uses_of

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.hami.io"
MIG_CLASS = f"mig.{DRIVER}"
#: The chart's class (tests/chart/test_mig_class.py checks the chart renders these selectors).
CHART_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": MIG_CLASS},
    "spec": {
        "selectors": [
            {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
            {"cel": {"expression": mig_selector(DRIVER)}},
        ],
        "config": [
            {
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "gpu.hami.io/v1alpha1",
                        "kind": "GpuConfig",
                        "policy": "binpack",
                    },
                }
            }
        ],
    },
}


def objects(path: Path) -> dict[str, Any]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text()) if doc}


def published() -> list[dict[str, Any]]:
    gpus = DevicesFileSource(REPO / "examples/devices/h100-mig.yaml", node_name="node-1").discover()
    (slice_,) = build_resource_slices(gpus, node_name="node-1")
    assert_valid(slice_)
    devices: list[dict[str, Any]] = slice_["spec"]["devices"]
    return devices


def claim_of(example: str, name: str) -> dict[str, Any]:
    template = objects(REPO / "examples/mig" / example)["ResourceClaimTemplate"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": template["spec"]["spec"],
    }


@pytest.mark.parametrize(("example", "prefix"), [("claim-1g.yaml", "1g."), ("claim-3g.yaml", "3g.")])
def test_the_class_and_each_claim_select_what_they_say(example: str, prefix: str) -> None:
    claim = objects(REPO / "examples/mig" / example)
    for obj in claim.values():
        assert_valid(obj)
    class_cel = [s["cel"]["expression"] for s in CHART_CLASS["spec"]["selectors"]]
    (request,) = claim["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == MIG_CLASS
    claim_cel = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    devices = published()
    inputs = {d["name"]: device_input(DRIVER, d) for d in devices}
    by_class = [name for name, cel in inputs.items() if selectors_match("class", class_cel, cel)]
    assert by_class == [d["name"] for d in devices if d["name"] != "gpu-0"]  # MIG devices only, 3 + 7
    selected = [name for name in by_class if selectors_match("claim", claim_cel, inputs[name])]
    profiles = {d["name"]: d["attributes"]["profile"]["string"] for d in devices if d["name"] in by_class}
    assert selected == [name for name in by_class if profiles[name].startswith(prefix)] and selected


def test_the_controller_places_the_example_claims_by_the_class_policy() -> None:
    ledger = Ledger()
    ledger.set_inventory(build_inventory([{**s} for s in _slices()], DRIVER))
    classes = {MIG_CLASS: DeviceClassView(CHART_CLASS, DRIVER)}
    assert classes[MIG_CLASS].ours and classes[MIG_CLASS].mig
    planner = Planner(
        ledger, Matcher(DRIVER, f"{DRIVER}/policy-managed"), DRIVER, ControllerDefaults(), classes.get
    )
    placed = {}
    for example, name in (("claim-3g.yaml", "c3"), ("claim-1g.yaml", "c1")):
        obj = claim_of(example, name)
        requests, _ = claim_requests(obj, lambda klass: klass == MIG_CLASS)
        plan = planner.plan(
            PodView.parse({}), [PlanInput(ClaimView(obj, DRIVER), requests)], frozenset({"node-1"}), None
        )
        assert plan.reason is None, plan.reason
        (result,) = plan.claims[0].results
        placed[name] = result.device.device
        assert result.whole_device
        allocation = build_allocation(plan.claims[0], "node-1", classes.get, {"mig": MIG_CLASS})
        ledger.set_claim(name, uses_of(allocation_results(allocation), DRIVER, "default", {"mig": MIG_CLASS}))
    assert placed["c3"] == "gpu-1-mig-1-0"  # the only 3g (gpu-1 slices 0-3)
    # binpack: gpu-1 has an instance in use (the 3g), gpu-2 none: its 1g (slice 6) goes first.
    assert placed["c1"] == "gpu-1-mig-13-0"


def _slices() -> list[dict[str, Any]]:
    gpus = DevicesFileSource(REPO / "examples/devices/h100-mig.yaml", node_name="node-1").discover()
    return build_resource_slices(gpus, node_name="node-1", driver_name=DRIVER, policy_taint=True)
