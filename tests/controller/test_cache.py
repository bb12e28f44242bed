"""The cluster cache (dra_driver/controller/cache.py): informer events into typed caches, the
indexes (claims' consumers, pods by uid, template claims by owner), whom an event wakes, and the
writes' results folded back into it and the ledger. Deleted claims still in use (orphans):
test_deleted_claims.py; the pending pods a wake retries: test_fair_pending.py."""

from __future__ import annotations

import copy

from dra_driver.controller import FINALIZER
from dra_driver.controller.assumed import ASSUME_SECONDS, ClaimAssumptions
from dra_driver.kube.api import RESOURCE_CLAIMS, Obj
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request
from tests.controller.worlds import NODE, CacheWorld, World, edited, shared_on_gpu0, tenant, two_claims_pod

# --- events and indexes -----------------------------------------------------------------------------


def test_the_pod_index_follows_updates_and_deletions() -> None:
    world = CacheWorld()
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    first = world.add_pod(pod("p", {"gpu": "claim:c1"}))
    uid = first.uid
    assert world.cache.consumers[f"{NS}/c1"] == {f"{NS}/p"} and world.cache.pods_by_uid[uid] == f"{NS}/p"
    moved = world.edited_pod(
        "p", lambda p: p["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimName": "c2"}])
    )
    generation = world.cache.bound_generation
    world.cache.observe_pod(first, moved)
    assert world.cache.consumers[f"{NS}/c1"] == set() and world.cache.consumers[f"{NS}/c2"] == {f"{NS}/p"}
    assert world.cache.bound_generation == generation  # not bound: CPU use did not change
    bound = edited(moved, lambda p: p["spec"].update(nodeName=NODE))
    world.cache.observe_pod(moved, bound)
    assert world.cache.bound_generation == generation + 1
    world.cache.observe_pod(bound, None)
    assert world.cache.bound_generation == generation + 2
    assert uid not in world.cache.pods_by_uid and world.cache.consumers[f"{NS}/c2"] == set()


def test_a_pod_event_older_than_the_cached_copy_is_ignored_and_a_deletion_unindexes_the_pod() -> None:
    world = CacheWorld()
    tenant(world, "a")
    ours = world.pod_view("a-pod")  # e.g. what our gate-lifting write returned
    older = edited(ours, lambda p: p["metadata"].update(resourceVersion=str(int(ours.resource_version) - 1)))
    assert world.cache.pod_event(ours.key, ours, older) is ours  # the watch lags our write
    newer = edited(ours, lambda p: p["metadata"].update(resourceVersion=str(int(ours.resource_version) + 1)))
    wake = world.cache.apply_event("Pod", dict(ours), dict(newer))
    assert world.cache.pods[ours.key] is not ours and world.cache.consumers[f"{NS}/a"] == {ours.key}
    assert wake.pods == {ours.key} and not wake.deleted_pods  # an update is not a deletion
    wake = world.cache.apply_event("Pod", dict(newer), None)
    assert wake.deleted_pods == {ours.uid} and f"{NS}/a" in wake.claims  # its claims, to release
    assert ours.key not in world.cache.pods and ours.uid not in world.cache.pods_by_uid
    assert world.cache.consumers[f"{NS}/a"] == set()


def test_an_uncached_pod_event_unindexes_the_old_version_and_unknown_deletions_are_ignored() -> None:
    world = CacheWorld()
    world.add_claim(claim("c1", request()))
    world.add_claim(claim("c2", request()))
    first = world.add_pod(pod("p", {"gpu": "claim:c1"}))
    world.cache.pods.pop(first.key)  # not cached (e.g. the deletion of our copy raced the event)
    moved = edited(
        first, lambda p: p["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimName": "c2"}])
    )
    world.cache.pod_event(first.key, first, moved)
    assert world.cache.consumers[f"{NS}/c1"] == set() and world.cache.consumers[f"{NS}/c2"] == {first.key}
    world.cache.pod_event(first.key, moved, None)  # a deletion of a pod never reported pending
    assert world.cache.consumers[f"{NS}/c2"] == set()
    world.cache.pod_event(f"{NS}/never", None, None)
    world.cache.claim_event(f"{NS}/never", None, None)
    world.cache.class_event("never", None)
    world.cache.node_event("never", None)
    assert f"{NS}/never" not in world.cache.pods and f"{NS}/never" not in world.cache.claims


