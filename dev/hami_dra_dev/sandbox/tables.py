"""Server-side printing: the ``meta.k8s.io/v1 Table`` that ``kubectl get`` asks for.

Columns follow kube-apiserver's printers where one exists (ResourceSlice: NODE, DRIVER, POOL,
AGE; ResourceClaim: STATE) so the sandbox's ``kubectl get`` output reads like a real cluster's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox.resources import ResourceType

Column = tuple[str, str, str, int, Callable[[Obj], Any]]  # name, type, description, priority, cell


def age(obj: Obj) -> str:
    """Human age like kubectl's ``duration.HumanDuration`` (``45s``, ``12m``, ``3h``, ``2d``)."""
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    # metav1.Time has whole seconds, MicroTime (events' eventTime, series) microseconds.
    created = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    secs = int((datetime.datetime.now(datetime.UTC) - created).total_seconds())
    if secs < 120:
        return f"{max(secs, 0)}s"
    if secs < 3600 * 3:
        return f"{secs // 60}m"
    if secs < 86400 * 2:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _event_object(obj: Obj) -> Obj:
    """The object an Event is about, in either shape (core/v1 or events.k8s.io/v1)."""
    return dict(obj.get("involvedObject") or obj.get("regarding") or {})


def _event_last_seen(obj: Obj) -> Obj:
    """When an Event last happened, as a creationTimestamp for :func:`age`: the series' last
    observation, else the legacy lastTimestamp, else its eventTime, else its creation."""
    series = obj.get("series") or {}
    stamp = (
        series.get("lastObservedTime")
        or obj.get("lastTimestamp")
        or obj.get("deprecatedLastTimestamp")
        or obj.get("eventTime")
        or obj["metadata"].get("creationTimestamp")
    )
    return {"metadata": {"creationTimestamp": stamp}}


def _claim_state(obj: Obj) -> str:
    status = obj.get("status") or {}
    states = []
    if obj["metadata"].get("deletionTimestamp"):
        states.append("deleted")
    states.append("allocated" if status.get("allocation") else "pending")
    if status.get("reservedFor"):
        states.append("reserved")
    return ",".join(states)


