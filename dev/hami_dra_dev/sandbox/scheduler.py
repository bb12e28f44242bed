"""The part of kube-scheduler that DRA drivers see, for pods whose claims someone else allocated.

Copied behaviour (``dynamicresources.go`` in kube-scheduler):

- pods with ``schedulingGates`` are not scheduled (PreEnqueue);
- a pod is scheduled only when every claim it references exists; claims that are still
  unallocated are allocated in the scheduling cycle by the ``allocator`` (plain first fit,
  :mod:`~hami_dra_dev.sandbox.firstfit`, as kube-scheduler would), else the pod waits;
- Filter: a node fits when it is schedulable, matches the pod's ``nodeSelector`` and required node
  affinity, has no untolerated ``NoSchedule``/``NoExecute`` taint, and matches every claim's
  ``allocation.nodeSelector`` (nil = any node); the first fitting node by name wins (no scoring);
- PreBind: a claim allocated in this cycle gets the finalizer
  ``resource.kubernetes.io/delete-protection`` (Update), then allocation and ``reservedFor`` in
  one UpdateStatus ("got allocated elsewhere in the meantime" if someone was faster); an already
  allocated claim only gets the pod appended to ``reservedFor`` (retried on conflict); then the
  pod is bound (``pods/binding``). From 1.36 (DRADeviceBindingConditions on by default) the same
  write also stamps ``allocation.allocationTimestamp`` when it is missing, which the API server
  refuses for an allocation someone else wrote (it is immutable): such a pod never binds, as
  on a real cluster, so an allocator must write the timestamp itself;
- PostFilter: when no node fits and a claim was unavailable (its node selector matched none of
  the otherwise fitting nodes) and it is reserved by nobody or only by this pod, the scheduler
  **clears the allocation** (``reservedFor``, ``allocation`` and ``devices`` set to nil) of the
  first such claim, whoever allocated it, and reports the pod unschedulable.
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

from dra_driver.kube.api import Obj

#: The taint effects that keep a pod off a node (``None``, 1.35+, and PreferNoSchedule do not).
from dra_driver.resource.nodes import (
    BLOCKING_EFFECTS,
    taints_tolerated,
)
from hami_dra_dev.sandbox.api import Api, WriteOptions, now
from hami_dra_dev.sandbox.claimcontroller import claim_names
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.events import record_event
from hami_dra_dev.sandbox.reconciler import Reconciler
from hami_dra_dev.sandbox.resources import require
from hami_dra_dev.sandbox.selectors import node_selector_matches

log = logging.getLogger(__name__)

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")
CLAIMS = require("resource.k8s.io", "v1", "resourceclaims")
USER = WriteOptions(user="system:kube-scheduler")
FINALIZER = "resource.kubernetes.io/delete-protection"


class Allocator(Protocol):
    """Computes allocations in place of kube-scheduler's structured allocator (nothing is written)."""

    def allocate(self, claim: Obj, node: Obj, in_cycle: list[Obj]) -> Obj | None:
        """``status.allocation`` for ``claim`` on ``node`` given this cycle's other allocations, or None."""
        ...


def _node_ok(pod: Obj, node: Obj) -> bool:
    """The node-level Filter plugins that matter here: unschedulable, nodeSelector, required node
    affinity, and NoSchedule/NoExecute node taints."""
    spec = pod.get("spec") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable"):
        return False
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity is not None and not node_selector_matches(affinity, node):
        return False
    return taints_tolerated(node_spec.get("taints") or (), spec.get("tolerations") or (), BLOCKING_EFFECTS)


