"""Our controller over the in-memory API (``FakeKube``), driven pass by pass.

Objects go in as the informers would deliver them (``add``, ``replace``, ``remove``), passes run
by hand (``run``), and kube-scheduler's part (binding) is done by the test. No threads, no
sleeps: what a test asserts after ``run`` is what the controller decided.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from dra_driver.contract import ALLOCATED_CONDITION as CONDITION_TYPE
from dra_driver.controller.controller import Controller
from dra_driver.controller.retries import CommitBackoff
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, Obj, Resource
from dra_driver.kubeletplugin.slices import build_resource_slices
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, device_class, pod

_KINDS = {PODS.plural: "Pod", RESOURCE_CLAIMS.plural: "ResourceClaim"}


class RecordingPlanner:
    """The controller's planner, recording (pod name, candidate nodes) of every plan."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.plans: list[tuple[str, frozenset[str]]] = []

    def plan(self, pod: Obj, inputs: Any, allowed: frozenset[str], pinned: str | None) -> Any:
        self.plans.append((str(pod["metadata"]["name"]), allowed))
        return self.inner.plan(pod, inputs, allowed, pinned)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FakeCluster:
    def __init__(
        self,
        nodes: Sequence[str] = ("node-1",),
        gpus: int = 1,
        profile: str = "h100-80gb",
        backoff: CommitBackoff | None = None,
    ) -> None:
        self.kube = FakeKube()
        self.controller = Controller(self.kube, DRIVER, write_workers=0, backoff=backoff)
        slices = []
        for node in nodes:
            self.add(NODES, {"metadata": {"name": node}, "status": {"allocatable": {}}}, kind="Node")
            slices += build_resource_slices(
                profile_gpus(profile, node_name=node, gpus=gpus), node_name=node, driver_name=DRIVER
            )
        self.controller.cache.refresh_inventory(slices)
        self.add(DEVICE_CLASSES, device_class(DRIVER), kind="DeviceClass")
        self.stamp = 0

    # --- what the informers deliver ---------------------------------------------------------------
    def add(self, resource: Resource, body: Obj, *, kind: str | None = None) -> Obj:
        stored = self.kube.put(resource, body)
        self.controller._on_change(kind or _KINDS[resource.plural], None, stored)
        return stored

    def remove(self, resource: Resource, name: str) -> Obj:
        gone = self.kube.objects.pop((resource.plural, NS, name))
        self.controller._on_change(_KINDS[resource.plural], gone, None)
        return gone

    def pod(self, name: str, claim_body: Obj, annotations: dict[str, str] | None = None) -> None:
        """A claim named ``name`` and a gated pod of the same name using it, created in this order."""
        claim_body = copy.deepcopy(claim_body)
        claim_body["metadata"]["name"] = name
        self.add(RESOURCE_CLAIMS, claim_body)
        body = pod(name, {"gpu": f"claim:{name}"}, annotations=annotations)
        self.stamp += 1
        body["metadata"]["creationTimestamp"] = f"2026-12-01T00:{self.stamp // 60:02d}:{self.stamp % 60:02d}Z"
        self.add(PODS, body)

    def bind(self, name: str, node: str = "node-1") -> None:
        """What kube-scheduler does once the gate is gone."""
        old = self.kube.stored(PODS, NS, name)
        bound = copy.deepcopy(old)
        bound["spec"]["nodeName"] = node
        self.controller._on_change("Pod", old, self.kube.put(PODS, bound))

    def run(self, passes: int = 3) -> None:
        for _ in range(passes):
            self.controller.run_once()  # never raises, whatever the objects say

    # --- what the controller wrote -----------------------------------------------------------------
    def gated(self, name: str) -> bool:
        return bool(self.kube.stored(PODS, NS, name)["spec"].get("schedulingGates"))

    def condition(self, name: str) -> dict[str, Any] | None:
        conditions = (self.kube.stored(PODS, NS, name).get("status") or {}).get("conditions") or ()
        return next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)

    def booked_memory(self) -> int:
        return sum(use.memory for uses in self.controller.cache.ledger.claims().values() for use in uses)
