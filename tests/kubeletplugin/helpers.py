"""Builders shared by the kubelet-plugin tests: claims as the API returns them, GPUs, CDI checks."""

from __future__ import annotations

import json
import re
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


_KIND = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_DEVICE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.:-]*")
_SEMVER = re.compile(r"\d+\.\d+\.\d+")


def _check_edits(edits: dict[str, Any], where: str) -> None:
    for env in edits.get("env") or ():
        assert "=" in env and not env.startswith("="), f"{where}: env {env!r} is not KEY=VALUE"
    for node in edits.get("deviceNodes") or ():
        assert node["path"].startswith("/"), f"{where}: deviceNode path {node['path']!r} is not absolute"
    for mount in edits.get("mounts") or ():
        assert mount["hostPath"].startswith("/") and mount["containerPath"].startswith("/"), (
            f"{where}: {mount}"
        )


def validate_cdi(spec: dict[str, Any]) -> None:
    """The CDI spec rules every consumer enforces, then the upstream JSON schema where present.

    The structural rules (version, kind and device-name grammar, env/deviceNode/mount shape) are
    always checked; the schema check needs ../shared and is reported as a skip by
    ``test_cdi_hamicore.py::test_written_specs_match_the_upstream_cdi_schema`` when it is absent.
    """
    assert _SEMVER.fullmatch(spec["cdiVersion"]), spec["cdiVersion"]
    assert _KIND.fullmatch(spec["kind"]), spec["kind"]
    assert spec["devices"], "a spec without devices"
    names = [device["name"] for device in spec["devices"]]
    assert len(names) == len(set(names)), f"duplicate device names: {names}"
    for device in spec["devices"]:
        assert _DEVICE_NAME.fullmatch(device["name"]), device["name"]
        assert any(device["containerEdits"].values()), device
        _check_edits(device["containerEdits"], device["name"])
    _check_edits(spec.get("containerEdits") or {}, "spec")
    schema_file = CDI_SCHEMA_DIR / "schema.json"
    if schema_file.is_file():
        validate_cdi_schema(spec)


def validate_cdi_schema(spec: dict[str, Any]) -> None:
    """Validate against the upstream CDI JSON schema (../shared/reference/upstream)."""
    schema_file = CDI_SCHEMA_DIR / "schema.json"
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


def stand_in_library(path: Path, version: str | None = "v2.9.0") -> Path:
    """A file the plugin accepts as libvgpu.so (a 64-bit ELF shared-object header for this CPU)
    plus its ``.version`` file; never loaded by these tests, so nothing more is needed."""
    import platform

    machine = {"x86_64": 62, "aarch64": 183}.get(platform.machine(), 62)
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + machine.to_bytes(2, "little")
    path.write_bytes(header + bytes(44))
    if version is not None:
        path.with_name(path.name + ".version").write_text(version + "\n")
    return path
