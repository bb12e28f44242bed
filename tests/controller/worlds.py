"""The worlds the controller's module tests build, and their builders (objects: harness.py).

``CacheWorld``: a ``ClusterCache`` and the ``Allocator`` over it, and nothing else: no API, fake
or real (the allocator's tests, most of the cache's). ``World``: the worker (``Controller``, no
informers, no writer pool) over ``FakeKube``, whose binder and releaser write through it (their
tests, the cache's folding of writes, the worker's glue). In both, objects reach the cache the way
the informers deliver them, through ``ClusterCache.apply_event``; tests drive the pieces directly.
``planner``: a ledger over one node's cards and a planner on it (the planner's and allocation's
tests).
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.contract import ALLOCATED_CONDITION
from dra_driver.controller.allocator import Allocator, Placed
from dra_driver.controller.binder import BindResult
from dra_driver.controller.cache import ClusterCache, Wake
from dra_driver.controller.controller import Controller
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.planner import PlanInput, Planner, PodPlan
from dra_driver.controller.slim import keep_pod
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    Obj,
    Resource,
)
from dra_driver.resource.nodes import NodeView
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.requests import claim_requests
from dra_driver.resource.slice_builder import build_resource_slices
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request

NODE = "node-1"
#: The resource of each kind a world stores.
RESOURCES: dict[str, Resource] = {
    "Pod": PODS,
    "ResourceClaim": RESOURCE_CLAIMS,
    "DeviceClass": DEVICE_CLASSES,
    "Node": NODES,
    "GpuQuota": GPU_QUOTAS,
    "ResourceQuota": RESOURCE_QUOTAS,
}


def edited(view: PodView, edit: Callable[[Obj], object]) -> PodView:
    """A changed copy of a pod, parsed again (a view is never edited in place)."""
    raw = copy.deepcopy(dict(view))
    edit(raw)
    return PodView.parse(raw)


def node_object(name: str, allocatable: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": dict(allocatable or {})}}  # fmt: skip


def slices_for(nodes: Iterable[str], gpus: int, profile: str = "t4") -> list[Obj]:
    """Our ResourceSlices for ``gpus`` simulated cards of ``profile`` on each node."""
    return [
        item
        for name in nodes
        for item in build_resource_slices(
            profile_gpus(profile, node_name=name, gpus=gpus), node_name=name, driver_name=DRIVER
        )
    ]


def other_class(name: str = "other") -> Obj:
    """A DeviceClass of another driver."""
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "x"'}}]},
    }


def shared_on_gpu0(share_id: str, memory: str, cores: str = "0", node: str = NODE) -> Obj:
    """``status.allocation`` with one shared result on gpu-0, as another allocator writes it."""
    result = {
        "request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0", "shareID": share_id,
        "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
    }  # fmt: skip
    return {"devices": {"results": [result]}}


class Feed:
    """Objects into a world's cache as its informers deliver them; ``_store`` keeps the stored copy."""

    cache: ClusterCache
    allocator: Allocator

    def __init__(self, gpus: int, nodes: Sequence[str], profile: str) -> None:
        for name in nodes:
            self.add_node(name)
        self.cache.refresh_inventory(slices_for(nodes, gpus, profile))
        self.add_class(device_class(DRIVER))

    def _store(self, kind: str, obj: Obj) -> tuple[Obj | None, Obj]:
        """Store ``obj`` (stamped like the API server does); returns (previous copy, stored copy)."""
        raise NotImplementedError

    def deliver(self, kind: str, obj: Obj) -> Wake:
        """Store the object and hand the change to the cache; returns whom it wakes."""
        old, new = self._store(kind, obj)
        return self.cache.apply_event(kind, old, new)

    def add_node(self, name: str, allocatable: dict[str, str] | None = None) -> NodeView:
        self.deliver("Node", node_object(name, allocatable))
        return self.cache.nodes[name]

    def add_class(self, obj: Obj) -> None:
        self.deliver("DeviceClass", obj)

    def add_claim(self, obj: Obj) -> ClaimView:
        self.deliver("ResourceClaim", obj)
        return self.cache.claims[f"{obj['metadata'].get('namespace') or NS}/{obj['metadata']['name']}"]

    def add_pod(self, obj: Obj) -> PodView:
        self.deliver("Pod", obj)
        return self.cache.pods[f"{obj['metadata'].get('namespace') or NS}/{obj['metadata']['name']}"]

    def pod_view(self, name: str) -> PodView:
        return self.cache.pods[f"{NS}/{name}"]

    def edited_pod(self, name: str, edit: Callable[[Obj], object]) -> PodView:
        return edited(self.pod_view(name), edit)

    def allocate(self, pod_name: str, only_nodes: frozenset[str] | None = None) -> Any:
        return self.allocator.allocate(self.pod_view(pod_name), only_nodes)


