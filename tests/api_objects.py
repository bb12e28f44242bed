"""API objects for tests, made by the components that make them in a cluster.

Allocations come from the controller's ``build_allocation``, so a change to that writer shows up
in every reader's tests (``top``, ``simulate --from-cluster``) rather than as a reader that silently
reads an old shape.
"""

from __future__ import annotations

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.contract import DeviceId
from dra_driver.controller.allocation import build_allocation
from dra_driver.controller.planner import ClaimPlan, ResultPlan
from dra_driver.engine.model import DeviceShare
from dra_driver.kube.api import Obj
from dra_driver.resource.objects import ClaimView

DRIVER = DEFAULT_DRIVER_NAME


def allocated_claim(
    namespace: str,
    name: str,
    node: str,
    shares: list[tuple[int, int | None, int]],
    *,
    klass: str = DRIVER,
    admin: bool = False,
    reserved_for: tuple[tuple[str, str], ...] = (),
    owner: tuple[str, str] | None = None,
    driver: str = DRIVER,
) -> Obj:
    """A claim of one request ``gpu`` of ``klass``, allocated on ``node`` by our controller
    (``driver``: its name, another where tests share one API server).

    ``shares`` are (card index, memory bytes or None, cores); None memory is a whole-card result
    (no shareID, as kube-scheduler's first fit writes it), except with ``admin`` (adminAccess).
    ``reserved_for`` and ``owner`` are (pod name, pod uid).
    """
    raw: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}},
    }
    if owner is not None:
        raw["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner[0], "uid": owner[1], "controller": True}
        ]
    results = [
        ResultPlan(
            request="gpu",
            device=DeviceId(driver, node, f"gpu-{index}"),
            node=node,
            share=DeviceShare(index, memory or 0, cores),
            admin_access=admin,
            tolerations=(),
        )
        for index, memory, cores in shares
    ]
    allocation = build_allocation(
        ClaimPlan(ClaimView.parse(raw, driver), results), node, lambda _name: None, {"gpu": klass}
    )
    for result, (_, memory, _) in zip(allocation["devices"]["results"], shares, strict=True):
        if memory is None and not admin:
            del result["shareID"], result["consumedCapacity"]
    status: Obj = {"allocation": allocation}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid} for pod, uid in reserved_for]
    raw["status"] = status
    return raw
