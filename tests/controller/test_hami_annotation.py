"""``hami.io/vgpu-devices-allocated`` (``dra_driver/controller/hami_annotation.py``): which container
gets which results, and what an unpublished card counts."""

from __future__ import annotations

from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.controller.hami_annotation import encode_devices_allocated
from dra_driver.engine import MIB, GpuCard
from dra_driver.resource.objects import PodView
from dra_driver.resource.refs import AllocationResult, allocation_results

DRIVER = "gpu.hami.io"
CARD = GpuCard(node="n1", index=0, memory=16384 * MIB, uuid="GPU-aaaa")


def results(*entries: dict[str, Any]) -> tuple[AllocationResult, ...]:
    return allocation_results({"devices": {"results": list(entries)}})


def result(request: str, device: str, driver: str = DRIVER, memory: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": "n1", "device": device}
    if memory is not None:
        entry |= {"shareID": "00000000-0000-0000-0000-000000000001", "consumedCapacity": {"memory": memory}}
    return entry


def pod(*containers: list[dict[str, str]]) -> PodView:
    specs = [{"name": f"c{i}", "resources": {"claims": claims}} for i, claims in enumerate(containers)]
    return PodView({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": specs}})


def known(device: DeviceId) -> GpuCard | None:
    return CARD if device.device == "gpu-0" else None


def test_a_container_gets_only_the_results_of_the_request_it_consumes() -> None:
    claim = results(result("small", "gpu-0", memory="1Gi"), result("big", "gpu-1"))
    value = encode_devices_allocated(
        pod([{"name": "g", "request": "small"}], [{"name": "g", "request": "big"}]),
        {"g": claim},
        DRIVER,
        known,
    )
    # gpu-1 is not published: its name stands in for the UUID, and the whole card counts no memory
    # and all of its compute.
    assert value == "GPU-aaaa,NVIDIA,1024,0:;gpu-1,NVIDIA,0,100:;"


def test_another_drivers_results_are_not_hamis() -> None:
    claim = results(result("gpu", "gpu-0", memory="2Gi"), result("gpu", "nic-0", driver="rdma.example.com"))
    assert (
        encode_devices_allocated(pod([{"name": "g"}]), {"g": claim}, DRIVER, known)
        == "GPU-aaaa,NVIDIA,2048,0:;"
    )
    only_theirs = results(result("gpu", "nic-0", driver="rdma.example.com"))
    assert encode_devices_allocated(pod([{"name": "g"}]), {"g": only_theirs}, DRIVER, known) is None
