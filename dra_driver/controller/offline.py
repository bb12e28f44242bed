"""The controller's cache and allocator over objects read once, for the read-only commands.

``hami-dra explain`` asks "what would the controller do with this pod now?". The only honest
answer is the controller's own: its ``ClusterCache`` fed the objects, event by event, through the
same boundary the informers feed (``ClusterCache.apply_event`` after the informers' transforms,
``dra_driver/controller/slim.py``; the slices through ``refresh_slices``), and its ``Allocator``
deciding on it, node fit, quotas and per-container limits included. Nothing here parses an object
or decides anything itself, so a command built on it cannot drift from the controller.

``simulate --from-cluster`` places several what-if pods in order, each seeing the ones before:
``apply_placed`` folds a placement back in as the informers would deliver it once the controller
had written it and kube-scheduler had bound the pod (each claim allocated and reserved for its pod,
the pod on its node); ``apply_evicted`` folds in a preemption's victims gone (simulate replays
priorities: nothing is evicted for real).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dra_driver.config import ControllerDefaults
from dra_driver.controller.allocator import Allocator, Placed
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.gang_plan import GangPlan, plan_gang
from dra_driver.controller.gang_refs import GroupDirectory, group_of
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.nomination import Nominations
from dra_driver.controller.preemption import Candidate
from dra_driver.controller.slim import keep_pod, placement_node
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    Obj,
    ObjView,
)
from dra_driver.kube.watch import drop_managed_fields
from dra_driver.resource.edits import with_allocation
from dra_driver.resource.objects import PodView


@dataclass
class ClusterObjects:
    """What the controller's informers list, as the API server returned it (each list may be
    empty: a command that may not list a kind decides without it, and says so)."""

    pods: list[ObjView] = field(default_factory=list)
    claims: list[ObjView] = field(default_factory=list)
    slices: list[ObjView] = field(default_factory=list)
    classes: list[ObjView] = field(default_factory=list)
    nodes: list[ObjView] = field(default_factory=list)
    gpu_quotas: list[ObjView] = field(default_factory=list)
    resource_quotas: list[ObjView] = field(default_factory=list)
    #: Gang objects (PodGroups, Workloads) as (``gang_refs.event_kind`` of their resource, object).
    groups: list[tuple[str, ObjView]] = field(default_factory=list)


def _copied(obj: ObjView) -> Obj:
    """``obj`` without ``managedFields``, as every informer keeps it; the caller's object (and its
    metadata, which the informer's transform edits in place) stays as it was."""
    copied = dict(obj)
    if isinstance(copied.get("metadata"), dict):
        copied["metadata"] = dict(copied["metadata"])
    return drop_managed_fields(copied)


#: Kind -> (the objects of that kind, the informer's transform), in the order they are fed: the
#: classes first so that every claim is read knowing which of its classes are ours.
_FEEDS: tuple[tuple[str, Callable[[ClusterObjects], list[ObjView]], Callable[[ObjView], Obj]], ...] = (
    (DEVICE_CLASSES.kind, lambda objects: objects.classes, _copied),
    (NODES.kind, lambda objects: objects.nodes, placement_node),
    (RESOURCE_SLICES.kind, lambda objects: objects.slices, _copied),
    (RESOURCE_CLAIMS.kind, lambda objects: objects.claims, _copied),
    (PODS.kind, lambda objects: objects.pods, lambda pod: keep_pod(_copied(pod))),
    (GPU_QUOTAS.kind, lambda objects: objects.gpu_quotas, _copied),
    (RESOURCE_QUOTAS.kind, lambda objects: objects.resource_quotas, _copied),
)


def bare_nodes(slices: list[ObjView]) -> list[ObjView]:
    """A bare Node (no labels, taints or allocatable: every pod fits) for each node that publishes
    slices: what a command decides on for a user who may not list Nodes (and says so)."""
    names = sorted(
        {str(node) for node in ((item.get("spec") or {}).get("nodeName") for item in slices) if node}
    )
    return [{"metadata": {"name": node}, "status": {"allocatable": {}}} for node in names]