class CacheWorld(Feed):
    """The cluster cache of ``nodes`` with ``gpus`` cards each and our DeviceClass, and an
    allocator over it; objects are stamped here (uid, resourceVersion, creation time)."""

    def __init__(self, gpus: int = 2, *, nodes: Sequence[str] = (NODE,), profile: str = "t4") -> None:
        self.metrics = ControllerMetrics()
        self.cache = ClusterCache(DRIVER, self.metrics)
        self.allocator = Allocator(self.cache, ControllerDefaults(), self.metrics)
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self._versions = itertools.count(1)
        super().__init__(gpus, nodes, profile)

    def _store(self, kind: str, obj: Obj) -> tuple[Obj | None, Obj]:
        body = copy.deepcopy(obj)
        meta = body.setdefault("metadata", {})
        key = (kind, str(meta.get("namespace") or ""), str(meta["name"]))
        old = self.objects.get(key)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-12-01T00:00:00Z")
        meta["resourceVersion"] = str(next(self._versions))
        body.setdefault("apiVersion", RESOURCES[kind].api_version)
        body.setdefault("kind", kind)
        self.objects[key] = body
        return (None if old is None else copy.deepcopy(old)), copy.deepcopy(body)

    def assume(self, placed: Placed) -> None:
        """What the worker does with a placement: its uses are counted while it is written."""
        self.cache.assume((write.claim, write.uses) for write in placed.writes)


class World(Feed):
    """``FakeKube`` and a controller (no informers, no writer pool) whose cache follows every
    object put or written; tests drive its pieces directly: ``decide``, ``binder``, ``releaser``."""

    def __init__(self, gpus: int = 2, *, nodes: Sequence[str] = (NODE,), leading: bool = True) -> None:
        self.kube = FakeKube()
        self.leading = leading
        self.controller = Controller(
            self.kube, DRIVER, ControllerDefaults(), identity="test", write_workers=0,
            is_leader=lambda: self.leading,
        )  # fmt: skip
        self.metrics = self.controller.metrics
        self.cache = self.controller.cache
        self.allocator = self.controller.allocator
        self.binder = self.controller.binder
        self.releaser = self.controller.releaser
        self.reports = self.controller.queue.reports
        super().__init__(gpus, nodes, "t4")

    def _store(self, kind: str, obj: Obj) -> tuple[Obj | None, Obj]:
        resource = RESOURCES[kind]
        meta = obj["metadata"]
        old = self.kube.objects.get((resource.plural, meta.get("namespace") or "", meta["name"]))
        return (None if old is None else copy.deepcopy(old)), self.kube.put(resource, obj)

    def deliver(self, kind: str, obj: Obj) -> Wake:
        """Store the object and hand the change to the cache as the informer does: a pod as its
        transform keeps it (dra_driver/controller/slim.py), so every test places slim pods."""
        old, new = self._store(kind, obj)
        if kind == "Pod":
            old, new = (None if old is None else keep_pod(old)), keep_pod(new)
        return self.cache.apply_event(kind, old, new)

    def fence(self, pod_view: PodView) -> None:
        """What reporting the pod pending does first: fence its claims, fold what was seen."""
        claims = [c for _, c in self.cache.pod_claims(pod_view) if c is not None]
        for seen in self.binder.fence(claims):
            self.cache.wrote(seen)

    def observe_claim(self, obj: Obj) -> ClaimView:
        """The informer's event for a claim as the API now holds it (``obj``)."""
        view = self.cache.claim_view(obj)
        cached = self.cache.claims.get(view.key)
        self.cache.apply_event("ResourceClaim", None if cached is None else dict(cached), dict(view))
        return self.cache.claims[view.key]

    def sync(self) -> None:
        """What the informers would deliver: the API's current claims and pods."""
        for (plural, _, _), obj in list(self.kube.objects.items()):
            if plural == "resourceclaims":
                self.observe_claim(copy.deepcopy(obj))
            elif plural == "pods":
                key = f"{obj['metadata'].get('namespace') or ''}/{obj['metadata']['name']}"
                cached = self.cache.pods.get(key)
                self.cache.apply_event(
                    "Pod", None if cached is None else dict(cached), keep_pod(copy.deepcopy(obj))
                )

    def decide(self, pod_name: str) -> Any:
        """What a pass does for the pod: decide, then the failure's writes (fence, report)."""
        outcome = self.controller.decide(self.pod_view(pod_name))
        self.controller.failures.handle()
        return outcome

    def planned(self, pod_name: str) -> Placed:
        """The pod decided: a placement, assumed in the cache (not written yet)."""
        outcome = self.decide(pod_name)
        assert isinstance(outcome, Placed), outcome
        return outcome

    def place(self, pod_name: str) -> BindResult:
        """Decide, bind, fold the result back, and deliver what the API now holds."""
        result = self.binder.bind(self.planned(pod_name))
        self.controller.apply(result)
        self.sync()
        return result

    def claim(self, name: str) -> Obj:
        return self.kube.stored(RESOURCE_CLAIMS, NS, name)

    def pod(self, name: str) -> Obj:
        return self.kube.stored(PODS, NS, name)

    def event_objects(self) -> list[Obj]:
        return [o for (plural, _, _), o in self.kube.objects.items() if plural == "events"]

    def events(self) -> list[str]:
        return [str(o.get("message")) for o in self.event_objects()]

    def devices(self, name: str) -> list[str]:
        """The devices the API holds allocated to claim ``name``."""
        allocation = self.claim(name).get("status", {}).get("allocation") or {}
        return [r["device"] for r in allocation.get("devices", {}).get("results", [])]

    def condition(self, pod_name: str) -> Obj | None:
        """Our condition on the pod, as the API holds it."""
        for item in self.pod(pod_name).get("status", {}).get("conditions") or ():
            if item["type"] == ALLOCATED_CONDITION:
                return dict(item)
        return None


