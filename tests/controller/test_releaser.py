"""The releaser (dra_driver/controller/releaser.py), over ``FakeKube``: a claim of ours that nobody
uses is released (allocation cleared, then our finalizer removed), one that is reserved or referenced
is kept; an overcommitted card loses its newest claim whose pods have not started."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.controller import FINALIZER
from dra_driver.kube.api import RESOURCE_CLAIMS
from dra_driver.kube.errors import KubeError
from dra_driver.resource.objects import ClaimView
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.worlds import NODE, World, shared_on_gpu0, tenant


def allocated_claim(world: World, name: str, **status: Any) -> ClaimView:
    """Claim ``name``, allocated on gpu-0, with our finalizer after someone else's."""
    obj = claim(name, request())
    obj["metadata"]["finalizers"] = ["someone.else/keep", FINALIZER]
    obj["status"] = {"allocation": shared_on_gpu0("s", "1Gi"), **status}
    return world.add_claim(obj)


def overcommitting(world: World, stamps: dict[str, str], **status: Any) -> None:
    """Claims of ours taking 10Gi each of gpu-0 (created at ``stamps``), and a pod for each."""
    for name, stamp in stamps.items():
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {"allocation": shared_on_gpu0(name, "10Gi"), **status.get(name, {})}
        world.kube.put(RESOURCE_CLAIMS, obj)
        world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))
    world.sync()


# --- releasing --------------------------------------------------------------------------------------


def test_an_unused_claim_is_released_and_a_reserved_one_kept() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    allocated = world.claim("a")
    allocated["status"]["reservedFor"] = [{"resource": "pods", "name": "a-pod", "uid": "u"}]
    world.kube.update(RESOURCE_CLAIMS, allocated, status=True)
    world.sync()
    assert world.releaser.release(world.cache.claims[f"{NS}/a"]) == "in-use"
    del world.kube.objects[("pods", NS, "a-pod")]
    world.cache.observe_pod(world.cache.pods.pop(f"{NS}/a-pod"), None)
    cleared = world.claim("a")
    cleared["status"].pop("reservedFor")
    world.kube.update(RESOURCE_CLAIMS, cleared, status=True)
    world.sync()
    assert world.releaser.release(world.cache.claims[f"{NS}/a"]) == "released"
    released = world.claim("a")
    assert "allocation" not in released.get("status", {}) and FINALIZER not in released["metadata"].get(
        "finalizers", []
    )
    assert world.metrics.deallocations._value.get() == 1
    assert world.releaser.release(world.cache.claim_view(released)) == "skip"


def test_a_claim_of_a_live_pod_is_kept_an_api_error_raised_and_a_gone_claim_reported() -> None:
    world = World()
    tenant(world, "a")
    world.place("a-pod")
    assert world.releaser.release(world.cache.claims[f"{NS}/a"]) == "in-use"
    assert [r["name"] for r in world.claim("a")["status"]["reservedFor"]] == ["a-pod"]
    unreserved = copy.deepcopy(dict(world.cache.claims[f"{NS}/a"]))
    unreserved["status"].pop("reservedFor")  # the pod goes: kube-controller-manager drops its entry
    stale = world.cache.claim_view(unreserved)
    world.cache.observe_pod(world.cache.pods.pop(f"{NS}/a-pod"), None)
    world.kube.fail("update/status", "resourceclaims", 500)
    with pytest.raises(KubeError):
        world.releaser.release(stale)  # an API error is the caller's to retry, not hidden
    assert world.devices("a")
    del world.kube.objects[("resourceclaims", NS, "a")]
    assert world.releaser.release(stale) == "gone"


def test_a_claim_reserved_by_a_pod_not_seen_yet_is_kept() -> None:
    world = World()
    obj = allocated_claim(world, "r", reservedFor=[{"resource": "pods", "name": "unknown", "uid": "u"}])
    assert world.releaser.release(obj) == "in-use"
    assert world.devices("r") == ["gpu-0"]


def test_a_release_keeps_other_finalizers_and_rechecks_after_a_conflict() -> None:
    world = World()
    obj = allocated_claim(world, "r")
    reserved = world.claim("r")
    reserved["status"]["reservedFor"] = [{"resource": "pods", "name": "late", "uid": "u"}]
    world.kube.update(RESOURCE_CLAIMS, reserved, status=True)  # reserved since our copy was read
    assert world.releaser.release(obj) == "in-use"  # the re-read after the 409 shows it
    assert world.metrics.conflicts._value.get() == 1
    cleared = world.claim("r")
    cleared["status"].pop("reservedFor")
    world.kube.update(RESOURCE_CLAIMS, cleared, status=True)
    assert world.releaser.release(world.cache.claim_view(world.claim("r"))) == "released"
    assert world.claim("r")["metadata"]["finalizers"] == ["someone.else/keep"]


