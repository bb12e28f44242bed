"""Which gang a pod belongs to, and how many of its members must be placed together.

Two ways of naming a group are read, so that the jobs that already ask kube-scheduler for gang
scheduling need no change here:

* **scheduler-plugins coscheduling** (what Kubeflow's training operator, JobSet and Volcano-less
  clusters use): the pod label ``scheduling.x-k8s.io/pod-group: NAME`` names a ``PodGroup``
  (``scheduling.x-k8s.io/v1alpha1``, the plugin's CRD) in the pod's namespace, whose
  ``spec.minMember`` is the gang's minimum (``spec.scheduleTimeoutSeconds``, when set, replaces
  the controller's ``--gang-timeout`` for that group). Where the CRD is not installed, or the
  PodGroup does not exist, the pod's annotation ``gpu.hami.io/gang-min-members`` gives the
  minimum; without either the members wait, saying so.
* **Kubernetes' own Workload API** (alpha, the ``GenericWorkload`` feature gate): from 1.36 a
  pod's ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` of ``scheduling.k8s.io``
  (v1alpha2 in 1.36, v1alpha3 in 1.37) whose ``spec.schedulingPolicy.gang.minCount`` is the
  minimum (a ``basic`` policy is no gang); in 1.35 a pod's ``spec.workloadRef`` (``name``,
  ``podGroup``, ``podGroupReplicaKey``) names a pod group of a ``Workload``
  (``scheduling.k8s.io/v1alpha1``, ``spec.podGroups[].policy.gang.minCount``), each replica key
  being a separate gang. A cluster that does not serve these APIs drops the pod fields at
  admission, so such pods never name a group; their informers find the resource not served (404)
  and look again every half minute.

The directory of group objects is filled by informer threads and read by the worker, hence its
lock; it is tiny (one entry per group).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.kube.api import Obj, Resource

#: The pod label of scheduler-plugins' coscheduling plugin that names the pod's PodGroup.
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
#: Our annotation with the gang's minimum where no PodGroup object gives it.
MIN_MEMBERS_ANNOTATION = "gpu.hami.io/gang-min-members"

COSCHEDULING_POD_GROUPS = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True)
WORKLOADS_V1ALPHA1 = Resource("scheduling.k8s.io", "v1alpha1", "workloads", "Workload", True)
POD_GROUPS_V1ALPHA2 = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup", True)
POD_GROUPS_V1ALPHA3 = Resource("scheduling.k8s.io", "v1alpha3", "podgroups", "PodGroup", True)
#: The group objects the controller watches (each optional: absent where not served).
GROUP_RESOURCES = (COSCHEDULING_POD_GROUPS, WORKLOADS_V1ALPHA1, POD_GROUPS_V1ALPHA2, POD_GROUPS_V1ALPHA3)

COSCHEDULING = "coscheduling"  # the pod-group label
POD_GROUP = "podgroup"  # spec.schedulingGroup (Kubernetes 1.36+)
WORKLOAD = "workload"  # spec.workloadRef (Kubernetes 1.35)


def event_kind(resource: Resource) -> str:
    """The kind under which a group object's informer events reach the worker (two resources are
    called PodGroup)."""
    return f"{resource.kind}.{resource.version}.{resource.group}"


GROUP_KINDS = {event_kind(resource): resource for resource in GROUP_RESOURCES}


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A gang as a pod names it: how (``source``), in which namespace, and which group."""

    source: str
    namespace: str
    name: str  # the PodGroup's, or the Workload's
    pod_group: str = ""  # workloadRef only: the pod group within the Workload
    replica: str = ""  # workloadRef only: its replica key

    @property
    def key(self) -> str:
        return f"{self.source}:{self}"

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}"
        if self.source == WORKLOAD:
            where += f"/{self.pod_group}" + (f"[{self.replica}]" if self.replica else "")
        return where

    def describe(self) -> str:
        """How the gang is named, for messages: "PodGroup team/train (scheduling.x-k8s.io)"."""
        if self.source == COSCHEDULING:
            return f"pod group {self} (label {POD_GROUP_LABEL})"
        if self.source == POD_GROUP:
            return f"PodGroup {self} (spec.schedulingGroup)"
        return f"Workload pod group {self} (spec.workloadRef)"