def tenant(world: Feed, name: str, memory: str = "1Gi", klass: str = DRIVER, **kwargs: Any) -> None:
    """Claim ``name`` (one request of ``memory``) and gated pod ``<name>-pod`` using it."""
    world.add_claim(claim(name, request(klass=klass, memory=memory, **kwargs)))
    world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def two_claims_pod(world: Feed) -> None:
    """Gated pod ``p`` with two fresh claims, c1 and c2."""
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    world.add_pod(pod("p", {"one": "claim:c1", "two": "claim:c2"}))


#: The DeviceClasses a bare planner knows: ours (binpack, from the class) and another driver's.
PLANNER_CLASSES: dict[str, DeviceClassView] = {
    DRIVER: DeviceClassView(device_class(DRIVER, {"policy": "binpack"}), DRIVER),
    "other": DeviceClassView({"metadata": {"name": "other"}, "spec": {}}, DRIVER),
}


def planner(
    gpus: int = 4, *, classes: dict[str, Obj] | None = None, slices: list[Obj] | None = None
) -> tuple[Ledger, Planner]:
    """A ledger over node n1's ``gpus`` T4 cards (slices with our policy taint, or ``slices``) and
    a planner on it that knows ``classes`` (default ``PLANNER_CLASSES``)."""
    if slices is None:
        slices = build_resource_slices(
            profile_gpus("t4", node_name="n1", gpus=gpus),
            node_name="n1",
            driver_name=DRIVER,
            policy_taint=True,
        )
    ledger = Ledger()
    ledger.set_inventory(build_inventory(slices, DRIVER))
    known = (
        PLANNER_CLASSES
        if classes is None
        else {name: DeviceClassView(body, DRIVER) for name, body in classes.items()}
    )
    matcher = Matcher(DRIVER, f"{DRIVER}/policy-managed")
    return ledger, Planner(ledger, matcher, DRIVER, ControllerDefaults(), known.get)


def plan_one(obj: Obj, on: Planner) -> PodPlan:
    """One claim planned on n1 for a pod with no annotations."""
    requests, _ = claim_requests(obj, lambda name: name == DRIVER)
    return on.plan(PodView.parse({}), [PlanInput(ClaimView(obj, DRIVER), requests)], frozenset({"n1"}), None)