def test_an_unallocated_claim_keeps_our_finalizer_until_it_is_deleted() -> None:
    """Admission finalizes a claim of our classes at creation, often before its pod exists: the
    releaser leaves it (no write) until the claim is deleted, then removes the finalizer."""
    world = World()
    obj = claim("w", request())
    obj["metadata"]["finalizers"] = ["someone.else/keep", FINALIZER]
    waiting = world.add_claim(obj)
    assert world.releaser.release(waiting) == "waiting"
    assert world.kube.writes("resourceclaims") == []
    world.kube.objects[("resourceclaims", NS, "w")]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    world.sync()
    assert world.releaser.release(world.cache.claims[f"{NS}/w"]) == "released"
    assert world.kube.writes("resourceclaims") == [("update", "resourceclaims", "w")]
    assert world.claim("w")["metadata"]["finalizers"] == ["someone.else/keep"]


def test_a_claim_being_deleted_is_released_even_with_a_live_pod() -> None:
    world = World()
    obj = allocated_claim(world, "d")
    world.add_pod(pod("d-pod", {"gpu": "claim:d"}))
    assert world.releaser.release(obj) == "in-use"
    deleting = world.claim("d")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    world.kube.objects[("resourceclaims", NS, "d")]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert world.releaser.release(world.cache.claim_view(deleting)) == "released"


@pytest.mark.parametrize(
    ("finalizers", "writes"),
    [
        # Ours alone: removing it deletes the claim, which frees the devices: one write.
        ([FINALIZER], [("update", "resourceclaims", "d")]),
        # Another component keeps the claim: its devices are freed now, then ours goes.
        (
            ["someone.else/keep", FINALIZER],
            [("update/status", "resourceclaims", "d"), ("update", "resourceclaims", "d")],
        ),
    ],
)
def test_a_deleted_claim_held_only_by_our_finalizer_is_released_in_one_write(
    finalizers: list[str], writes: list[tuple[str, str, str]]
) -> None:
    world = World()
    obj = claim("d", request())
    obj["metadata"]["finalizers"] = finalizers
    obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    obj["status"] = {"allocation": shared_on_gpu0("s", "1Gi")}
    assert world.releaser.release(world.add_claim(obj)) == "released"
    assert world.kube.writes("resourceclaims") == writes
    left = world.claim("d")["metadata"]["finalizers"]
    assert left == [f for f in finalizers if f != FINALIZER]
    assert world.metrics.deallocations._value.get() == 1  # counted either way


def test_a_deallocation_clears_the_device_status_too() -> None:
    world = World()
    obj = claim("s", request())
    obj["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}
        },
        "devices": [{"driver": DRIVER, "pool": NODE, "device": "gpu-0"}],
    }
    stored = world.add_claim(obj)
    written = world.releaser.deallocate(stored)
    assert written["status"] == {} and world.claim("s")["status"] == {}


# --- repairing an overcommitted card ----------------------------------------------------------------


def test_an_overcommitted_card_loses_its_newest_unstarted_claim() -> None:
    world = World(gpus=1)
    overcommitting(world, {"old": "2026-12-01T00:00:01Z", "new": "2026-12-01T00:00:02Z"})
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) == "deallocated"
    assert world.devices("old") == ["gpu-0"] and world.devices("new") == []
    assert any("GPU node-1/gpu-0 was overcommitted" in message for message in world.events())
    assert world.metrics.overcommits.labels("deallocated")._value.get() == 1
    world.sync()
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) is None


def test_a_started_claim_is_kept_and_the_newest_unstarted_one_deallocated_with_events() -> None:
    world = World(gpus=1)
    stamps = {"old-unstarted": "2026-12-01T00:00:01Z", "new-started": "2026-12-01T00:00:02Z"}
    overcommitting(
        world, stamps, **{"new-started": {"reservedFor": [{"resource": "pods", "name": "x", "uid": "x"}]}}
    )
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/new-started"]) == "deallocated"
    assert world.devices("old-unstarted") == [] and world.devices("new-started") == ["gpu-0"]
    events = world.event_objects()
    about = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events)
    assert about == [("Pod", "old-unstarted-pod"), ("ResourceClaim", "old-unstarted")]
    for event in events:
        assert (event["type"], event["reason"]) == ("Warning", "GpuOvercommitted")
        assert "memory 21474836480 > 15694036992" in event["message"]
    claim_event = next(e for e in events if e["involvedObject"]["kind"] == "ResourceClaim")
    assert claim_event["involvedObject"]["apiVersion"] == "resource.k8s.io/v1"


@pytest.mark.parametrize(("gated", "outcome"), [(True, "deallocated"), (False, "reported")])
def test_a_claim_we_reserved_is_repaired_only_while_its_pod_is_still_gated(gated: bool, outcome: str) -> None:
    """We reserve with the allocation, before lifting the gate: a gated pod cannot be bound yet,
    an ungated one may be bound by kube-scheduler at any moment (no PreBind write would conflict)."""
    world = World(gpus=1)
    for name, stamp in (("old", "2026-12-01T00:00:01Z"), ("new", "2026-12-01T00:00:02Z")):
        added = world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=gated))
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {
            "allocation": shared_on_gpu0(name, "10Gi"),
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": added.uid}],
        }
        world.kube.put(RESOURCE_CLAIMS, obj)
    world.sync()
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) == outcome
    assert world.devices("new") == ([] if gated else ["gpu-0"])


