"""Our controller over the in-memory API (``FakeKube``), driven pass by pass.

Objects go in as the informers would deliver them (``add``, ``change``, ``remove``, ``slice``),
passes run by hand (``run``, ``drain``), and kube-scheduler's part (binding) is done by the test.
No threads, no sleeps: what a test asserts after ``run`` is what the controller decided.
``record_plans=True`` records every plan the planner is asked for (``planned``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from dra_driver.contract import ALLOCATED_CONDITION as CONDITION_TYPE
from dra_driver.controller.controller import Controller
from dra_driver.controller.retries import PENDING_RETRIES_PER_PASS, CommitBackoff
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Obj,
    Resource,
)
from dra_driver.kube.watch import object_key
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request

#: The kind the informer of each resource delivers.
_KINDS = {
    resource.plural: kind
    for kind, resource in {
        "Pod": PODS,
        "ResourceClaim": RESOURCE_CLAIMS,
        "DeviceClass": DEVICE_CLASSES,
        "Node": NODES,
        "GpuQuota": GPU_QUOTAS,
        "ResourceSlice": RESOURCE_SLICES,
    }.items()
}
CARD = "81043Mi"  # an H100 80GB's whole memory as the simulated profile publishes it (total minus reserved)
#: Three one-card nodes: ``FakeCluster(nodes=THREE_NODES)``.
THREE_NODES = ("node-0", "node-1", "node-2")


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
    """``nodes`` with ``gpus`` cards of ``profile`` each and our DeviceClass; the ResourceSlice
    informer holds the nodes' slices, as it would have listed them."""

    def __init__(
        self,
        nodes: Sequence[str] = ("node-1",),
        gpus: int = 1,
        profile: str = "h100-80gb",
        backoff: CommitBackoff | None = None,
        *,
        pending_batch: int = PENDING_RETRIES_PER_PASS,
        record_plans: bool = False,
    ) -> None:
        self.kube = FakeKube()
        self.controller = Controller(
            self.kube, DRIVER, write_workers=0, backoff=backoff, pending_batch=pending_batch
        )
        self.planner: RecordingPlanner | None = None
        if record_plans:
            self.planner = RecordingPlanner(self.controller.allocator.planner)
            self.controller.allocator.planner = self.planner  # type: ignore[assignment]
        self.nodes = list(nodes)
        slices = []
        for node in nodes:
            self.add(NODES, {"metadata": {"name": node}, "status": {"allocatable": {}}})
            slices += build_resource_slices(
                profile_gpus(profile, node_name=node, gpus=gpus), node_name=node, driver_name=DRIVER
            )
        self.controller.informers["ResourceSlice"].cache = {object_key(item): item for item in slices}
        self.controller.cache.refresh_inventory(slices)
        self.add(DEVICE_CLASSES, device_class(DRIVER))
        self.stamp = 0

    # --- what the informers deliver ---------------------------------------------------------------
    def add(self, resource: Resource, body: Obj, *, kind: str | None = None) -> Obj:
        stored = self.kube.put(resource, body)
        self.controller._on_change(kind or _KINDS[resource.plural], None, stored)
        return stored

    def change(
        self, resource: Resource, namespace: str | None, name: str, edit: Callable[[Obj], object]
    ) -> None:
        """``edit`` the stored object, and deliver the update as its informer would."""
        old = self.kube.stored(resource, namespace, name)
        new = copy.deepcopy(old)
        edit(new)
        self.controller._on_change(_KINDS[resource.plural], old, self.kube.put(resource, new))

    def remove(self, resource: Resource, name: str, namespace: str | None = NS) -> Obj:
        gone = self.kube.objects.pop((resource.plural, namespace or "", name))
        self.controller._on_change(_KINDS[resource.plural], gone, None)
        return gone

    def release(self, name: str) -> None:
        """The claim's pod finished and the claim went (what its informer would deliver)."""
        self.remove(RESOURCE_CLAIMS, name)

    def slice(self, new: Obj, old: Obj | None = None) -> None:
        """A ResourceSlice added (or ``old`` replaced): into the informer's cache, then delivered."""
        self.controller.informers["ResourceSlice"].cache[object_key(new)] = new
        self.controller._on_change("ResourceSlice", old, self.kube.put(RESOURCE_SLICES, new))

    @property
    def slices(self) -> dict[str, Obj]:
        """The ResourceSlices the informer holds, by key."""
        return self.controller.informers["ResourceSlice"].cache

    def pod(
        self,
        name: str,
        claim_body: Obj,
        annotations: dict[str, str] | None = None,
        *,
        namespace: str = NS,
        node_selector: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> None:
        """A claim named ``name`` and a gated pod of the same name using it, created in this order
        (each pod a second younger than the one before); ``priority``: the ``spec.priority``
        admission would have resolved from its PriorityClass."""
        claim_body = copy.deepcopy(claim_body)
        claim_body["metadata"]["name"] = name
        claim_body["metadata"]["namespace"] = namespace
        self.add(RESOURCE_CLAIMS, claim_body)
        body = pod(name, {"gpu": f"claim:{name}"}, annotations=annotations)
        body["metadata"]["namespace"] = namespace
        if node_selector:
            body["spec"]["nodeSelector"] = node_selector
        if priority is not None:
            body["spec"]["priority"] = priority
        self.stamp += 1
        body["metadata"]["creationTimestamp"] = f"2026-12-01T{self.stamp // 3600:02d}:" + (
            f"{self.stamp // 60 % 60:02d}:{self.stamp % 60:02d}Z"
        )
        self.add(PODS, body)

    def gpu_pod(
        self, name: str, memory: str, count: int = 1, *, klass: str = DRIVER, **pod_args: Any
    ) -> None:
        """``pod`` with a claim of one request: ``count`` devices of ``klass``, ``memory`` each."""
        self.pod(name, claim(name, request(memory=memory, count=count, klass=klass)), **pod_args)

    def quota(self, namespace: str, memory: str) -> None:
        """GpuQuota ``team`` of ``namespace``: at most ``memory`` of GPU memory."""
        self.add(GPU_QUOTAS, {
            "apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuQuota",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"hard": {"memory": memory}},
        })  # fmt: skip

    def bind(self, name: str, node: str = "node-1") -> None:
        """What kube-scheduler does once the gate is gone."""
        old = self.kube.stored(PODS, NS, name)
        bound = copy.deepcopy(old)
        bound["spec"]["nodeName"] = node
        self.controller._on_change("Pod", old, self.kube.put(PODS, bound))

    def run(self, passes: int = 3) -> None:
        for _ in range(passes):
            self.controller.run_once()  # never raises, whatever the objects say

    def drain(self, limit: int = 1000) -> int:
        """Passes until no pending retry is queued (at least one); how many."""
        passes = 0
        while passes == 0 or self.controller.queue.woken:
            assert passes < limit, "the retry queue does not drain"
            self.controller.run_once()
            passes += 1
        return passes

    # --- what the controller did -------------------------------------------------------------------
    def gated(self, name: str, namespace: str = NS) -> bool:
        return bool(self.kube.stored(PODS, namespace, name)["spec"].get("schedulingGates"))

    def condition(self, name: str, namespace: str = NS) -> dict[str, Any] | None:
        conditions = (self.kube.stored(PODS, namespace, name).get("status") or {}).get("conditions") or ()
        return next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)

    def reason(self, name: str, namespace: str = NS) -> str | None:
        """Why the pod waits, as last reported (None: not reported)."""
        uid = str(self.kube.stored(PODS, namespace, name)["metadata"]["uid"])
        return self.controller.queue.reports.reason(uid)

    def node_of(self, claim_name: str, namespace: str = NS) -> str:
        """The node of the claim's first allocated device."""
        allocation = self.kube.stored(RESOURCE_CLAIMS, namespace, claim_name)["status"]["allocation"]
        return str(allocation["devices"]["results"][0]["pool"])

    def planned(self) -> list[tuple[str, frozenset[str]]]:
        """The plans recorded since the last call (``record_plans=True``)."""
        assert self.planner is not None, "FakeCluster(record_plans=True) records plans"
        plans, self.planner.plans = self.planner.plans, []
        return plans

    def booked_memory(self) -> int:
        return sum(use.memory for uses in self.controller.cache.ledger.claims().values() for use in uses)


def full_cluster(*, pending_batch: int = PENDING_RETRIES_PER_PASS) -> FakeCluster:
    """``THREE_NODES``, each card held whole by ``hold-<node>``; every plan recorded."""
    cluster = FakeCluster(THREE_NODES, pending_batch=pending_batch, record_plans=True)
    for name in cluster.nodes:
        cluster.gpu_pod(f"hold-{name}", CARD)
        cluster.run()
    assert not any(cluster.gated(f"hold-{name}") for name in cluster.nodes)
    return cluster