class Scheduler(Reconciler):
    name = "sandbox-scheduler"
    watches = ("pods", "nodes", "resourceclaims.resource.k8s.io")

    def __init__(self, api: Api, allocator: Allocator | None = None, resync: float = 1.0) -> None:
        super().__init__(api, resync)
        self.allocator = allocator
        self._reported: dict[str, str] = {}

    def reconcile(self) -> None:
        pods, _ = self.api.list_objects(PODS, None, field_selector="spec.nodeName=")
        nodes, _ = self.api.list_objects(NODES, None)
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("schedulingGates") or pod["metadata"].get("deletionTimestamp"):
                continue
            if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            try:
                self._schedule(pod, nodes)
            except ApiError as err:  # conflicts etc.: retried on the next pass
                log.info(
                    "scheduling %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], err.message
                )

    def _claims(self, pod: Obj) -> list[Obj] | None:
        out = []
        for claim_name in claim_names(pod).values():
            if claim_name is None:
                return None
            try:
                out.append(self.api.get(CLAIMS, pod["metadata"]["namespace"], claim_name))
            except ApiError:
                return None
        return out

    def _schedule(self, pod: Obj, nodes: list[Obj]) -> None:
        ns, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        claims = self._claims(pod)
        if claims is None:
            return self._unschedulable(pod, "waiting for the pod's ResourceClaims to be created")
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        if pending and self.allocator is None:
            return self._unschedulable(pod, "waiting for the pod's ResourceClaims to be allocated")
        fitting = [n for n in nodes if _node_ok(pod, n)]
        candidates = [
            n
            for n in fitting
            if all(node_selector_matches(c["status"]["allocation"].get("nodeSelector"), n) for c in allocated)
        ]
        if not candidates:
            self._post_filter(pod, allocated, fitting)
            return None
        for node in sorted(candidates, key=lambda n: n["metadata"]["name"]):
            new = self._allocate_on(pending, node)
            if new is not None:
                break
        else:
            return self._unschedulable(pod, f"0/{len(nodes)} nodes are available: cannot allocate all claims")
        node_name = node["metadata"]["name"]
        for claim in claims:  # PreBind
            try:
                self._bind_claim(claim, pod, new.get(claim["metadata"]["name"]))
            except ApiError as err:
                if err.code == 409:
                    raise  # benign: retried on the next pass
                message = (
                    f'running PreBind plugin "DynamicResources": add reservation to claim '
                    f"{ns}/{claim['metadata']['name']}: {err.message}"
                )
                return self._unschedulable(pod, message)
        self.api.bind(ns, name, {"target": {"kind": "Node", "name": node_name}}, USER)
        self._reported.pop(uid, None)
        record_event(self.api, pod, "Pod", "Scheduled", f"Successfully assigned {ns}/{name} to {node_name}")
        return None

    def _allocate_on(self, pending: list[Obj], node: Obj) -> dict[str, Obj] | None:
        """Allocations for every pending claim on ``node`` (claim name -> allocation), or None."""
        assert self.allocator is not None or not pending
        out: dict[str, Obj] = {}
        for claim in pending:
            assert self.allocator is not None
            allocation = self.allocator.allocate(claim, node, list(out.values()))
            if allocation is None:
                return None
            out[claim["metadata"]["name"]] = allocation
        return out

    @property
    def _stamps_allocations(self) -> bool:
        major, minor = (int(part) for part in self.api.kube_version.split(".")[:2])
        return (major, minor) >= (1, 36)

    def _bind_claim(self, claim: Obj, pod: Obj, allocation: Obj | None) -> None:
        """bindClaim: for a claim allocated in this cycle add the finalizer, then write allocation and
        ``reservedFor`` in one UpdateStatus; otherwise only append the pod to ``reservedFor``."""
        ns, name, uid = claim["metadata"]["namespace"], claim["metadata"]["name"], pod["metadata"]["uid"]
        ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": uid}
        for _ in range(10):
            status = claim.setdefault("status", {})
            if allocation is not None:
                if status.get("allocation"):
                    raise ApiError(
                        409, "Conflict", f"claim {ns}/{name} got allocated elsewhere in the meantime"
                    )
                if FINALIZER not in (claim["metadata"].get("finalizers") or []):
                    claim["metadata"]["finalizers"] = [
                        *(claim["metadata"].get("finalizers") or []),
                        FINALIZER,
                    ]
                    claim = self.api.update(CLAIMS, ns, name, claim, "", USER)
                    status = claim.setdefault("status", {})
                status["allocation"] = allocation
            if (
                self._stamps_allocations
                and status.get("allocation")
                and not status["allocation"].get("allocationTimestamp")
            ):
                status["allocation"] = {**status["allocation"], "allocationTimestamp": now()}
            reserved = status.get("reservedFor") or []
            if any(r.get("uid") == uid for r in reserved):
                return
            status["reservedFor"] = [*reserved, ref]
            try:
                self.api.update(CLAIMS, ns, name, claim, "status", USER)
                return
            except ApiError as err:
                if err.code != 409:
                    raise
                claim = self.api.get(CLAIMS, ns, name)
                if allocation is None and not (claim.get("status") or {}).get("allocation"):
                    raise
        raise ApiError(409, "Conflict", f"could not reserve claim {ns}/{name}")

    def _post_filter(self, pod: Obj, claims: list[Obj], fitting: list[Obj]) -> None:
        uid = pod["metadata"]["uid"]
        for claim in claims:
            selector = claim["status"]["allocation"].get("nodeSelector")
            if any(node_selector_matches(selector, n) for n in fitting):
                continue
            reserved = claim["status"].get("reservedFor") or []
            if not reserved or (len(reserved) == 1 and reserved[0].get("uid") == uid):
                status = {
                    k: v
                    for k, v in claim["status"].items()
                    if k not in ("reservedFor", "allocation", "devices")
                }
                claim["status"] = status
                self.api.update(
                    CLAIMS, claim["metadata"]["namespace"], claim["metadata"]["name"], claim, "status", USER
                )
                self._unschedulable(pod, "deallocation of ResourceClaim completed", force=True)
                return
        self._unschedulable(
            pod, f"0/{len(fitting)} nodes are available: resourceclaim not available on the node"
        )

    def _unschedulable(self, pod: Obj, message: str, force: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        if self._reported.get(uid) == message and not force:
            return
        self._reported[uid] = message
        record_event(self.api, pod, "Pod", "FailedScheduling", message, "Warning")
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now(),
        }
        conditions = [
            c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        patch = {"status": {"conditions": [*conditions, condition]}}
        try:
            self.api.patch(
                PODS,
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                "application/merge-patch+json",
                json.dumps(patch).encode(),
                "status",
                USER,
            )
        except ApiError as err:
            log.debug("pod condition not recorded: %s", err.message)