def test_a_claim_event_caches_the_claim_and_its_deletion_forgets_what_was_counted_and_assumed() -> None:
    world = CacheWorld()
    obj = claim("a", request())
    obj["status"] = {"allocation": shared_on_gpu0("s", "1Gi")}
    cached = world.add_claim(obj)
    assert world.cache.ledger.claims()[cached.uid]  # its allocation is counted
    world.cache.assumed.wrote(cached)
    wake = world.cache.apply_event("ResourceClaim", dict(cached), None)
    assert wake.deleted_claims == {cached.key} and cached.key in wake.claims
    assert cached.key not in world.cache.claims
    assert not world.cache.assumed.is_assumed(cached.key)
    assert cached.uid not in world.cache.ledger.claims()
    world.cache.claim_event(cached.key, None, cached)
    assert world.cache.claims[cached.key] is cached and world.cache.ledger.claims()[cached.uid]


def test_a_class_event_decides_whether_its_name_is_ours_and_deletions_forget_classes_and_nodes() -> None:
    world = CacheWorld()
    world.cache.class_event("small", device_class("small"))
    world.cache.class_event("foreign", {"metadata": {"name": "foreign"}, "spec": {}})
    assert world.cache.is_ours("small") and not world.cache.is_ours("foreign")
    world.cache.class_event("small", None)
    assert not world.cache.is_ours("small") and "small" not in world.cache.classes
    world.cache.node_event(NODE, None)
    assert NODE not in world.cache.nodes


def test_a_pod_owning_a_template_claim_keeps_it_live_while_active() -> None:
    world = CacheWorld()
    owner = world.add_pod(pod("owner", {"gpu": "template:t"}))
    owned = claim("owner-gpu", request())
    owned["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "owner",
                                             "uid": owner.uid}]  # fmt: skip
    owned["metadata"]["finalizers"] = [FINALIZER]
    stored = world.add_claim(owned)
    assert world.cache.live_consumers(stored)
    world.cache.pods[f"{NS}/owner"] = edited(owner, lambda p: p.update(status={"phase": "Failed"}))
    assert not world.cache.live_consumers(stored)


# --- what we wrote, before the informers deliver it -------------------------------------------------


def test_the_cached_claim_is_our_write_until_the_informer_catches_up_or_it_expires() -> None:
    world = World()
    now = [1000.0]
    world.cache.assumed = ClaimAssumptions(world.cache.ledger, DRIVER, clock=lambda: now[0])
    tenant(world, "a")
    stale = copy.deepcopy(world.cache.claims[f"{NS}/a"])
    world.place("a-pod")
    written = world.claim("a")
    world.cache.assumed.wrote(written)  # what folding the bind records
    world.cache.claims[f"{NS}/a"] = stale  # the informer has not delivered our write yet
    assert world.cache.claim(NS, "a") == written
    now[0] += ASSUME_SECONDS - 1
    assert world.cache.claim(NS, "a") == written  # still inside the window
    now[0] += 2
    assert world.cache.claim(NS, "a") == stale  # given up on: the cache is the truth again
    world.cache.assumed.wrote(written)
    recreated = copy.deepcopy(dict(stale))
    recreated["metadata"]["uid"] = "another-object"
    world.cache.claims[f"{NS}/a"] = world.cache.claim_view(recreated)
    assert world.cache.claim(NS, "a") == recreated  # a new object of the same name
    world.cache.assumed.wrote(written)
    world.cache.claims[f"{NS}/a"] = world.cache.claim_view(written)
    assert world.cache.claim(NS, "a") == written and not world.cache.assumed.is_assumed(f"{NS}/a")


def test_folding_a_bind_records_the_pod_as_written() -> None:
    world = World()
    tenant(world, "a")
    world.controller.apply(world.binder.bind(world.planned("a-pod")))  # no informer event yet
    cached = world.pod_view("a-pod")
    assert not cached["spec"].get("schedulingGates")
    assert cached.resource_version == world.pod("a-pod")["metadata"]["resourceVersion"]