def group_of(pod: Mapping[str, Any]) -> GroupRef | None:
    """The gang the pod (a raw object or a view) names, if any: the Workload API's field first
    (kube-scheduler's own gang scheduling reads it), else the coscheduling label."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = str(meta.get("namespace") or "")
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if group:
        return GroupRef(POD_GROUP, namespace, str(group))
    ref = spec.get("workloadRef") or {}
    if ref.get("name") and ref.get("podGroup"):
        replica = str(ref.get("podGroupReplicaKey") or "")
        return GroupRef(WORKLOAD, namespace, str(ref["name"]), str(ref["podGroup"]), replica)
    label = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
    if label:
        return GroupRef(COSCHEDULING, namespace, str(label))
    return None


@dataclass(frozen=True, slots=True)
class GangPolicy:
    """What a group asks: at least ``min_members`` placed together (None: no gang, a basic
    group), ``timeout`` seconds before it says why it waits (None: the controller's default);
    ``problem``: why the minimum is not known (the members wait)."""

    min_members: int | None
    timeout: float | None = None
    problem: str | None = None


NOT_A_GANG = GangPolicy(None)


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _gang_min(policy: object) -> GangPolicy:
    """A Workload API scheduling policy (``{gang: {minCount}}`` or ``{basic: {}}``)."""
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    if not isinstance(gang, Mapping):
        return NOT_A_GANG
    minimum = _positive(gang.get("minCount"))
    return GangPolicy(minimum or 1)


class GroupDirectory:
    """The group objects the informers list, by (resource, namespace, name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._changed: set[tuple[str, str, str]] = set()

    def apply(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """An informer event of a group object (any thread)."""
        obj = new if new is not None else old
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            if new is None:
                self._objects.pop(key, None)
            else:
                self._objects[key] = new
            self._changed.add(key)

    def take_changed(self) -> set[tuple[str, str]]:
        """(namespace, name) of the group objects that changed since the last call."""
        with self._lock:
            changed, self._changed = self._changed, set()
        return {(namespace, name) for _, namespace, name in changed}

    def _get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get((event_kind(resource), namespace, name))

    def policy(self, ref: GroupRef, annotations: Mapping[str, str]) -> GangPolicy:
        """The group's policy, from its object (or, for the coscheduling label, the annotation)."""
        if ref.source == COSCHEDULING:
            return self._coscheduling(ref, annotations)
        if ref.source == POD_GROUP:
            for resource in (POD_GROUPS_V1ALPHA3, POD_GROUPS_V1ALPHA2):
                obj = self._get(resource, ref.namespace, ref.name)
                if obj is not None:
                    return _gang_min((obj.get("spec") or {}).get("schedulingPolicy"))
            return GangPolicy(None, problem=f"PodGroup {ref} (scheduling.k8s.io) does not exist (yet)")
        workload = self._get(WORKLOADS_V1ALPHA1, ref.namespace, ref.name)
        if workload is None:
            return GangPolicy(None, problem=f"Workload {ref.namespace}/{ref.name} does not exist (yet)")
        for group in (workload.get("spec") or {}).get("podGroups") or ():
            if isinstance(group, Mapping) and group.get("name") == ref.pod_group:
                return _gang_min(group.get("policy"))
        return GangPolicy(
            None, problem=f"Workload {ref.namespace}/{ref.name} has no pod group {ref.pod_group}"
        )

    def _coscheduling(self, ref: GroupRef, annotations: Mapping[str, str]) -> GangPolicy:
        obj = self._get(COSCHEDULING_POD_GROUPS, ref.namespace, ref.name)
        if obj is not None:
            spec = obj.get("spec") or {}
            timeout = _positive(spec.get("scheduleTimeoutSeconds"))
            minimum = _positive(spec.get("minMember")) or 1
            return GangPolicy(minimum, None if timeout is None else float(timeout))
        text = annotations.get(MIN_MEMBERS_ANNOTATION)
        if text is None:
            return GangPolicy(
                None,
                problem=(
                    f"PodGroup {ref} (scheduling.x-k8s.io/v1alpha1) not found: create it with "
                    f"spec.minMember, or set the pods' annotation {MIN_MEMBERS_ANNOTATION}"
                ),
            )
        given = _positive(int(text)) if text.strip().isdigit() else None
        if given is None:
            return GangPolicy(
                None, problem=f"annotation {MIN_MEMBERS_ANNOTATION}={text!r} is not a positive integer"
            )
        return GangPolicy(given)
