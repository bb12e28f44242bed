"""examples/mig/ against what a simulated MIG node publishes: the class selects MIG devices only,
the 1g claim only 1g ones, and the class is kube-scheduler's (never the controller's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kube_validate import assert_valid

from dra_driver.cel.selectors import device_input, selectors_match
from dra_driver.config.classes import class_selectors, is_driver_class
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.resource.slice_builder import build_resource_slices

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.hami.io"


def objects(path: Path) -> dict[str, Any]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text()) if doc}


def published() -> list[dict[str, Any]]:
    gpus = DevicesFileSource(REPO / "examples/devices/h100-mig.yaml", node_name="node-1").discover()
    (slice_,) = build_resource_slices(gpus, node_name="node-1")
    assert_valid(slice_)
    devices: list[dict[str, Any]] = slice_["spec"]["devices"]
    return devices


def test_the_mig_class_and_the_1g_claim_select_what_they_say() -> None:
    device_class = objects(REPO / "examples/mig/deviceclass.yaml")["DeviceClass"]
    claim = objects(REPO / "examples/mig/claim-1g.yaml")
    for obj in (device_class, *claim.values()):
        assert_valid(obj)
    class_cel = class_selectors(device_class)
    (request,) = claim["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"]
    claim_cel = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    devices = published()
    assert [d["name"] for d in devices][:2] == ["gpu-0", "gpu-1-mig-1-0"]
    inputs = {d["name"]: device_input(DRIVER, d) for d in devices}
    by_class = [name for name, cel in inputs.items() if selectors_match("class", class_cel, cel)]
    assert by_class == [d["name"] for d in devices if d["name"] != "gpu-0"]  # MIG devices only, 3 + 7
    assert len(by_class) == 10
    one_g = [name for name in by_class if selectors_match("claim", claim_cel, inputs[name])]
    assert one_g == ["gpu-1-mig-13-0"] + [f"gpu-2-mig-{gi}-0" for gi in range(7, 14)]
    # another driver's device has no such attribute: the class does not match it, and does not fail
    other = device_input("other.example.com", {"name": "x", "attributes": {"type": {"string": "mig"}}})
    assert selectors_match("class", class_cel, other) is False


def test_the_mig_class_is_left_to_kube_scheduler() -> None:
    device_class = objects(REPO / "examples/mig/deviceclass.yaml")["DeviceClass"]
    assert not is_driver_class(device_class, DRIVER), (
        "the controller would take its claims and never place them (it places cards by index)"
    )
