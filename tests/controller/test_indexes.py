"""The controller's incremental indexes stay what a scan of everything would say (issue 35).

Each test changes the cluster the way events do and compares the index with the answer computed
from scratch, so an index that missed a change (stale) fails here: whom a pod's end wakes, the
CPU/memory bound on each node, the nodes a pod may run on, the devices of a slice change and the
CEL results kept for the other nodes, and the per-card and per-claim series.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.controller import eligibility
from dra_driver.controller.changelog import ChangeLog
from dra_driver.controller.eligibility import Matcher
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.kube.api import Obj
from dra_driver.resource.objects import PodView, bound_requests_by_node
from dra_driver.resource.requests import RequestSpec
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request
from tests.controller.worlds import CacheWorld, World, edited, slices_for, tenant

A, B = "node-a", "node-b"


# --- the change log ---------------------------------------------------------------------------------


def test_the_change_log_names_what_changed_since_a_position_or_says_it_does_not_know() -> None:
    log = ChangeLog(keep=3)
    start = log.position
    log.note(["a"])
    log.note([])  # nothing: no batch
    log.note(["b", "c"])
    assert log.since(start) == {"a", "b", "c"} and log.since(log.position) == set()
    middle = log.position
    log.note_all()
    assert log.since(middle) is None  # everything may have changed
    after = log.position
    for name in "defg":
        log.note([name])
    assert log.since(after) is None  # forgotten (only 3 batches kept): unknown, not "nothing"
    assert log.since(log.position - 2) == {"f", "g"}


# --- whom a pod's end wakes -------------------------------------------------------------------------


def _scanned_claims(world: CacheWorld, key: str, uid: str, namespace: str) -> set[str]:
    """What the cache's indexes must give: a scan of every consumer and every template owner."""
    cache = world.cache
    found = {claim_key for claim_key, pods in cache.consumers.items() if key in pods}
    found |= {f"{namespace}/{name}" for (owner, _), name in cache.owned.items() if owner == uid}
    return found


def _owned_claim(name: str, owner_uid: str, pod_claim: str = "gpu") -> Obj:
    obj = claim(name, request())
    obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim}
    obj["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": owner_uid, "apiVersion": "v1"}]
    return obj


def test_a_pods_end_wakes_its_claims_and_template_claims_only() -> None:
    world = CacheWorld()
    for name in ("c1", "c2", "c3"):
        world.add_claim(claim(name, request()))
    first = world.add_pod(pod("p", {"gpu": "claim:c1", "extra": "template:t"}))
    other = world.add_pod(pod("q", {"gpu": "claim:c3"}))
    world.add_claim(_owned_claim("p-extra", first.uid, "extra"))
    world.add_claim(_owned_claim("q-gpu", other.uid))
    # p now names c2 instead of c1: the index must follow (a stale one would still name c1).
    renamed = edited(first, lambda p: p["spec"]["resourceClaims"][0].update(resourceClaimName="c2"))
    world.add_pod(dict(renamed))
    current = world.cache.pods[f"{NS}/p"]
    expected = _scanned_claims(world, current.key, current.uid, NS)
    assert expected == {f"{NS}/c2", f"{NS}/p-extra"}
    assert world.cache.consumed[current.key] == {f"{NS}/c2"}
    ended = edited(current, lambda p: p.update(status={"phase": "Succeeded"}))
    wake = world.deliver("Pod", dict(ended))
    assert wake.claims == expected | set(current.claim_keys)
    assert f"{NS}/c3" not in wake.claims and f"{NS}/q-gpu" not in wake.claims
    # Its template claim deleted: the owner index forgets it, and q's end wakes only q's.
    world.cache.apply_event("ResourceClaim", dict(world.cache.claims[f"{NS}/p-extra"]), None)
    assert first.uid not in world.cache.owned_by_uid
    wake = world.cache.apply_event("Pod", dict(world.cache.pods[other.key]), None)
    assert wake.claims == {f"{NS}/c3", f"{NS}/q-gpu"}
    assert other.key not in world.cache.consumed


# --- CPU/memory bound on each node ------------------------------------------------------------------


