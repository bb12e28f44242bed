"""Small object builders shared by the sandbox tests."""

from __future__ import annotations

from dra_driver.kube.api import Obj

DRIVER = "gpu.hami.io"


def slice_obj(name: str, node: str, devices: int = 2, driver: str = DRIVER) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"index": {"int": i}, "driverVersion": {"version": "550.54.15"}},
                    "capacity": {"memory": {"value": "15Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def claim_obj(name: str, requests: tuple[str, ...] = ("gpu",)) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests]}
        },
    }


def allocation(node: str, device: str = "gpu-0", request: str = "gpu") -> Obj:
    return {
        # Written by another allocator: kube-scheduler 1.36+ refuses to bind without it.
        "allocationTimestamp": "2026-01-01T00:00:00Z",
        "devices": {"results": [{"request": request, "driver": DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def pod_obj(name: str, node: str | None = None, claims: list[Obj] | None = None) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if claims:
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def node_obj(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
