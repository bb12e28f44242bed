"""What the controller's informers keep of each object: its memory grows with our work, not the cluster.

Every Pod of the cluster has to be watched: a node is chosen for a pod only where its CPU and
memory requests fit beside those of every active pod bound there (``ClusterCache.bound_requests``,
dra_driver/controller/nodefit.py), and most of those pods are not ours. No label or field selector
can tell the API server which pods those are, and a label set by our webhook would miss the pods
created before it was installed. So every pod is listed and watched, and each is cut down here,
the moment it arrives, to what the controller will ever read of it:

* a pod that names a ResourceClaim or carries our scheduling gate may be ours to place, to report
  on or to release claims for, and the controller writes it back whole (an Update of the gate, an
  UpdateStatus of its condition: what we leave out of such a write is erased on the server): it is
  kept whole, without ``managedFields``. This includes pods created before the driver was installed
  (their claims are found by name) and pods the webhook translated from HAMi's resources (it adds
  template claims and our gate). ``spec.resourceClaims`` and the gates cannot be added to a pod
  after it is created, so a pod never moves from the other kind to this one;
* any other pod is only a neighbour: its node, phase, identity and CPU/memory requests are kept
  (:func:`neighbour_pod`), a few hundred bytes instead of the tens of kilobytes a pod takes as
  parsed JSON with its managedFields, status and annotations. It stays a Pod as far as every reader
  is concerned (``PodView`` parses it like any pod), so nothing past this boundary changes.

Nodes are read only through ``NodeView`` and never written: only its fields are kept
(:func:`placement_node`; a node's status lists its images, often most of the object). Claims,
DeviceClasses, quotas and slices are kept whole apart from ``managedFields`` (claims and quotas are
written back; slices are read in full by the inventory, and the slice informer lists only our
driver's, :func:`slice_selector`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.contract import GATE_NAME
from dra_driver.kube.api import Obj
from dra_driver.kube.watch import drop_managed_fields

#: The pod's metadata every reader of a neighbour uses (``ObjectView``): identity, version, age.
_NEIGHBOUR_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
)
#: The requests ``pod_requests`` adds up (dra_driver/resource/objects.py).
_COUNTED_REQUESTS = ("cpu", "memory")


def may_be_ours(pod: Mapping[str, Any]) -> bool:
    """Whether the controller may place, report on or release claims for ``pod``: it names a
    ResourceClaim (any driver's: which are ours is only known from the claims and classes, which
    may arrive later) or carries our scheduling gate."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    return any(gate.get("name") == GATE_NAME for gate in spec.get("schedulingGates") or ())


def keep_pod(pod: Obj) -> Obj:
    """The informer's transform for Pods: whole for a pod that may be ours, else a neighbour."""
    return drop_managed_fields(pod) if may_be_ours(pod) else neighbour_pod(pod)


def _requests_only(containers: Any) -> list[Obj]:
    kept = []
    for container in containers or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        counted = {name: requests[name] for name in _COUNTED_REQUESTS if name in requests}
        kept.append({"name": container.get("name"), "resources": {"requests": counted}})
    return kept


def neighbour_pod(pod: Mapping[str, Any]) -> Obj:
    """A pod that is not ours, as node fit reads it: where it is bound, whether it still runs, and
    its containers' CPU/memory requests (with its init containers' and its overhead: the
    effective requests come out as for the whole pod)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    kept_spec: Obj = {"containers": _requests_only(spec.get("containers"))}
    if spec.get("initContainers"):
        kept_spec["initContainers"] = _requests_only(spec["initContainers"])
    overhead = spec.get("overhead") or {}
    if any(name in overhead for name in _COUNTED_REQUESTS):
        kept_spec["overhead"] = {name: overhead[name] for name in _COUNTED_REQUESTS if name in overhead}
    if spec.get("nodeName"):
        kept_spec["nodeName"] = spec["nodeName"]
    if spec.get("schedulingGates"):  # another component's gates (ours make a pod ours)
        kept_spec["schedulingGates"] = [{"name": gate.get("name")} for gate in spec["schedulingGates"]]
    kept: Obj = {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": {key: meta[key] for key in _NEIGHBOUR_METADATA if key in meta},
        "spec": kept_spec,
    }
    phase = (pod.get("status") or {}).get("phase")
    if phase:
        kept["status"] = {"phase": phase}
    return kept


def placement_node(node: Mapping[str, Any]) -> Obj:
    """The informer's transform for Nodes: what ``NodeView`` reads (labels, taints,
    unschedulable, allocatable) and the identity the informer needs."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    kept_spec = {key: spec[key] for key in ("taints", "unschedulable") if key in spec}
    allocatable = (node.get("status") or {}).get("allocatable")
    return {
        "apiVersion": node.get("apiVersion", "v1"),
        "kind": node.get("kind", "Node"),
        "metadata": {key: meta[key] for key in ("name", "uid", "resourceVersion", "labels") if key in meta},
        "spec": kept_spec,
        "status": {"allocatable": allocatable} if allocatable is not None else {},
    }


def slice_selector(driver: str) -> str:
    """The field selector of our driver's ResourceSlices (the inventory and the slice changes
    leave every other driver's out; ``spec.driver`` is a selectable field of ResourceSlices,
    k8s.io/api's ``ResourceSliceSelectorDriver``)."""
    return f"spec.driver={driver}"