def _bound_pod(name: str, node: str, cpu: str) -> Obj:
    obj = pod(name, {}, gated=False)
    obj["spec"]["nodeName"] = node
    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    return obj


def test_bound_requests_follow_pods_that_bind_move_and_end() -> None:
    world = CacheWorld(nodes=(A, B))
    for node in (A, B):
        world.add_node(node, {"cpu": "1", "memory": "8Gi"})
    tenant(world, "want")

    def check() -> None:
        assert world.cache.bound_requests() == bound_requests_by_node(world.cache.pods.values())

    wanting = edited(world.pod_view("want-pod"), lambda p: p["spec"]["containers"][0]["resources"].update(
        requests={"cpu": "500m"}))  # fmt: skip
    assert world.allocator.allowed_nodes(wanting) == {A, B}
    busy = world.add_pod(_bound_pod("busy", A, "800m"))
    check()
    assert world.allocator.allowed_nodes(wanting) == {B}
    # Recreated under the same name on the other node (a deletion the watch did not show).
    world.cache.apply_event("Pod", None, dict(_bound_pod("busy", B, "800m")))
    check()
    assert world.allocator.allowed_nodes(wanting) == {A}
    world.cache.apply_event("Pod", None, dict(_bound_pod("small", A, "100m")))
    check()
    assert world.allocator.allowed_nodes(wanting) == {A}
    ended = edited(world.cache.pods[busy.key], lambda p: p.update(status={"phase": "Failed"}))
    world.cache.apply_event("Pod", dict(world.cache.pods[busy.key]), dict(ended))
    check()
    assert world.allocator.allowed_nodes(wanting) == {A, B}
    world.cache.apply_event("Pod", dict(world.cache.pods[f"{NS}/small"]), None)
    check()
    assert world.cache.bound_requests().get(A) is None


# --- the nodes a pod may run on ---------------------------------------------------------------------


def test_the_node_fit_index_follows_node_and_inventory_changes() -> None:
    world = CacheWorld(nodes=(A, B))
    tenant(world, "p")
    picky = edited(world.pod_view("p-pod"), lambda p: p["spec"].update(nodeSelector={"zone": "x"}))
    plain = world.pod_view("p-pod")

    def check(view: PodView, expected: set[str]) -> None:
        scanned = {name for name in world.cache.nodes if world.allocator._fits(view, name)}
        assert world.allocator.allowed_nodes(view) == scanned == expected

    check(plain, {A, B})
    check(picky, set())
    labelled = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": A, "labels": {"zone": "x"}},
                "status": {"allocatable": {}}}  # fmt: skip
    world.deliver("Node", labelled)
    check(picky, {A})
    tainted = copy.deepcopy(labelled)
    tainted["spec"] = {"taints": [{"key": "gpu-broken", "effect": "NoSchedule"}]}
    world.deliver("Node", tainted)
    check(picky, set())
    check(plain, {B})
    world.cache.refresh_inventory(slices_for([A], 2))  # node-b's devices are gone
    check(plain, {A} - {A})  # node-a is still tainted
    world.cache.apply_event("Node", tainted, labelled)
    check(plain, {A})
    world.cache.apply_event("Node", labelled, None)
    check(plain, set())
    check(picky, set())


# --- a slice change: that node's devices and CEL results only ---------------------------------------


def _renamed_architecture(slices: list[Obj], node: str, device: str, value: str) -> list[Obj]:
    changed = copy.deepcopy(slices)
    for item in changed:
        if item["spec"]["nodeName"] != node:
            continue
        item["spec"]["pool"]["generation"] += 1
        for entry in item["spec"]["devices"]:
            if entry["name"] == device:
                entry["attributes"]["architecture"] = {"string": value}
    return changed


def _spec() -> RequestSpec:
    return RequestSpec(
        name="gpu", class_name=DRIVER, selectors=(), all_devices=False, count=1, memory=None, cores=0,
        admin_access=False,
    )  # fmt: skip


