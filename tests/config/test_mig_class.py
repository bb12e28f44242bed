"""Which classes are MIG classes (config/classes.py ``is_mig_class``): a selector of the class (not
the fence) pins ``type == "mig"`` in the driver's domain."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.config.classes import is_mig_class, mig_selector
from dra_driver.resource.objects import DeviceClassView

DRIVER = "gpu.hami.io"


def klass(*expressions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "c"},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


@pytest.mark.parametrize(
    ("expressions", "mig"),
    [
        ([mig_selector(DRIVER)], True),
        (["device.attributes['gpu.hami.io'].type=='mig'"], True),
        (
            ['"type" in device.attributes["gpu.hami.io"] && device.attributes["gpu.hami.io"].type == "mig"'],
            True,
        ),
        (['device.attributes["gpu.hami.io"].type == "gpu"'], False),
        (['device.attributes["other.example.com"].type == "mig"'], False),
        (['device.driver == "gpu.hami.io"'], False),
        ([], False),
    ],
)
def test_a_mig_class_pins_type_mig_in_the_drivers_domain(expressions: list[str], mig: bool) -> None:
    assert is_mig_class(klass(*expressions), DRIVER) is mig


def test_only_a_class_of_ours_is_placed_as_mig() -> None:
    ours = klass(f'device.driver == "{DRIVER}"', mig_selector(DRIVER))
    assert DeviceClassView(ours, DRIVER).mig
    theirs = klass(mig_selector(DRIVER))  # no driver selector, no config: kube-scheduler's, not ours
    view = DeviceClassView(theirs, DRIVER)
    assert not view.ours and not view.mig