def _pod_status(obj: Obj) -> str:
    """kubectl's STATUS column: Terminating, SchedulingGated, else the phase."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if (
        scheduled
        and scheduled.get("reason") == "SchedulingGated"
        and (obj.get("spec") or {}).get("schedulingGates")
    ):
        return "SchedulingGated"
    return str(status.get("phase", "Unknown"))


def _pod_ready(obj: Obj) -> str:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    total = len((obj.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _node_status(obj: Obj) -> str:
    ready = next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None
    )
    status = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    if (obj.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    return status


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


_NAME: Column = ("Name", "string", "Name must be unique within a namespace.", 0, _name)
_AGE: Column = (
    "Age",
    "string",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    0,
    age,
)

COLUMNS: dict[str, list[Column]] = {
    "resourceslices.resource.k8s.io": [
        _NAME,
        (
            "Node",
            "string",
            "NodeName identifies the node which provides the resources in this pool.",
            0,
            lambda o: o["spec"].get("nodeName") or "<none>",
        ),
        (
            "Driver",
            "string",
            "Driver identifies the DRA driver providing the capacity information.",
            0,
            lambda o: o["spec"].get("driver", ""),
        ),
        (
            "Pool",
            "string",
            "Pool describes the pool that this ResourceSlice belongs to.",
            0,
            lambda o: (o["spec"].get("pool") or {}).get("name", ""),
        ),
        _AGE,
    ],
    "resourceclaims.resource.k8s.io": [
        _NAME,
        (
            "State",
            "string",
            "A summary of the current state (allocated, pending, reserved, etc.).",
            0,
            _claim_state,
        ),
        _AGE,
    ],
    "pods": [
        _NAME,
        (
            "Ready",
            "string",
            "The aggregate readiness state of this pod for accepting traffic.",
            0,
            _pod_ready,
        ),
        (
            "Status",
            "string",
            "The aggregate status of the containers in this pod.",
            0,
            _pod_status,
        ),
        (
            "Restarts",
            "string",
            "The number of times the containers in this pod have been restarted.",
            0,
            lambda o: "0",
        ),
        _AGE,
        (
            "IP",
            "string",
            "IP address allocated to the pod.",
            1,
            lambda o: (o.get("status") or {}).get("podIP", "<none>"),
        ),
        (
            "Node",
            "string",
            "Name of the Node this pod is assigned to.",
            1,
            lambda o: (o.get("spec") or {}).get("nodeName") or "<none>",
        ),
    ],
    "nodes": [
        _NAME,
        ("Status", "string", "The status of the node", 0, _node_status),
        ("Roles", "string", "The roles of the node", 0, lambda o: "<none>"),
        _AGE,
        (
            "Version",
            "string",
            "Kubelet Version reported by the node.",
            0,
            lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
        ),
    ],
    "namespaces": [
        _NAME,
        (
            "Status",
            "string",
            "The status of the namespace",
            0,
            lambda o: (o.get("status") or {}).get("phase", ""),
        ),
        _AGE,
    ],
    "leases.coordination.k8s.io": [
        _NAME,
        (
            "Holder",
            "string",
            "The holder of the lease",
            0,
            lambda o: (o.get("spec") or {}).get("holderIdentity", ""),
        ),
        _AGE,
    ],
    "events": [
        ("Last Seen", "string", "Time of the last occurrence", 0, lambda o: age(_event_last_seen(o))),
        ("Type", "string", "Type of this event", 0, lambda o: o.get("type", "")),
        ("Reason", "string", "Reason of this event", 0, lambda o: o.get("reason", "")),
        (
            "Object",
            "string",
            "The object this event is about",
            0,
            lambda o: f"{_event_object(o).get('kind', '').lower()}/{_event_object(o).get('name', '')}",
        ),
        (
            "Message",
            "string",
            "A human-readable description of the event",
            0,
            lambda o: o.get("message", o.get("note", "")),
        ),
    ],
    "mutatingwebhookconfigurations.admissionregistration.k8s.io": [
        _NAME,
        (
            "Webhooks",
            "integer",
            "Webhooks indicates the number of webhooks",
            0,
            lambda o: len(o.get("webhooks") or []),
        ),
        _AGE,
    ],
    "validatingwebhookconfigurations.admissionregistration.k8s.io": [
        _NAME,
        (
            "Webhooks",
            "integer",
            "Webhooks indicates the number of webhooks",
            0,
            lambda o: len(o.get("webhooks") or []),
        ),
        _AGE,
    ],
}
#: The API server prints events.k8s.io/v1 Events with the core printer (one internal type).
COLUMNS["events.events.k8s.io"] = COLUMNS["events"]


def _json_path(path: str) -> Callable[[Obj], Any]:
    """A CRD printer column's simple JSONPath (``.status.used.memory``) as a cell function."""
    parts = [part for part in path.split(".") if part]

    def cell(obj: Obj) -> Any:
        value: Any = obj
        for part in parts:
            value = value.get(part) if isinstance(value, dict) else None
        return value  # None: kubectl prints <none>, as for the real server's nil cells

    return cell


def _printer_columns(rt: ResourceType) -> list[Column]:
    columns: list[Column] = [_NAME]
    for column in rt.printer_columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            columns.append((column["name"], "date", _AGE[2], 0, age))
        else:
            columns.append((column["name"], column["type"], "", 0, _json_path(column["jsonPath"])))
    return columns


def wants_table(accept: str) -> bool:
    return "as=Table" in accept.replace(" ", "")


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(
    rt: ResourceType,
    objs: list[Obj],
    resource_version: str,
    include: str = "Metadata",
    continue_token: str | None = None,
) -> Obj:
    """A Table for ``objs`` with the resource's columns (name and age for the rest)."""
    columns = COLUMNS.get(rt.key) or (_printer_columns(rt) if rt.printer_columns else [_NAME, _AGE])
    meta: Obj = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {"name": n, "type": t, "format": "name" if n == "Name" else "", "description": d, "priority": p}
            for n, t, d, p, _ in columns
        ],
        "rows": [
            {"cells": [cell(o) for *_, cell in columns], "object": _row_object(o, include)} for o in objs
        ],
    }