def test_a_slice_change_reevaluates_only_its_nodes_devices_and_keeps_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    evaluated: list[str] = []
    inner = eligibility.Matcher._selected

    def counted(spec: Any, class_exprs: Any, subject: Any, device: Any, budget: Any) -> bool:
        evaluated.append(f"{device.node}/{device.name}")
        return inner(spec, class_exprs, subject, device, budget)

    monkeypatch.setattr(eligibility.Matcher, "_selected", staticmethod(counted))
    selector = 'device.attributes["gpu.hami.io"].architecture == "Turing"'
    klass = device_class(DRIVER, selectors=[selector])
    slices = slices_for([A, B], 2)
    ledger = Ledger()
    ledger.set_inventory(build_inventory(slices, DRIVER))
    matcher = Matcher(DRIVER, f"{DRIVER}/policy-managed")

    def eligible() -> Any:
        return matcher.eligible(
            _spec(), klass, "claim x", ledger.inventory, ledger.inventory_generation,
            changed_since=ledger.inventory_log.since,
        )  # fmt: skip

    first = eligible()
    assert sorted(evaluated) == [f"{A}/gpu-0", f"{A}/gpu-1", f"{B}/gpu-0", f"{B}/gpu-1"]
    assert first.devices is None and first.nodes == {A, B}
    evaluated.clear()
    assert eligible() is first and not evaluated  # cached
    cached_b = first.per_node[B]
    changed = _renamed_architecture(slices, A, "gpu-1", "Hopper")
    ledger.update_nodes({A: build_inventory([s for s in changed if s["spec"]["nodeName"] == A], DRIVER)[A]})
    second = eligible()
    assert sorted(evaluated) == [f"{A}/gpu-0", f"{A}/gpu-1"]  # node-b's results were kept
    assert second.per_node[B] is cached_b
    assert second.devices == {(A, 0), (B, 0), (B, 1)}  # the changed device no longer matches
    # The same answer as a matcher that evaluates everything afresh.
    fresh = Matcher(DRIVER, f"{DRIVER}/policy-managed").eligible(
        _spec(), klass, "claim x", ledger.inventory, ledger.inventory_generation
    )
    assert (fresh.devices, fresh.nodes, dict(fresh.per_node)) == (
        second.devices, second.nodes, dict(second.per_node),
    )  # fmt: skip


def test_the_cache_rereads_only_the_changed_nodes_devices_and_matches_a_full_rebuild() -> None:
    world = CacheWorld(nodes=(A, B))
    slices = slices_for([A, B], 2)
    world.cache.refresh_inventory(slices)
    for item in slices:
        world.cache.apply_event("ResourceSlice", None, item)
    world.cache.refresh_slices(slices)  # the first events: every node read
    before = dict(world.cache.ledger.inventory)
    changed = _renamed_architecture(slices, A, "gpu-1", "Hopper")
    for old, new in zip(slices, changed, strict=True):
        if old != new:
            world.cache.apply_event("ResourceSlice", old, new)
    wake = world.cache.refresh_slices(changed)
    assert wake.retry_nodes == {A} and not wake.retry_everywhere
    inventory = world.cache.ledger.inventory
    assert inventory[B] is before[B] and inventory[A] is not before[A]
    assert inventory == build_inventory(changed, DRIVER)
    # Converted for CEL when read (off the decision path), only where the devices were re-read.
    assert all(d._cel is not None and d._cel._activation is not None for d in inventory[A].devices.values())
    device = next(d for d in inventory[A].devices.values() if d.name == "gpu-1")
    assert device.cel.data["device.attributes"][DRIVER]["architecture"] == "Hopper"
    # node-b's slice deleted: its devices go, node-a's stay as they are.
    world.cache.apply_event("ResourceSlice", next(s for s in changed if s["spec"]["nodeName"] == B), None)
    left = [s for s in changed if s["spec"]["nodeName"] == A]
    assert world.cache.refresh_slices(left).retry_nodes == {B}
    assert world.cache.ledger.inventory == build_inventory(left, DRIVER)
    assert world.cache.ledger.inventory[A] is inventory[A]


