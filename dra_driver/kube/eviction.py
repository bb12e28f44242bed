"""Evicting a pod through the Eviction API (``policy/v1`` Eviction, ``POST pods/NAME/eviction``).

The API server deletes the pod only if every PodDisruptionBudget that selects it allows one more
disruption; otherwise it answers 429 and nothing happens. Unlike a delete, an eviction can never
take a pod its budget protects, which is why preemption uses it. The pod's uid is a precondition:
a namesake created since is refused (409) rather than evicted. ``dry_run`` asks the same question
without evicting (the budget is checked, nothing is written).
"""

from __future__ import annotations

from enum import StrEnum

from dra_driver.kube.api import KubeApi, Obj, Resource
from dra_driver.kube.errors import KubeError


class Evicted(StrEnum):
    """What an eviction came to."""

    EVICTED = "evicted"  # the pod is being deleted (or would be: dry run)
    REFUSED = "refused"  # 429: a PodDisruptionBudget allows no disruption now
    GONE = "gone"  # the pod (with that uid) no longer exists


def eviction_resource(pod_name: str) -> Resource:
    """``pods/<name>/eviction`` as a resource to create in the pod's namespace."""
    return Resource("", "v1", f"pods/{pod_name}/eviction", "Eviction", True)


def eviction_body(namespace: str, name: str, uid: str, *, dry_run: bool = False) -> Obj:
    options: Obj = {"preconditions": {"uid": uid}}
    if dry_run:
        options["dryRun"] = ["All"]
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": options,
    }


def evict(kube: KubeApi, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> Evicted:
    """Evict the pod; raises ``KubeError`` for anything but success, a budget's refusal or a pod
    that is gone (a caller retries those later)."""
    try:
        kube.create(eviction_resource(name), namespace, eviction_body(namespace, name, uid, dry_run=dry_run))
    except KubeError as err:
        if err.status == 429:
            return Evicted.REFUSED
        if err.status in (404, 409):
            return Evicted.GONE
        raise
    return Evicted.EVICTED
