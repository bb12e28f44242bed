"""The controller's cluster cache: typed objects, the ledger, the indexes, and whom an event wakes.

Like kube-scheduler's informer caches plus its DRA ``claimTracker``: every informer event enters
here (``apply_event``), on the worker thread only; objects are parsed into typed views once, at
this boundary; the ledger counts every allocation (``assumed`` adds the ones being written, which
the informers have not delivered yet). The answer to "which pods and claims does this change
concern, and which pending pods may it help" is a ``Wake``, which the worker acts on; the cache
itself never calls the API.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dra_driver.controller.assumed import ClaimAssumptions
from dra_driver.controller.bound import BoundRequests
from dra_driver.controller.changelog import ChangeLog
from dra_driver.controller.inventory import build_inventory, prepare_cel
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.metrics import ControllerMetrics, Tenant
from dra_driver.controller.quotas import QuotaBook
from dra_driver.controller.slice_changes import SliceChanges
from dra_driver.kube.api import Obj
from dra_driver.kube.watch import object_key
from dra_driver.quota.model import QuotaObject
from dra_driver.resource.nodes import NodeView
from dra_driver.resource.objects import ClaimView, DeviceClassView, PodView
from dra_driver.resource.uses import Use

log = logging.getLogger("dra_driver.controller")


@dataclass(slots=True)
class Wake:
    """What one or more events concern: objects to look at, and pending pods a change may help.

    ``retry_nodes``: room may have appeared on these nodes (pods that fitted nowhere are planned
    there alone); ``retry_everywhere``: something changed whose effect is unknown (every pending
    pod is planned again); ``retry_quota``: namespaces whose quota may have room; ``retry_classes``:
    DeviceClasses that changed (the pods whose claims ask for them are planned again).
    """

    pods: set[str] = field(default_factory=set)
    claims: set[str] = field(default_factory=set)
    retry_nodes: set[str] = field(default_factory=set)
    retry_everywhere: bool = False
    retry_quota: set[str] = field(default_factory=set)
    retry_classes: set[str] = field(default_factory=set)
    #: Pods (by uid) and claims (by key) that no longer exist: what was kept about them goes.
    deleted_pods: set[str] = field(default_factory=set)
    deleted_claims: set[str] = field(default_factory=set)

    def merge(self, other: Wake) -> None:
        self.pods |= other.pods
        self.claims |= other.claims
        self.retry_nodes |= other.retry_nodes
        self.retry_everywhere |= other.retry_everywhere
        self.retry_quota |= other.retry_quota
        self.retry_classes |= other.retry_classes
        self.deleted_pods |= other.deleted_pods
        self.deleted_claims |= other.deleted_claims


class ClusterCache:
    """Typed caches of Pods, ResourceClaims, DeviceClasses and Nodes, the ledger and quotas."""

    def __init__(self, driver: str, metrics: ControllerMetrics) -> None:
        self.driver = driver
        self.ledger = Ledger()
        self.quotas = QuotaBook(self.ledger, metrics)
        self.classes: dict[str, DeviceClassView] = {}
        self.pods: dict[str, PodView] = {}
        self.claims: dict[str, ClaimView] = {}
        self.nodes: dict[str, NodeView] = {}
        self.owned: dict[tuple[str, str], str] = {}  # (owner pod uid, pod claim name) -> claim name
        self.consumers: dict[str, set[str]] = {}  # claim key -> pod keys referring to it
        self.pods_by_uid: dict[str, str] = {}
        # The same two indexes inverted, so a pod's end finds its claims without a scan of all.
        self.consumed: dict[str, set[str]] = {}  # pod key -> claim keys of ``consumers`` naming it
        self.owned_by_uid: dict[str, set[str]] = {}  # owner pod uid -> its pod claim names in ``owned``
        self.claim_keys_by_uid: dict[str, str] = {}  # claim uid -> key, for the per-claim series
        #: Claims (by uid) deleted while a bound, active pod still names them: counted until those
        #: pods end.
        self.orphans: dict[str, ClaimView] = {}
        #: Claims being written or just written: what the controller knows before its cache does.
        self.assumed = ClaimAssumptions(self.ledger, driver)
        self.bound_generation = 0  # bumped when a pod bound to a node changes (CPU/memory in use)
        self.bound = BoundRequests()
        #: Nodes whose Node object or CPU/memory in use changed (the node fit index catches up).
        self.node_log = ChangeLog()
        #: Claims (by uid) whose object changed and pods (by uid) that came or went since the
        #: per-claim series last looked (``take_series_changes``): who a claim's series names.
        self._series_claims: set[str] = set()
        self._series_pods: set[str] = set()
        self.slice_changes = SliceChanges(driver)

    # --- reads ---------------------------------------------------------------------------------
    def is_ours(self, class_name: object) -> bool:
        klass = self.classes.get(str(class_name))
        return klass is not None and klass.ours

    def claim(self, namespace: str, name: str) -> ClaimView | None:
        """The claim as the controller knows it: what it wrote, or the informer's newer copy."""
        key = f"{namespace}/{name}"
        return self.assumed.effective(key, self.claims.get(key))

    def claim_view(self, obj: Mapping[str, object]) -> ClaimView:
        """A claim as the controller reads it (the informer boundary and every write's result)."""
        return ClaimView.parse(obj, self.driver)

    def pod_claims(self, pod: PodView) -> list[tuple[str, ClaimView | None]]:
        """(pod claim name, its ResourceClaim or None while its template claim does not exist)."""
        result = []
        for pod_claim, claim_name in pod.claim_names:
            if claim_name is None:
                # Before kcm records resourceClaimStatuses: a claim owned by the pod for that entry.
                claim_name = self.owned.get((pod.uid, pod_claim))
            result.append((pod_claim, None if claim_name is None else self.claim(pod.namespace, claim_name)))
        return result

    def pod_by_uid(self, uid: str) -> PodView | None:
        key = self.pods_by_uid.get(uid)
        return self.pods.get(key) if key else None

    def bound_requests(self) -> Mapping[str, Mapping[str, float]]:
        """CPU/memory requested by the active pods bound to each node, kept up to date per pod."""
        return self.bound.by_node

    def live_consumers(self, claim: ClaimView, *, bound_only: bool = False) -> bool:
        """Whether an active pod refers to the claim (its pod-claim entry resolves to it);
        ``bound_only``: a pod bound to a node, whose containers may hold the devices."""

        def live(pod: PodView | None) -> bool:
            return pod is not None and pod.active and (not bound_only or bool(pod.bound_to))

        if any(live(self.pods.get(pod_key)) for pod_key in self.consumers.get(claim.key, ())):
            return True
        return any(live(self.pod_by_uid(owner_uid)) for owner_uid, _ in claim.owners)

    def unstarted(self, claim: ClaimView) -> bool:
        """No pod the claim is reserved for can run or be bound: each is one we know that still
        carries our gate (we reserve with the allocation, before the gate is lifted)."""
        for uid in claim.reserved_uids:
            pod = self.pod_by_uid(uid)
            if pod is None or not pod.gated:
                return False
        return True

    def tenant(self, uid: str) -> Tenant | None:
        """``tenants()[uid]`` of one claim (None when it has no entry there)."""
        claim = self._tenant_claim(uid)
        return None if claim is None else _tenant(claim, self.pods_by_uid)

    def tenant_pod_uids(self, uid: str) -> tuple[str, ...]:
        """The uids of the pods ``tenant(uid)`` names when they are known."""
        claim = self._tenant_claim(uid)
        return () if claim is None else _tenant_pod_uids(claim)

    def _tenant_claim(self, uid: str) -> ClaimView | None:
        """The claim ``tenants()`` describes under ``uid``: a deleted one still booked, or the
        effective version of the cached one."""
        claim = self.orphans.get(uid)
        if claim is None:
            key = self.claim_keys_by_uid.get(uid)
            cached = self.claims.get(key) if key is not None else None
            if cached is None or cached.uid != uid:
                return None
            claim = self.claim(cached.namespace, cached.name) or cached
        return claim

    def take_series_changes(self) -> tuple[set[str], set[str]]:
        """(claim uids, pod uids) changed since the last call (one reader: the per-claim series)."""
        changed = self._series_claims, self._series_pods
        self._series_claims, self._series_pods = set(), set()
        return changed

    def tenants(self) -> dict[str, Tenant]:
        """Claim uid -> who holds it, for the per-claim metrics: the pods it is reserved for, or
        the pod it was generated for while not reserved yet (deleted claims still booked too)."""
        tenants = {}
        effective = (self.claim(claim.namespace, claim.name) or claim for claim in self.claims.values())
        for claim in (*effective, *self.orphans.values()):
            tenants[claim.uid] = _tenant(claim, self.pods_by_uid)
        return tenants

    # --- informer events -----------------------------------------------------------------------
    def apply_event(self, kind: str, old: Obj | None, new: Obj | None) -> Wake:
        """One informer event into the caches; returns whom it wakes."""
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        if kind == "Pod":
            return self._pod_changed(
                key, None if old is None else PodView.parse(old), None if new is None else PodView.parse(new)
            )
        if kind == "ResourceClaim":
            return self._claim_changed(
                key,
                None if old is None else self.claim_view(old),
                None if new is None else self.claim_view(new),
            )
        if kind == "ResourceSlice":
            self.slice_changes.note(old, new)
            return Wake()
        if kind == "DeviceClass":
            self.class_event(key, new)
            return Wake(retry_classes={key})
        if kind == "Node":
            return self._node_changed(key, None if new is None else NodeView.parse(new))
        if kind in ("GpuQuota", "ResourceQuota"):
            (self.quotas.set_gpu_quota if kind == "GpuQuota" else self.quotas.set_resource_quota)(key, new)
            # A quota added, removed or with new limits may let its namespace's refused pods in
            # (its status is ours or kube-controller-manager's: a change there helps nobody).
            if old is not None and new is not None and QuotaObject.same_limits(old, new):
                return Wake()
            return Wake(retry_quota={key.partition("/")[0]})
        return Wake()

    def pod_event(self, key: str, old: PodView | None, new: PodView | None) -> PodView | None:
        """Cache a pod's new version and index it; returns what is cached now.

        A version older than one our own write returned is ignored (the watch lags our writes).
        """
        current = self.pods.get(key)
        if new is not None and current is not None and current.newer_than(new):
            new = current
        if new is None:
            self.pods.pop(key, None)
        else:
            self.pods[key] = new
        self.observe_pod(old if current is None else current, new)
        if self.orphans and (new is None or not new.active):
            self.release_orphans()
        return new

    def claim_event(self, key: str, old: ClaimView | None, new: ClaimView | None) -> None:
        """Cache a claim's new version; the ledger counts what ``assumed`` says is effective."""
        cached = self.claims.get(key)
        if cached is not None and (new is None or cached.uid != new.uid):
            if self.claim_keys_by_uid.get(cached.uid) == key:
                del self.claim_keys_by_uid[cached.uid]
            self._series_claims.add(cached.uid)
        if new is None:
            self.claims.pop(key, None)
            self.assumed.forget(key)
        else:
            self.claims[key] = new
            self.claim_keys_by_uid[new.uid] = key
            self._series_claims.add(new.uid)
        if old is not None:
            self._series_claims.add(old.uid)
        self.observe_claim(old, new)

    def class_event(self, name: str, new: Mapping[str, object] | None) -> None:
        if new is None:
            self.classes.pop(name, None)
        else:
            self.classes[name] = DeviceClassView(new, self.driver)

    def node_event(self, name: str, new: NodeView | None) -> None:
        if new is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = new
        self.node_log.note((name,))

    def observe_claim(self, old: ClaimView | None, new: ClaimView | None) -> None:
        """Keep the ledger and the template-claim index in step with a claim change.

        While our allocation of the claim is being written, the ledger keeps our assumption: the
        intermediate events of our own writes (the finalizer update) must not erase it. After the
        writes, an event older than what we wrote is ignored the same way (``claim()``).
        """
        if old is not None and new is None:
            for owner in old.owners:
                if self.owned.pop(owner, None) is not None:
                    self._unindex_owner(owner)
            if old.uses and self.live_consumers(old, bound_only=True):
                # Deleted while a pod that names it still runs (our finalizer was stripped by
                # hand): the container keeps the device until the pod ends, so its share stays
                # booked in the ledger (and the quota) until then (``release_orphans``).
                self.orphans[old.uid] = old
                log.warning(
                    "claim %s deleted while pods still use it; its GPU share stays booked until they end",
                    old.key,
                )
                return
            self.assumed.gone(old)
            return
        if new is None:
            return
        self.assumed.observed(new, self.claims.get(new.key))
        for owner in new.owners:
            self.owned[owner] = new.name
            self.owned_by_uid.setdefault(owner[0], set()).add(owner[1])

    def _unindex_owner(self, owner: tuple[str, str]) -> None:
        uid, pod_claim = owner
        names = self.owned_by_uid.get(uid)
        if names is not None:
            names.discard(pod_claim)
            if not names:
                del self.owned_by_uid[uid]

    def observe_pod(self, old: PodView | None, new: PodView | None) -> None:
        """Index which claims each pod refers to (for releases), pods by UID, and the CPU/memory
        bound pods request on each node."""
        if any(pod is not None and pod.bound_to for pod in (old, new)):
            self.bound_generation += 1
        if old is not None:
            consumed = self.consumed.get(old.key)
            for claim_key in old.claim_keys:
                self.consumers.get(claim_key, set()).discard(old.key)
                if consumed is not None:
                    consumed.discard(claim_key)
            if consumed is not None and not consumed:
                del self.consumed[old.key]
            if self.pods_by_uid.pop(old.uid, None) is not None:
                self._series_pods.add(old.uid)
        if new is not None:
            for claim_key in new.claim_keys:
                self.consumers.setdefault(claim_key, set()).add(new.key)
                self.consumed.setdefault(new.key, set()).add(claim_key)
            if self.pods_by_uid.get(new.uid) != new.key:
                self._series_pods.add(new.uid)
            self.pods_by_uid[new.uid] = new.key
        self._track_bound(old, new)

    def _track_bound(self, old: PodView | None, new: PodView | None) -> None:
        """Count the pod's CPU/memory on the node it is bound to (and no longer where it was)."""
        key = new.key if new is not None else old.key if old is not None else None
        if key is not None:
            self.node_log.note(self.bound.track(key, new))

    def release_orphans(self) -> list[str]:
        """Stop counting deleted claims whose last active pod has ended; returns their keys."""
        released = [
            self.orphans.pop(uid)
            for uid, claim in list(self.orphans.items())
            if not self.live_consumers(claim, bound_only=True)
        ]
        for claim in released:
            self.assumed.gone(claim)
            log.info("claim %s: its last pod ended; the deleted claim's GPU share is free", claim.key)
        return [claim.key for claim in released]

    def wrote(self, obj: Mapping[str, object]) -> ClaimView:
        """A claim as one of our writes returned it (newer than the informer's copy, for now)."""
        view = self.assumed.wrote(obj)
        self._series_claims.add(view.uid)
        return view

    def assume(self, writes: Iterable[tuple[ClaimView, tuple[Use, ...]]]) -> None:
        """Count planned allocations now, so the next pod is planned with them even while they
        are written (the same uses the written allocation gives when its informer event arrives)."""
        for claim, uses in writes:
            self.assumed.begin_write(claim, uses)
            self._series_claims.add(claim.uid)

    def apply_bind(
        self,
        attempted: Iterable[ClaimView],
        written: Iterable[ClaimView],
        failed: Iterable[tuple[ClaimView, ClaimView | None]],
        pod: PodView | None,
    ) -> None:
        """Fold a bind's outcome back into the caches and the ledger (worker thread only).

        ``attempted``: every claim the bind was to write, in order; ``written`` and ``failed``
        what became of the first ones; the rest were not attempted after a failure.
        """
        attempted = list(attempted)
        written, failed = list(written), list(failed)
        self._series_claims.update(claim.uid for claim in attempted)
        self._series_claims.update(current.uid for _, current in failed if current is not None)
        for claim in attempted:
            self.assumed.end_write(claim)
        for claim in written:
            self.assumed.wrote(claim)
        for claim, current in failed:
            if current is None:
                self.assumed.gone(claim)
                continue
            self.assumed.wrote(current)  # what the API really holds (someone else's allocation, or none)
            cached = self.claims.get(claim.key)
            if cached is not None:
                # ``current`` may be our stale copy (its re-read failed) while the cache already
                # holds a newer version that arrived during the write: count the newer one.
                self.observe_claim(None, cached)
        for claim in attempted[len(written) + len(failed) :]:
            # Not attempted after an earlier failure: drop the assumption, keep what the cache says.
            effective = self.claim(claim.namespace, claim.name)
            if effective is None:
                self.assumed.gone(claim)
            else:
                self.observe_claim(None, effective)
        if pod is not None:
            self.pods[pod.key] = pod
            self._track_bound(None, pod)

    def refresh_inventory(self, slices: list[Obj]) -> None:
        """Rebuild the whole inventory from ``slices`` (devices whose entry did not change are kept)."""
        self.ledger.set_inventory(build_inventory(slices, self.driver, previous=self.ledger.inventory))

    def refresh_nodes(self, nodes: set[str], slices: list[Obj]) -> None:
        """Re-read the devices of ``nodes`` only, from ``slices`` (every slice of their pools):
        the other nodes' devices, and what was selected among them, stay as they are."""
        inventory = self.ledger.inventory
        previous = {node: inventory[node] for node in nodes if node in inventory}
        built = build_inventory(slices, self.driver, previous=previous)
        for node in nodes & built.keys():
            prepare_cel(built[node])
        self.ledger.update_nodes({node: built.get(node) for node in nodes})

    # --- whom a change wakes -------------------------------------------------------------------
    def _pod_changed(self, key: str, old: PodView | None, new: PodView | None) -> Wake:
        """The pod itself; when it ends or goes, the claims it referred to (to release) and the
        pods that fitted nowhere on its node (its CPU/memory there is free again)."""
        new = self.pod_event(key, old, new)
        wake = Wake(pods={key})
        if new is None and old is not None:
            wake.deleted_pods.add(old.uid)
        if (new is None or not new.active) and old is not None:
            wake.claims.update(old.claim_keys)
            wake.claims.update(self.consumed.get(key, ()))
            wake.claims.update(
                f"{old.namespace}/{self.owned[(old.uid, pod_claim)]}"
                for pod_claim in self.owned_by_uid.get(old.uid, ())
            )
            if old.bound_to:
                wake.retry_nodes.add(old.bound_to)
        return wake

    def _claim_changed(self, key: str, old: ClaimView | None, new: ClaimView | None) -> Wake:
        """The claim and the pods that refer to it; capacity released where its uses went (and in
        its namespace's quota)."""
        self.claim_event(key, old, new)
        wake = Wake(claims={key}, pods=set(self.consumers.get(key, ())))
        if new is None:
            wake.deleted_claims.add(key)
        before = old.uses if old is not None else ()
        after = new.uses if new is not None else ()
        if len(after) < len(before):
            gone = set(before) - set(after)
            devices = [self.ledger.device(use.device) for use in gone]
            if all(device is not None for device in devices):
                wake.retry_nodes.update(device.node for device in devices if device is not None)
                wake.retry_quota.update(use.namespace for use in gone)
            else:
                wake.retry_everywhere = True
        changed = new if new is not None else old
        for owner_uid in changed.owner_uids if changed is not None else ():
            pod_key = self.pods_by_uid.get(owner_uid)
            if pod_key:
                wake.pods.add(pod_key)
        return wake

    def _node_changed(self, name: str, new: NodeView | None) -> Wake:
        """A node added or changed may now take the pods that fitted nowhere, there alone; a node
        gone, or one changed in nothing placement reads (a status heartbeat), helps no pod."""
        before = self.nodes.get(name)
        self.node_event(name, new)
        return Wake(retry_nodes={name}) if new is not None and new != before else Wake()

    def slices_changed(self) -> bool:
        return self.slice_changes.changed

    def refresh_slices(self, slices: list[Obj]) -> Wake:
        """Re-read the devices of the nodes whose slices changed (all of them when a slice has no
        node); wakes the pending pods where room may be."""
        changed = self.slice_changes.take_nodes(slices)
        if changed is None:
            self.refresh_inventory(slices)
            return Wake(retry_everywhere=True)
        nodes, their_slices = changed
        self.refresh_nodes(nodes, their_slices)
        return Wake(retry_nodes=nodes)

    def claims_of(self, keys: Iterable[str]) -> list[ClaimView]:
        """The effective claims of ``keys`` that still exist."""
        found = []
        for key in keys:
            namespace, _, name = key.partition("/")
            claim = self.claim(namespace, name)
            if claim is not None:
                found.append(claim)
        return found


def _tenant_pod_uids(claim: ClaimView) -> tuple[str, ...]:
    """The pods that hold ``claim``: those it is reserved for, else the pod it was generated for."""
    return tuple(claim.reserved_uids) or tuple(uid for uid, _ in claim.owners)


def _tenant(claim: ClaimView, pods_by_uid: Mapping[str, str]) -> Tenant:
    """Who holds ``claim``: the pods it is reserved for, else the pod it was generated for."""
    pods = [pods_by_uid.get(uid) for uid in _tenant_pod_uids(claim)]
    names = sorted({key.partition("/")[2] for key in pods if key})
    return Tenant(claim.namespace, claim.name, ",".join(names))
