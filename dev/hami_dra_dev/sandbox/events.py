"""core/v1 Events written by the simulated control plane (what ``kubectl describe`` shows)."""

from __future__ import annotations

import logging
from typing import Any

from hami_dra_dev.sandbox.api import Api, now
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.resources import require

log = logging.getLogger(__name__)
Obj = dict[str, Any]
EVENTS = require("", "v1", "events")


def record_event(
    api: Api,
    obj: Obj,
    kind: str,
    reason: str,
    message: str,
    type_: str = "Normal",
    component: str = "default-scheduler",
) -> None:
    """A core/v1 Event about ``obj`` (what ``kubectl describe`` shows)."""
    meta = obj["metadata"]
    ns = meta.get("namespace") or "default"
    stamp = now()
    event = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
        "involvedObject": {
            "kind": kind,
            "namespace": meta.get("namespace"),
            "name": meta["name"],
            "uid": meta["uid"],
            "apiVersion": obj.get("apiVersion"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
    }
    try:
        api.create(EVENTS, ns, event)
    except ApiError as err:
        log.debug("event for %s not recorded: %s", meta["name"], err.message)