def test_a_claim_whose_write_was_not_attempted_falls_back_to_what_the_cache_holds() -> None:
    world = World()
    two_claims_pod(world)
    job = world.planned("p")
    elsewhere = world.claim("c2")  # meanwhile kube-scheduler allocated c2 (the informer saw it)
    elsewhere["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}]}}}  # fmt: skip
    world.observe_claim(world.kube.update(RESOURCE_CLAIMS, elsewhere, status=True))
    world.kube.fail("update/status", "resourceclaims", 500)  # c1's write fails; c2's is never tried
    world.controller.apply(world.binder.bind(job))
    (use,) = world.cache.ledger.claims()[elsewhere["metadata"]["uid"]]
    assert (use.device.device, use.memory) == ("gpu-1", None)


def test_a_failed_write_whose_stale_copy_is_older_than_the_cache_counts_the_cached_claim() -> None:
    # No API here: the bind's outcome is handed to the cache as the binder would return it.
    world = CacheWorld()
    tenant(world, "a")
    placed = world.allocate("a-pod")
    world.assume(placed)
    (write,) = placed.writes
    assert world.cache.assumed.writing(write.claim.key)
    # While our write is in flight the informer delivers kube-scheduler's allocation of the claim.
    theirs = copy.deepcopy(world.objects[("ResourceClaim", NS, "a")])
    theirs["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}]}}}  # fmt: skip
    world.deliver("ResourceClaim", theirs)
    # Our write failed and its re-read failed too: all the binder can return is our stale copy.
    world.cache.apply_bind([write.claim], [], [(write.claim, write.claim)], None)
    assert not world.cache.assumed.writing(write.claim.key)
    (use,) = world.cache.ledger.claims()[write.claim.uid]
    assert (use.device.device, use.memory) == ("gpu-1", None)  # the newer cached allocation counts


# --- who holds a claim, and whom a claim event wakes ---------------------------------------------------


def owned_claim(name: str, owner_uid: str, **status: object) -> Obj:
    """Claim ``name`` generated for the pod of ``owner_uid`` (its ownerReference)."""
    obj = claim(name, request())
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": owner_uid}]
    obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    obj["status"] = dict(status)
    return obj


def test_a_claim_is_held_by_the_pods_it_is_reserved_for_else_by_the_pod_it_was_generated_for() -> None:
    world = CacheWorld()
    first = world.add_pod(pod("p1", {}))
    second = world.add_pod(pod("p2", {}))
    owner = world.add_pod(pod("owner", {}))
    reserved = [{"resource": "pods", "name": p.name, "uid": p.uid} for p in (second, first)]
    shared = world.add_claim(owned_claim("shared", owner.uid, reservedFor=reserved))
    generated = world.add_claim(owned_claim("generated", owner.uid))
    tenants = world.cache.tenants()
    assert (tenants[shared.uid].namespace, tenants[shared.uid].claim, tenants[shared.uid].pod) == (
        NS, "shared", "p1,p2"
    )  # fmt: skip
    assert (tenants[generated.uid].claim, tenants[generated.uid].pod) == ("generated", "owner")


def test_a_claim_event_wakes_the_pods_that_refer_to_it_and_the_pod_it_was_generated_for() -> None:
    world = CacheWorld()
    world.add_pod(pod("user", {"gpu": "claim:c"}))
    owner = world.add_pod(pod("owner", {}))
    obj = owned_claim("c", owner.uid, allocation=shared_on_gpu0("s", "1Gi"))
    created = world.deliver("ResourceClaim", obj)
    assert created.pods == {f"{NS}/user", f"{NS}/owner"} and created.claims == {f"{NS}/c"}
    updated = world.deliver("ResourceClaim", {**obj, "metadata": {**obj["metadata"], "labels": {"x": "y"}}})
    assert updated.pods == {f"{NS}/user", f"{NS}/owner"}
    assert updated.retry_nodes == set() and not updated.retry_everywhere  # its uses are unchanged
    stored = world.objects[("ResourceClaim", NS, "c")]
    deleted = world.cache.apply_event("ResourceClaim", copy.deepcopy(stored), None)
    assert deleted.pods == {f"{NS}/user", f"{NS}/owner"} and deleted.deleted_claims == {f"{NS}/c"}
    assert deleted.retry_nodes == {NODE}
