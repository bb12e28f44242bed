"""Each recipe of the seed's table end to end on the real control plane: webhook gate -> controller
allocation -> kube-scheduler binding -> real kubelet plugin (child process) prepares the claim
through the kubelet simulator (tests/controller/plane_driver.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.kube.api import PODS
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import (
    DRIVER,
    NS,
    Harness,
    claim,
    device_class,
    plane_harness,
    pod,
    request,
    wait_for,
)
from tests.controller.plane_driver import PlaneNode, plane_node, plane_webhook, short_directory

INDEX = 'device.attributes["gpu.hami.io"].index == {}'
# The seed's worked-example state: gpu-0 two 1000Mi tenants (3.30), gpu-1 one (1.65), gpu-2/3 idle.
RECIPES = [
    ("binpack", "gpu-0"),
    ("spread", "gpu-2"),
    ("mutex", "gpu-2"),
    ("binpack,numa", "gpu-0"),
    ("mutex,binpack", "gpu-2"),
    ("mutex,binpack,numa", "gpu-2"),
]


@pytest.fixture
def e2e(controller_plane: ControlPlane) -> Iterator[tuple[Harness, PlaneNode]]:
    """node-1 kept Ready on the real control plane, its kubelet and our plugin, our webhook."""
    with (
        short_directory() as root,  # the plugin's socket paths must stay under 108 bytes
        plane_harness(controller_plane) as h,
        plane_webhook(controller_plane, root) as _,
        plane_node(controller_plane, "node-1", root / "node-1") as node,
    ):
        yield h, node


@pytest.mark.slow
def test_recipes_end_to_end(e2e: tuple[Harness, PlaneNode]) -> None:
    h, node = e2e
    h.create_class(device_class(DRIVER))
    controller = h.start_controller()
    wait_for(
        lambda: (
            len(controller.cache.ledger.inventory.get("node-1", ()).devices) == 4  # type: ignore[union-attr]
            if "node-1" in controller.cache.ledger.inventory
            else False
        ),
        timeout=30,
        what="slices published",
    )
    for name, index in (("t1", 0), ("t2", 0), ("t3", 1)):
        h.create_claim(claim(name, request(memory="1000Mi", selectors=[INDEX.format(index)])))
        created = h.create_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False))
        assert created["spec"]["schedulingGates"] == [
            {"name": "gpu.hami.io/allocation"}
        ]  # the webhook gated it
    for name in ("t1", "t2", "t3"):
        wait_for(lambda name=name: h.bound_node(f"{name}-pod"), what=f"{name} bound")
    kubelet = node.kubelet
    for number, (recipe, expected) in enumerate(RECIPES):
        name = f"r{number}"
        h.create_claim(claim(name, request(memory="1000Mi")))
        annotations = {"hami.io/gpu-scheduler-policy": recipe}
        created = h.create_pod(
            pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False, annotations=annotations)
        )
        wait_for(lambda name=name: h.bound_node(f"{name}-pod"), what=f"{recipe} bound")
        assert h.devices_of(name) == [f"node-1/{expected}"], recipe
        uid = created["metadata"]["uid"]
        ids = wait_for(lambda uid=uid: kubelet.cdi_ids(uid), timeout=15, what=f"{recipe} prepared")
        assert any(cdi.startswith("k8s.gpu.hami.io/gpu=") for cdi in ids), ids
        h.kube.delete(PODS, NS, f"{name}-pod")
        wait_for(lambda name=name: not h.allocated(name), timeout=15, what=f"{recipe} released")
    assert not kubelet.errors


@pytest.mark.slow
def test_webhook_rejects_invalid_gpuconfig_through_the_api(e2e: tuple[Harness, PlaneNode]) -> None:
    h, _ = e2e
    from dra_driver.kube.errors import KubeError

    with pytest.raises(KubeError) as err:
        h.create_class(device_class("bad", {"policy": "mutex,packed"}))
    assert err.value.status in (400, 403, 422)
    assert "unknown policy name(s) 'packed'" in err.value.message


@pytest.mark.slow
def test_webhook_rejects_two_limited_claims_in_one_container(e2e: tuple[Harness, PlaneNode]) -> None:
    h, _ = e2e
    from dra_driver.kube.errors import KubeError

    h.create_class(device_class(DRIVER))
    h.create_claim(claim("lim-a", request(memory="1Gi")))
    h.create_claim(claim("lim-b", request(memory="1Gi")))
    with pytest.raises(KubeError) as err:
        h.create_pod(pod("two-limits", {"a": "claim:lim-a", "b": "claim:lim-b"}, gated=False))
    two = "container main consumes claim a with memory/cores limits together with another GPU (claim b)"
    assert two in err.value.message
