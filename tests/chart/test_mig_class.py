"""The chart's MIG class (issue 37): ours, a MIG class for the controller, guarded like the others."""

from __future__ import annotations

from dra_driver.config.classes import mig_selector
from dra_driver.config.model import parse_gpu_config
from dra_driver.contract import SCHEDULER_FENCE
from dra_driver.resource.objects import DeviceClassView
from tests.chart.combos import CUSTOM_DRIVER
from tests.chart.helpers import Render, all_of


def _classes(objects: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(o["metadata"]["name"]): o for o in all_of(objects, "DeviceClass")}  # type: ignore[index]


def test_the_mig_class_is_a_mig_class_of_ours_with_its_policy_and_the_fence(render: Render) -> None:
    classes = _classes(render())
    view = DeviceClassView(classes["mig.gpu.hami.io"], "gpu.hami.io")
    assert view.ours and view.mig
    expressions = [s["cel"]["expression"] for s in view.raw["spec"]["selectors"]]
    assert expressions == ['device.driver == "gpu.hami.io"', mig_selector("gpu.hami.io"), SCHEDULER_FENCE]
    (config,) = view.config
    assert parse_gpu_config(config["opaque"]["parameters"]).policy == "binpack"
    # Every other class of the chart places cards and shares, never MIG instances.
    assert [name for name, obj in classes.items() if DeviceClassView(obj, "gpu.hami.io").mig] == [
        "mig.gpu.hami.io"
    ]


def test_the_mig_class_follows_the_driver_name_its_policy_and_can_be_left_out(render: Render) -> None:
    values = {**CUSTOM_DRIVER, "migClass": {"enabled": True, "policy": "spread", "nodePolicy": "spread"}}
    classes = _classes(render(values=values))
    view = DeviceClassView(classes["mig.gpu.example.org"], "gpu.example.org")
    assert view.ours and view.mig
    params = view.config[0]["opaque"]["parameters"]
    assert (params["policy"], params["nodePolicy"]) == ("spread", "spread")
    assert "mig.gpu.hami.io" not in _classes(render(values={"migClass": {"enabled": False}}))


def test_tenant_policies_guard_claims_of_the_mig_class(render: Render) -> None:
    objects = render()
    guarded = [str(o) for o in all_of(objects, "ValidatingAdmissionPolicy") if "mig.gpu.hami.io" in str(o)]
    assert guarded, "the tenant policies name the chart's MIG class among the classes they guard"
