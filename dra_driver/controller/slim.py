"""What the controller's informers keep of each object: its memory grows with our work, not the cluster.

Every Pod of the cluster has to be watched: a node is chosen for a pod only where its CPU and
memory requests fit beside those of every active pod bound there (``ClusterCache.bound_requests``,
dra_driver/controller/nodefit.py), and most of those pods are not ours. No label or field selector
can tell the API server which pods those are, and a label set by our webhook would miss the pods
created before it was installed. So every pod is listed and watched, and each is cut down here,
the moment it arrives, to what the controller will ever read of it:

* a pod that names a ResourceClaim or carries our scheduling gate may be ours to place, to report
  on or to release claims for. This includes pods created before the driver was installed (their
  claims are found by name) and pods the webhook translated from HAMi's resources (it adds
  template claims and our gate). ``spec.resourceClaims`` and the gates cannot be added to a pod
  after it is created, so a pod never moves from the other kind to this one. Such a pod keeps what
  the controller reads of it (:func:`our_pod`): its claims and gates, its containers' names and
  resources, what the node filter reads, the annotations that change its placement, our
  condition. The controller writes these pods only with patches that name what they change (the
  gate, annotations, our condition: dra_driver/resource/edits.py), never by sending a copy back,
  so nothing left out here can be erased on the server;
* any other pod is only a neighbour: its node, phase, identity and CPU/memory requests are kept
  (:func:`neighbour_pod`), a few hundred bytes instead of the tens of kilobytes a pod takes as
  parsed JSON with its managedFields, status and annotations. It stays a Pod as far as every reader
  is concerned (``PodView`` parses it like any pod), so nothing past this boundary changes.

Nodes are read only through ``NodeView`` and never written: only its fields are kept
(:func:`placement_node`; a node's status lists its images, often most of the object). Claims,
DeviceClasses and quotas are kept whole apart from ``managedFields`` (claims and quotas are written
back). Slices are read whole by the inventory (CEL sees every attribute), and the slice informer
lists only our driver's (:func:`slice_selector`); but 5,000 nodes publish 40,000 devices whose
attribute and capacity values are mostly the same few (one product name, one driver version, one
capacity policy): :class:`SliceParts` keeps each distinct value once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from dra_driver.config.resolve import PLAN_ANNOTATIONS
from dra_driver.contract import ALLOCATED_CONDITION, GATE_NAME
from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL
from dra_driver.kube.api import Obj
from dra_driver.kube.watch import drop_managed_fields
from dra_driver.webhook.hami_resources import TRANSLATED_ANNOTATION

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
#: The annotations the controller reads of a pod that may be ours: those that change where it is
#: placed (``resolve_config``, and the pending-shape grouping) and the webhook's note that it was
#: translated from HAMi's resources (dra_driver/controller/hami_templates.py).
OUR_POD_ANNOTATIONS = frozenset((*PLAN_ANNOTATIONS, TRANSLATED_ANNOTATION, MIN_MEMBERS_ANNOTATION))
#: What names a pod's gang (dra_driver/controller/gang_refs.py), kept of every pod: a gang's
#: members that use no GPU of ours (a launcher, say) count towards its minimum too.
_GROUP_SPEC = ("schedulingGroup", "workloadRef")
#: The end of ``<driver>/nomination``, kept too: a preemptor's nomination, read back after a
#: restart to hold its capacity again (dra_driver/controller/nomination.py).
NOMINATION_SUFFIX = "/nomination"
#: What ``PodView`` and the node filter read of such a pod's spec (``placement_spec`` is this spec:
#: pods that differ only in what is left out are placed alike). ``priority`` and
#: ``preemptionPolicy`` (admission resolves ``priorityClassName`` into them at creation) order the
#: pod queue and decide preemption; pods of one workload share them, so the shape groups they split
#: are those preemption would place differently anyway.
_OUR_POD_SPEC = (
    "nodeName",
    "schedulingGates",
    "resourceClaims",
    "nodeSelector",
    "tolerations",
    "overhead",
    "priority",
    "preemptionPolicy",
    *_GROUP_SPEC,
)


def may_be_ours(pod: Mapping[str, Any]) -> bool:
    """Whether the controller may place, report on or release claims for ``pod``: it names a
    ResourceClaim (any driver's: which are ours is only known from the claims and classes, which
    may arrive later) or carries our scheduling gate."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    return any(gate.get("name") == GATE_NAME for gate in spec.get("schedulingGates") or ())


def keep_pod(pod: Obj) -> Obj:
    """The informer's transform for Pods: a pod that may be ours as the controller reads it, else
    a neighbour."""
    return our_pod(pod) if may_be_ours(pod) else neighbour_pod(pod)


