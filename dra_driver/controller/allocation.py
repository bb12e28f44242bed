"""A planned claim -> ``status.allocation`` exactly as the ``resource.k8s.io/v1`` API defines it.

* one result per device: ``request`` (``req`` or ``req/sub``), ``driver``, ``pool``, ``device``;
  our cards allow multiple allocations, so each result gets a fresh ``shareID`` (a UUID) and
  ``consumedCapacity`` listing every capacity (``memory``, ``cores``, ``slots``), even zero ones;
  a MIG instance (given out whole, ``whole_device``) gets neither, as kube-scheduler writes it;
  ``adminAccess`` results take nothing and carry ``adminAccess: true``; request tolerations are
  copied, as the scheduler copies them;
* ``config``: for each request the class's configs (``source: FromClass``, ``requests: [req]``),
  then the claim's configs (``source: FromClaim``, their own ``requests``), as kube-scheduler
  builds them, so the kubelet plugin sees the same thing whoever allocated;
* ``nodeSelector`` pins the node with ``matchFields metadata.name In [node]``;
* ``allocationTimestamp``: kube-scheduler 1.36+ (DRADeviceBindingConditions, beta and on by default)
  stamps an allocation that has none in its PreBind, and the API server refuses that change to an
  existing allocation ("field cannot be modified once set"), so a pod of ours would never bind.
  Allocating with the timestamp set leaves the scheduler only ``reservedFor`` to write; API
  servers with the gate off drop the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from dra_driver.contract import CORES, MEMORY, SLOTS
from dra_driver.controller.planner import ClaimPlan
from dra_driver.quantity import format_bytes
from dra_driver.resource.objects import DeviceClassView


def rfc3339_now() -> str:
    """Now as Kubernetes serialises ``metav1.Time`` (UTC, whole seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def build_allocation(
    plan: ClaimPlan,
    node: str,
    device_class: Callable[[str], DeviceClassView | None],
    request_classes: Mapping[str, str],
    new_uid: Callable[[], str] = lambda: str(uuid.uuid4()),
    now: Callable[[], str] = rfc3339_now,
) -> dict[str, Any]:
    results = []
    for result in plan.results:
        entry: dict[str, Any] = {
            "request": result.request,
            "driver": result.device.driver,
            "pool": result.device.pool,
            "device": result.device.device,
        }
        if result.admin_access:
            entry["adminAccess"] = True
        elif result.whole_device:
            pass  # a MIG instance is the result's alone: no shareID, so it takes the whole device
        else:
            entry["shareID"] = new_uid()
            entry["consumedCapacity"] = {
                MEMORY: format_bytes(result.share.memory),
                CORES: str(result.share.cores),
                SLOTS: str(result.share.tenants),
            }
        if result.tolerations:
            entry["tolerations"] = [dict(toleration) for toleration in result.tolerations]
        results.append(entry)
    config: list[dict[str, Any]] = []
    seen_requests = []
    for result in plan.results:
        if result.request not in seen_requests:
            seen_requests.append(result.request)
    for request in seen_requests:
        klass = device_class(request_classes[request])
        for class_entry in klass.config if klass is not None else ():
            if class_entry.get("opaque"):
                opaque = dict(class_entry["opaque"])
                config.append({"source": "FromClass", "requests": [request], "opaque": opaque})
    for claim_entry in plan.claim.config:
        if claim_entry.get("opaque"):
            copied: dict[str, Any] = {"source": "FromClaim", "opaque": dict(claim_entry["opaque"])}
            if claim_entry.get("requests"):
                copied["requests"] = list(claim_entry["requests"])
            config.append(copied)
    devices: dict[str, Any] = {"results": results}
    if config:
        devices["config"] = config
    return {"devices": devices, "nodeSelector": node_selector(node), "allocationTimestamp": now()}
