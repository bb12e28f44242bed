"""A running claim keeps its share: a claim deleted past our finalizer (a tenant stripped it) while
a bound pod still names it stays booked in the ledger and the quota until that pod ends.

The admission policy (charts/hami-dra/templates/tenant-policies.yaml) refuses stripping the
finalizer of an allocated claim; this is the controller's own defence where it is not installed.
"""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.controller.controller import Controller
from dra_driver.controller.kube import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, Obj
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.slices import build_resource_slices
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request

NODE = "node-1"


class OneCard:
    """The controller over the in-memory API with one H100 80GB; kube-scheduler's part by hand."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.controller = Controller(self.kube, DRIVER, write_workers=0)
        self.add("Node", NODES, {"metadata": {"name": NODE}, "status": {"allocatable": {}}})
        self.controller.reconciler.refresh_inventory(
            build_resource_slices(
                profile_gpus("h100-80gb", node_name=NODE, gpus=1), node_name=NODE, driver_name=DRIVER
            )
        )
        self.add("DeviceClass", DEVICE_CLASSES, device_class(DRIVER))

    def add(self, kind: str, resource: Any, body: Obj) -> Obj:
        stored = self.kube.put(resource, body)
        self.controller._on_change(kind, None, stored)
        return stored

    def pod(self, name: str, memory: str) -> None:
        self.add("ResourceClaim", RESOURCE_CLAIMS, claim(name, request(memory=memory)))
        self.add("Pod", PODS, pod(name, {"gpu": f"claim:{name}"}))
        self.run()

    def run(self) -> None:
        for _ in range(3):
            self.controller.run_once()

    def gated(self, name: str) -> bool:
        return bool(self.kube.stored(PODS, NS, name)["spec"].get("schedulingGates"))

    def bind(self, name: str) -> None:
        """What kube-scheduler does once the gate is gone."""
        old = self.kube.stored(PODS, NS, name)
        bound = copy.deepcopy(old)
        bound["spec"]["nodeName"] = NODE
        self.controller._on_change("Pod", old, self.kube.put(PODS, bound))
        self.run()

    def strip_and_delete_claim(self, name: str) -> None:
        """The tenant's attack: the finalizer removed, the claim deleted (its allocation intact)."""
        gone = self.kube.objects.pop((RESOURCE_CLAIMS.plural, NS, name))
        gone["metadata"]["finalizers"] = []
        self.controller._on_change("ResourceClaim", gone, None)
        self.run()

    def delete_pod(self, name: str) -> None:
        gone = self.kube.objects.pop((PODS.plural, NS, name))
        self.controller._on_change("Pod", gone, None)
        self.run()

    def booked_memory(self) -> int:
        return sum(use.memory for uses in self.controller.reconciler.ledger.claims().values() for use in uses)


def test_a_deleted_claim_of_a_running_pod_stays_booked_until_the_pod_ends() -> None:
    card = OneCard()
    card.pod("runner", "60Gi")
    assert not card.gated("runner")
    card.bind("runner")
    card.strip_and_delete_claim("runner")
    assert card.booked_memory() == 60 * 1024**3
    card.pod("second", "60Gi")
    assert card.gated("second"), "the card still holds the running pod's 60Gi"
    card.delete_pod("runner")
    assert card.booked_memory() == 60 * 1024**3  # now the second pod's
    assert not card.gated("second")
    assert card.controller.reconciler.orphans == {}


def test_a_deleted_claim_of_a_pod_that_never_ran_is_not_kept() -> None:
    card = OneCard()
    card.pod("runner", "60Gi")
    # The gate is lifted but kube-scheduler never bound it: no container can hold the card.
    card.strip_and_delete_claim("runner")
    assert card.booked_memory() == 0
    card.pod("second", "60Gi")
    assert not card.gated("second")