def test_an_overcommit_by_started_claims_is_only_reported() -> None:
    world = World(gpus=1)
    for name in ("x", "y"):
        obj = claim(name, request(memory="10Gi"))
        obj["status"] = {
            "allocation": shared_on_gpu0(name, "10Gi"),
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": name}],
        }
        world.add_claim(obj)
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/x"]) == "reported"
    assert world.devices("x") == world.devices("y") == ["gpu-0"]
    assert world.metrics.overcommits.labels("reported")._value.get() == 1


def test_an_overcommit_on_several_amounts_names_them_all_and_each_event_says_deallocate() -> None:
    world = World(gpus=1)
    for name, stamp in (("old", "2026-12-01T00:00:01Z"), ("new", "2026-12-01T00:00:02Z")):
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {"allocation": shared_on_gpu0(name, "10Gi", cores="60")}
        world.kube.put(RESOURCE_CLAIMS, obj)
        world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))
    world.sync()
    (use,) = world.cache.claims[f"{NS}/old"].uses
    problems, _ = world.cache.ledger.overcommit(use.device)
    assert len(problems) == 2  # memory and cores
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) == "deallocated"
    expected = f"GPU {NODE}/gpu-0 was overcommitted ({'; '.join(problems)}): claim {NS}/new deallocated"
    events = world.event_objects()
    assert sorted(e["involvedObject"]["kind"] for e in events) == ["Pod", "ResourceClaim"]
    for event in events:
        assert (event["message"], event["action"]) == (expected, "Deallocate")


def test_an_overcommitting_claim_no_pod_refers_to_is_deallocated_with_an_event_on_it_alone() -> None:
    world = World(gpus=1)
    for name, stamp in (("old", "2026-12-01T00:00:01Z"), ("new", "2026-12-01T00:00:02Z")):
        obj = claim(name, request(memory="10Gi"))
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["creationTimestamp"] = stamp
        obj["status"] = {"allocation": shared_on_gpu0(name, "10Gi")}
        world.add_claim(obj)
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) == "deallocated"
    assert world.devices("new") == []
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in world.event_objects()] == [
        ("ResourceClaim", "new")
    ]


def test_a_claim_whose_allocation_is_being_written_is_not_the_one_deallocated() -> None:
    world = World(gpus=1)
    overcommitting(world, {"old": "2026-12-01T00:00:01Z", "new": "2026-12-01T00:00:02Z"})
    newest = world.cache.claims[f"{NS}/new"]
    world.cache.assume([(newest, newest.uses)])  # a write of ours is in flight on it
    assert world.releaser.repair_overcommit(world.cache.claims[f"{NS}/old"]) == "deallocated"
    assert world.devices("old") == [] and world.devices("new") == ["gpu-0"]


# --- the queue ----------------------------------------------------------------------------------


def unused(world: World, name: str) -> None:
    """Claim ``name`` of ours, allocated on gpu-0 and used by no pod."""
    obj = claim(name, request())
    obj["metadata"]["finalizers"] = [FINALIZER]
    obj["status"] = {"allocation": shared_on_gpu0(name, "1Gi")}
    world.add_claim(obj)


def test_a_run_releases_each_queued_claim_and_skips_those_gone() -> None:
    world = World()
    unused(world, "b")
    unused(world, "c")
    world.releaser.queue = {f"{NS}/a-gone", f"{NS}/b", f"{NS}/c"}
    world.releaser.run()
    assert world.releaser.queue == set()
    for name in ("b", "c"):
        assert "allocation" not in world.claim(name)["status"]
        assert FINALIZER not in world.claim(name)["metadata"].get("finalizers", [])
    assert world.metrics.unexpected_errors.labels("ResourceClaim")._value.get() == 0


def test_a_run_keeps_queued_a_claim_being_written_or_failing() -> None:
    world = World()
    tenant(world, "a")
    world.planned("a-pod")  # its allocation is being written
    unused(world, "b")
    unused(world, "c")
    world.kube.fail("update", "resourceclaims", 409, times=10)  # b's release conflicts every attempt
    world.releaser.queue = {f"{NS}/a", f"{NS}/b"}  # c is not queued
    world.releaser.run()
    assert world.releaser.queue == {f"{NS}/a", f"{NS}/b"}
    assert "allocation" not in world.claim("a").get("status", {})  # not looked at
    assert FINALIZER in world.claim("b")["metadata"]["finalizers"]
    assert world.devices("c") == ["gpu-0"]  # only queued claims are looked at


def test_a_run_keeps_queued_a_claim_whose_overcommit_repair_failed() -> None:
    world = World(gpus=1)
    overcommitting(world, {"old": "2026-12-01T00:00:01Z", "new": "2026-12-01T00:00:02Z"})
    world.kube.fail("update/status", "resourceclaims", 500)
    world.releaser.queue = {f"{NS}/old"}
    world.releaser.run()
    assert world.releaser.queue == {f"{NS}/old"}
    assert world.devices("new") == ["gpu-0"]
    world.releaser.run()
    assert world.releaser.queue == set() and world.devices("new") == []
