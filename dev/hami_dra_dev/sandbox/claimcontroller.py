"""The part of kube-controller-manager's ``resourceclaim`` controller that DRA drivers rely on.

Behaviour copied from ``pkg/controller/resourceclaim/controller.go`` (kcm's):

- for every pod that is not being deleted, each ``spec.resourceClaims[]`` entry with a
  ``resourceClaimTemplateName`` gets a ResourceClaim created from the template: generateName
  ``<pod>-<entry>-``, annotation ``resource.kubernetes.io/pod-claim-name: <entry>``, owned by the
  pod (controller, blockOwnerDeletion), and the pod's ``status.resourceClaimStatuses`` records it
  (also for pods that still have scheduling gates);
- a pod that already has ``spec.nodeName`` gets its allocated claims reserved (``reservedFor``);
- ``reservedFor`` entries for pods that are gone, replaced (UID differs) or done (Succeeded/Failed)
  are dropped; when the last one goes and the claim carries kube-scheduler's finalizer
  ``resource.kubernetes.io/delete-protection``, the allocation is cleared and that finalizer removed
  (claims allocated by anyone else keep their allocation: their allocator must clear it);
- generated claims whose pod is done and which are no longer reserved are deleted (garbage
  collection deletes them when the pod object goes).
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox.api import Api, WriteOptions
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.events import record_event
from hami_dra_dev.sandbox.reconciler import Reconciler
from hami_dra_dev.sandbox.resources import require

log = logging.getLogger(__name__)

PODS = require("", "v1", "pods")
CLAIMS = require("resource.k8s.io", "v1", "resourceclaims")
TEMPLATES = require("resource.k8s.io", "v1", "resourceclaimtemplates")
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
BUILTIN_FINALIZER = "resource.kubernetes.io/delete-protection"
USER = WriteOptions(user="system:serviceaccount:kube-system:resourceclaim-controller")


def pod_done(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def claim_names(pod: Obj) -> dict[str, str | None]:
    """Pod claim entry -> ResourceClaim name (None while a template's claim is not created yet)."""
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: dict[str, str | None] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            out[entry["name"]] = entry["resourceClaimName"]
        else:
            out[entry["name"]] = statuses.get(entry["name"])
    return out


class ClaimController(Reconciler):
    name = "sandbox-resourceclaim-controller"
    watches = ("pods", "resourceclaims.resource.k8s.io", "resourceclaimtemplates.resource.k8s.io")

    def __init__(self, api: Api, resync: float = 1.0) -> None:
        super().__init__(api, resync)
        self._warned: set[str] = set()

    def reconcile(self) -> None:
        pods, _ = self.api.list_objects(PODS, None)
        claims, _ = self.api.list_objects(CLAIMS, None)
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                self._conflict_tolerant(self._ensure_claims, pod, claims)
        for claim in claims:
            self._conflict_tolerant(self._sync_claim, claim, by_uid)

    def _conflict_tolerant(self, sync: Any, obj: Obj, *args: Any) -> None:
        """Like kube-controller-manager's work queue: an object another writer changed since it
        was listed (409) is synced again on the next pass, which its change event triggers."""
        try:
            sync(obj, *args)
        except ApiError as err:
            if err.code != 409:
                raise
            meta = obj["metadata"]
            log.debug("%s/%s changed while being synced; again next pass", meta["namespace"], meta["name"])
            self.kick()

    # ----------------------------------------------------------------------------------- pods

    def _ensure_claims(self, pod: Obj, claims: list[Obj]) -> None:
        ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        recorded = {s["name"] for s in statuses}
        changed = False
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name or entry["name"] in recorded:
                continue
            existing = next(
                (
                    c
                    for c in claims
                    if c["metadata"].get("namespace") == ns
                    and (c["metadata"].get("annotations") or {}).get(POD_CLAIM_NAME) == entry["name"]
                    and any(r.get("uid") == uid for r in c["metadata"].get("ownerReferences") or [])
                ),
                None,
            )
            if existing is None:
                try:
                    template = self.api.get(TEMPLATES, ns, template_name)
                except ApiError as err:
                    key = f"{uid}/{template_name}"
                    if key not in self._warned:  # once per pod and template, like an event series
                        self._warned.add(key)
                        record_event(
                            self.api,
                            pod,
                            "Pod",
                            "FailedResourceClaimCreation",
                            f"PodResourceClaim {entry['name']}: {err.message}",
                            "Warning",
                            "resource_claim",
                        )
                    continue
                existing = self.api.create(CLAIMS, ns, self._claim_from(pod, entry["name"], template), USER)
                claims.append(existing)
            statuses.append({"name": entry["name"], "resourceClaimName": existing["metadata"]["name"]})
            changed = True
        if changed:
            patch = {
                "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
                "status": {"resourceClaimStatuses": statuses},
            }
            self.api.patch(
                PODS,
                ns,
                pod["metadata"]["name"],
                "application/merge-patch+json",
                json.dumps(patch).encode(),
                "status",
                USER,
            )
        if pod["spec"].get("nodeName"):
            self._reserve_for_bound_pod(pod, claims)

    @staticmethod
    def _claim_from(pod: Obj, entry: str, template: Obj) -> Obj:
        tmeta = (template.get("spec") or {}).get("metadata") or {}
        prefix = f"{pod['metadata']['name']}-{entry}-"
        if len(prefix) > 57:  # as kcm: keep both ends so the claim name stays recognisable
            prefix = prefix[:28] + prefix[-29:]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": prefix,
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_NAME: entry},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]["spec"]),
        }

    def _reserve_for_bound_pod(self, pod: Obj, claims: list[Obj]) -> None:
        ns = pod["metadata"]["namespace"]
        for claim_name in claim_names(pod).values():
            if claim_name is None:
                continue
            claim = next(
                (
                    c
                    for c in claims
                    if c["metadata"]["name"] == claim_name and c["metadata"].get("namespace") == ns
                ),
                None,
            )
            if claim is None or not (claim.get("status") or {}).get("allocation") or pod_done(pod):
                continue
            reserved = claim["status"].get("reservedFor") or []
            if any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                continue
            claim["status"]["reservedFor"] = [
                *reserved,
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            ]
            self.api.update(CLAIMS, ns, claim_name, claim, "status", USER)

    # ----------------------------------------------------------------------------------- claims

    def _sync_claim(self, claim: Obj, pods_by_uid: dict[str, Obj]) -> None:
        meta = claim["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = []
        for ref in reserved:
            pod = pods_by_uid.get(ref.get("uid", ""))
            if ref.get("resource") != "pods" or pod is None or pod["metadata"]["name"] != ref.get("name"):
                continue
            if pod_done(pod) or (
                pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName")
            ):
                continue
            valid.append(ref)
        builtin = BUILTIN_FINALIZER in (meta.get("finalizers") or [])
        deleting = bool(meta.get("deletionTimestamp")) and not valid
        released = False
        if len(valid) < len(reserved) or (builtin and deleting and status.get("allocation")):
            status = dict(status, reservedFor=valid or None)
            if not valid and builtin:
                status.pop("allocation", None)
                status.pop("devices", None)
            claim["status"] = {k: v for k, v in status.items() if v is not None}
            claim = self.api.update(CLAIMS, ns, name, claim, "status", USER)
            meta = claim["metadata"]
            released = not valid
        # Only where kcm does it: right after the last consumer went, or to unblock deletion.
        if builtin and (released or deleting) and not (claim.get("status") or {}).get("allocation"):
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != BUILTIN_FINALIZER] or None
            claim = self.api.update(CLAIMS, ns, name, claim, "", USER)
        owner = next(
            (r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Pod" and r.get("controller")),
            None,
        )
        if owner and POD_CLAIM_NAME in (meta.get("annotations") or {}) and not valid:
            pod = pods_by_uid.get(owner.get("uid", ""))
            if (pod is None or pod_done(pod)) and not claim["metadata"].get("deletionTimestamp"):
                try:
                    self.api.delete(CLAIMS, ns, name, None, USER)
                except ApiError as err:
                    if err.code != 404:
                        raise