def _named_resources(containers: Any) -> list[Obj]:
    """Each container's name and resources (claims it uses, requests and limits: ``ContainerView``
    and ``pod_requests``), in order (the HAMi annotation keeps their places)."""
    return [
        {"name": container.get("name"), "resources": container.get("resources") or {}}
        for container in containers or ()
    ]


def our_pod(pod: Mapping[str, Any]) -> Obj:
    """A pod that may be ours, as the controller reads it (``PodView``, the planner, the HAMi
    translation); a few hundred bytes to a kilobyte or two instead of the tens of kilobytes of a
    parsed pod with its status, images, environment, volumes and last-applied annotation.

    An annotations map is kept (empty when none of its keys is read) where the pod has one: the
    gate's patch adds our annotations to it key by key, or, where the pod has none, adds the map
    after a ``test`` that it is still absent (``gate_patch``).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    kept_meta: Obj = {key: meta[key] for key in _NEIGHBOUR_METADATA if key in meta}
    annotations = meta.get("annotations")
    if annotations is not None:
        kept_meta["annotations"] = {
            k: v for k, v in annotations.items() if k in OUR_POD_ANNOTATIONS or k.endswith(NOMINATION_SUFFIX)
        }
    _keep_group_label(meta, kept_meta)
    kept_spec: Obj = {key: spec[key] for key in _OUR_POD_SPEC if key in spec}
    kept_spec["containers"] = _named_resources(spec.get("containers"))
    if spec.get("initContainers"):
        kept_spec["initContainers"] = _named_resources(spec["initContainers"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None:
        kept_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    status = pod.get("status") or {}
    kept_status: Obj = {key: status[key] for key in ("phase", "resourceClaimStatuses") if key in status}
    ours = [c for c in status.get("conditions") or () if c.get("type") == ALLOCATED_CONDITION]
    if ours:
        kept_status["conditions"] = ours
    kept: Obj = {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": kept_meta,
        "spec": kept_spec,
    }
    if kept_status:
        kept["status"] = kept_status
    return kept


def _requests_only(containers: Any) -> list[Obj]:
    kept = []
    for container in containers or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        counted = {name: requests[name] for name in _COUNTED_REQUESTS if name in requests}
        kept.append({"name": container.get("name"), "resources": {"requests": counted}})
    return kept


def _keep_group_label(meta: Mapping[str, Any], kept_meta: Obj) -> None:
    """The coscheduling pod-group label, the one label the controller reads of a pod."""
    group = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
    if group is not None:
        kept_meta["labels"] = {POD_GROUP_LABEL: group}


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
    kept_spec.update({key: spec[key] for key in _GROUP_SPEC if key in spec})
    kept_meta: Obj = {key: meta[key] for key in _NEIGHBOUR_METADATA if key in meta}
    _keep_group_label(meta, kept_meta)
    kept: Obj = {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": kept_meta,
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


#: A value's key in ``SliceParts``: its compact JSON (the C encoder: four times faster than building
#: a tuple key in Python, and about as small).
_json_key = json.JSONEncoder(separators=(",", ":")).encode


class SliceParts:
    """The informer's transform for our ResourceSlices: ``managedFields`` dropped, and each device's
    attribute and capacity values shared with every equal value already kept.

    A decoded slice holds its own copy of every value (``{"string": "NVIDIA H100 80GB HBM3"}``,
    a capacity's ``requestPolicy``): about 60 kB per 8-GPU slice, 300 MB at 5,000 nodes, for what
    is mostly the same few values (hack/bench_memory.py). Shared, a device keeps its own dicts
    (``entry``, its ``attributes`` and ``capacity``: the inventory tells a changed device by its
    entry's identity) whose values point to one copy each. Nothing that reads slices writes into
    them (the controller never writes a slice), which is what makes sharing safe.

    The table of kept values is emptied when it passes ``limit`` distinct values (devices come and
    go with their UUIDs): later slices then share among themselves, the earlier ones keep what
    they point to, so memory is never worse than without sharing.
    """

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self._kept: dict[Any, Any] = {}

    def __call__(self, obj: Obj) -> Obj:
        drop_managed_fields(obj)
        if len(self._kept) > self.limit:
            self._kept.clear()
        for device in (obj.get("spec") or {}).get("devices") or ():
            if not isinstance(device, dict):
                continue
            for part in ("attributes", "capacity"):
                values = device.get(part)
                if isinstance(values, dict):
                    device[part] = {
                        sys.intern(str(name)): self.share(value) for name, value in values.items()
                    }
        return obj

    def share(self, value: Any) -> Any:
        """The kept value equal to ``value`` (``value`` itself, kept from now on, if none is)."""
        try:
            return self._kept.setdefault(_json_key(value), value)
        except (TypeError, ValueError):  # not JSON (cannot happen from the API): kept as it is
            return value