def test_claims_on_a_reread_node_are_counted_on_its_new_devices() -> None:
    world = World(gpus=2, nodes=(A, B))
    tenant(world, "a", memory="2Gi")
    world.place("a-pod")
    node = A if world.cache.ledger.claims_on(A) else B
    used = world.cache.ledger.state.nodes[node].usage
    assert sum(usage.used_memory for usage in used.values()) == 2 * 1024**3
    # The node's devices re-read (a new generation of its pool): its claim is still counted.
    slices = slices_for([A, B], 2)
    newer = copy.deepcopy(slices)
    for item in newer:
        item["spec"]["pool"]["generation"] += 1
    world.cache.refresh_nodes({node}, [s for s in newer if s["spec"]["nodeName"] == node])
    used = world.cache.ledger.state.nodes[node].usage
    assert sum(usage.used_memory for usage in used.values()) == 2 * 1024**3
    world.cache.refresh_nodes({node}, [])  # its slices gone: the claim waits for its devices
    assert node not in world.cache.ledger.state.nodes
    world.cache.refresh_nodes({node}, [s for s in newer if s["spec"]["nodeName"] == node])
    used = world.cache.ledger.state.nodes[node].usage
    assert sum(usage.used_memory for usage in used.values()) == 2 * 1024**3


# --- the per-card and per-claim series --------------------------------------------------------------


def _series(metrics: ControllerMetrics) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (family.name, tuple(sample.labels.values())): sample.value
        for family in metrics.gpus.collect()
        for sample in family.samples
    }


def _matches_a_full_rebuild(world: World) -> dict[tuple[str, tuple[str, ...]], float]:
    world.controller._metrics_at = 0.0  # not within a second of the last update
    world.controller._update_metrics()
    fresh = ControllerMetrics()
    fresh.update_gpus(world.cache.ledger, world.cache.tenants())
    incremental = _series(world.metrics)
    assert incremental == _series(fresh)
    return incremental


def test_the_incremental_series_equal_a_full_rebuild_as_claims_pods_and_slices_change() -> None:
    world = World(gpus=2, nodes=(A, B))
    tenant(world, "a", memory="2Gi")
    tenant(world, "b", memory="1Gi")
    _matches_a_full_rebuild(world)  # the first update: in full
    world.place("a-pod")
    series = _matches_a_full_rebuild(world)
    assert any(name.startswith("hami_dra_claim") and labels[1] == "a" for name, labels in series)
    world.place("b-pod")
    _matches_a_full_rebuild(world)
    # a's pod goes: its name leaves a's series; then the claim is released and its series go.
    pod_a = world.cache.pods[f"{NS}/a-pod"]
    world.cache.apply_event("Pod", dict(pod_a), None)
    _matches_a_full_rebuild(world)
    claim_a = world.cache.claims[f"{NS}/a"]
    world.cache.apply_event("ResourceClaim", dict(claim_a), None)
    series = _matches_a_full_rebuild(world)
    assert not any(name.startswith("hami_dra_claim") and labels[1] == "a" for name, labels in series)
    # A node's slices gone: its cards disappear, b's claim is still labelled where it is.
    world.cache.refresh_inventory(slices_for([A], 2))
    series = _matches_a_full_rebuild(world)
    assert not any(labels[0] == B for name, labels in series if name.startswith("hami_dra_gpu"))
    world.cache.refresh_inventory(slices_for([A, B], 2))
    _matches_a_full_rebuild(world)


def test_a_standby_clears_its_series_and_reports_everything_when_it_leads_again() -> None:
    world = World(gpus=1, leading=True)
    world.controller.run_once()  # leads (nothing to plan yet)
    tenant(world, "a")
    world.place("a-pod")
    _matches_a_full_rebuild(world)
    world.leading = False
    world.controller.run_once()
    assert _series(world.metrics) == {}
    tenant(world, "b")
    world.place("b-pod")
    world.controller._metrics_at = 0.0
    world.controller.run_once()  # a standby keeps its series up to date, unpublished
    assert _series(world.metrics) == {}
    world.leading = True
    world.controller.run_once()  # published at once in the new term (within the second)
    fresh = ControllerMetrics()
    fresh.update_gpus(world.cache.ledger, world.cache.tenants())
    assert _series(world.metrics) == _series(fresh) != {}
