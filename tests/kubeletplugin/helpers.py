"""Builders shared by the kubelet-plugin tests: claims as the API returns them, GPUs, CDI checks."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin.inventory import NodeGpu
from tests.kubeletplugin.upstream import CDI_SCHEMA_DIR

DRIVER = "gpu.hami.io"
GIB = 1024**3


def gpu(index: int, bus: str | None = None, memory: int = 15 * GIB) -> NodeGpu:
    return NodeGpu(
        name=f"gpu-{index}",
        index=index,
        minor=index,
        uuid=f"GPU-{index:08d}",
        pci_bus_id=bus or f"0000:{0x20 + index:02x}:00.0",
        memory_bytes=memory,
    )


def result(
    device: str,
    *,
    request: str = "gpu",
    pool: str = "node-1",
    driver: str = DRIVER,
    share: bool = True,
    memory: str = "1000Mi",
    cores: int = 30,
    slots: int = 1,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share:
        entry["shareID"] = str(uuid.uuid4())
        entry["consumedCapacity"] = {"memory": memory, "cores": str(cores), "slots": str(slots)}
    return entry


def claim(
    name: str, results: list[dict[str, Any]], *, namespace: str = "default", uid: str | None = None
) -> dict[str, Any]:
    """A ResourceClaim with an allocation (spec requests named after the results' base requests)."""
    requests = sorted({r["request"].split("/")[0] for r in results}) or ["gpu"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r,
                        "exactly": {
                            "deviceClassName": "gpu.hami.io",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                    for r in requests
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def validate_cdi(spec: dict[str, Any]) -> None:
    """Validate against the CDI JSON schema when ../shared is present (structure checks otherwise)."""
    assert spec["cdiVersion"] and spec["kind"] and spec["devices"]
    for device in spec["devices"]:
        assert device["name"] and any(device["containerEdits"].values()), device
    schema_file = CDI_SCHEMA_DIR / "schema.json"
    if not schema_file.is_file():
        return
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    defs = json.loads((CDI_SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    schema = json.loads(schema_file.read_text())
    jsonschema.Draft7Validator(schema, registry=registry).validate(spec)


def read_spec(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
