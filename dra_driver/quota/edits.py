"""The change the controller writes to a ``GpuQuota``, as a pure function (like the Pod and
ResourceClaim edits of ``dra_driver/resource/edits.py``).

The write starts from the object as the API last returned it (a raw mapping: fields newer than our
model must round-trip untouched) and returns an edited deep copy, so a cached object is never
changed in place.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dra_driver.kube.api import Obj


def with_quota_used(quota: Mapping[str, Any], used: Mapping[str, Any]) -> Obj:
    """The quota with ``status.used`` set (its other status fields kept) and ``status.observedGeneration``
    its ``metadata.generation``: the usage was computed against the limits of that generation."""
    edited: Obj = copy.deepcopy(dict(quota))
    edited["status"] = {
        **(edited.get("status") or {}),
        "used": copy.deepcopy(dict(used)),
        "observedGeneration": int((edited.get("metadata") or {}).get("generation") or 0),
    }
    return edited