def cache_from(objects: ClusterObjects, driver: str) -> ClusterCache:
    """The controller's cache once its informers have listed ``objects``: each one an add event,
    then the slices read into the inventory as the worker reads them after a slice event."""
    cache = ClusterCache(driver, ControllerMetrics())
    fed_slices: list[Obj] = []
    for kind, of, transform in _FEEDS:
        for obj in of(objects):
            kept = transform(obj)
            if kind == RESOURCE_SLICES.kind:
                fed_slices.append(kept)
            cache.apply_event(kind, None, kept)
    if cache.slices_changed():
        cache.refresh_slices(fed_slices)
    return cache


def allocator_for(
    objects: ClusterObjects, driver: str, defaults: ControllerDefaults | None = None
) -> Allocator:
    """The controller's allocator over ``cache_from(objects)``, the holds of nominated preemptors
    counted: ``allocate(pod)`` is what the controller would decide for the pod on those objects
    (its metrics go nowhere)."""
    cache = cache_from(objects, driver)
    allocator = Allocator(cache, defaults or ControllerDefaults(), cache.quotas.metrics)
    # The capacity held for nominated preemptors, read back from their pods as a restarted
    # controller does (dra_driver/controller/nomination.py).
    nominations = Nominations(cache.ledger, driver)
    for key, pod in cache.pods.items():
        nominations.observe(key, pod)
    allocator.hidden_holds = nominations.hidden_for
    return allocator


def gang_plan_for(objects: ClusterObjects, allocator: Allocator, pod: PodView) -> GangPlan | None:
    """The controller's joint plan of the pod's gang on ``allocator``'s cache (None: the pod
    names no gang, or a basic group): how many members are placeable now, and how many needed."""
    ref = group_of(pod)
    if ref is None:
        return None
    directory = GroupDirectory()
    for kind, obj in objects.groups:
        directory.apply(kind, None, dict(obj))
    policy = directory.policy(ref, pod.annotations)
    if policy.min_members is None and policy.problem is None:
        return None
    members = [member for member in allocator.cache.pods.values() if group_of(member) == ref]
    return plan_gang(allocator, ref, policy, members)


def apply_placed(cache: ClusterCache, placed: Placed, node: str) -> None:
    """``placed`` as the informers show it once settled: each claim's allocation (reserved for the
    pod, ``with_allocation`` as the binder writes it) and the pod bound to ``node`` as
    kube-scheduler then binds it, so its CPU, memory and pod slot count there for the next pods
    (a bound pod is no candidate any more: its gate and annotations change nothing after)."""
    pod = placed.pod
    for write in placed.writes:
        old = dict(write.claim.raw)
        cache.apply_event(
            RESOURCE_CLAIMS.kind,
            old,
            with_allocation(old, write.allocation, {"name": pod.name, "uid": pod.uid}),
        )
    old_pod = dict(pod.raw)
    cache.apply_event(
        PODS.kind, old_pod, {**old_pod, "spec": {**(old_pod.get("spec") or {}), "nodeName": node}}
    )


def apply_evicted(cache: ClusterCache, candidate: Candidate) -> None:
    """A preemption's ``candidate`` as the informers show it once its victims (and the pods it
    waited for) are gone: each pod deleted, then each claim it freed (kube-controller-manager
    deletes a pod's own claim; a claim no pod uses any more is deallocated)."""
    for holder in (*candidate.victims, *candidate.waiting_for):
        pod = cache.pods.get(holder.key)
        if pod is not None and pod.uid == holder.uid:
            cache.apply_event(PODS.kind, dict(pod.raw), None)
    for uid in candidate.freed:
        key = cache.claim_keys_by_uid.get(uid)
        if key is None:
            continue
        namespace, _, name = key.partition("/")
        claim = cache.claim(namespace, name)
        if claim is not None:
            cache.apply_event(RESOURCE_CLAIMS.kind, dict(claim.raw), None)
