"""Which DeviceClasses belong to our driver (shared by the webhook and the controller).

A class is ours when it is named after the driver (the chart's default class), carries opaque
config for the driver, or has a selector that pins ``device.driver`` to the driver name. Classes
that select our devices some other way are not recognised: document a ``device.driver`` selector.
The chart's classes also carry the scheduler fence (``SCHEDULER_FENCE``), a selector that only
kube-scheduler applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dra_driver.contract import SCHEDULER_FENCE


def _driver_pattern(driver: str) -> re.Pattern[str]:
    quoted = re.escape(driver)
    return re.compile(rf"device\s*\.\s*driver\s*==\s*(?:\"{quoted}\"|'{quoted}')")


def class_selectors(device_class: Mapping[str, Any]) -> list[str]:
    """The CEL expressions of a DeviceClass, in order, as our controller applies them: without
    the scheduler fence (``SCHEDULER_FENCE``), which only keeps kube-scheduler from allocating."""
    expressions = (
        str(selector["cel"]["expression"])
        for selector in (device_class.get("spec") or {}).get("selectors") or ()
        if (selector.get("cel") or {}).get("expression")
    )
    return [expression for expression in expressions if expression.strip() != SCHEDULER_FENCE]


def _mig_pattern(driver: str) -> re.Pattern[str]:
    quoted = re.escape(driver)
    return re.compile(
        rf"device\s*\.\s*attributes\s*\[\s*(?:\"{quoted}\"|'{quoted}')\s*\]\s*\.\s*type\s*==\s*(?:\"mig\"|'mig')"
    )


def mig_selector(driver: str) -> str:
    """The selector of the chart's MIG class ``mig.<driver>`` (what :func:`is_mig_class` looks for).

    Guarded by ``"type" in``: a device without the attribute (another driver's, an older plugin's)
    must not match, and without the guard its lookup is a CEL runtime error, which fails the claim.
    """
    return f'"type" in device.attributes["{driver}"] && device.attributes["{driver}"].type == "mig"'


def is_mig_class(device_class: Mapping[str, Any], driver: str) -> bool:
    """A class of MIG instances (issue 37): one of its selectors pins ``type == "mig"`` in the
    driver's domain, as the chart's ``mig.<driver>`` class does. Its claims are placed among MIG
    instances (``engine/mig.py``), every other class's among whole cards and shares only."""
    pattern = _mig_pattern(driver)
    return any(pattern.search(expression) for expression in class_selectors(device_class))


def is_driver_class(device_class: Mapping[str, Any], driver: str) -> bool:
    if (device_class.get("metadata") or {}).get("name") == driver:
        return True
    spec = device_class.get("spec") or {}
    for entry in spec.get("config") or ():
        if (entry.get("opaque") or {}).get("driver") == driver:
            return True
    pattern = _driver_pattern(driver)
    return any(pattern.search(expression) for expression in class_selectors(device_class))
