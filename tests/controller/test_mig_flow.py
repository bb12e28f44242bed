"""MIG claims through the controller over ``FakeKube`` (issue 37): a gated pod of the MIG class is
placed, bound and recorded like any other; quotas count the instance's memory; the decision record
on the pod names the chosen instance; a MIG card's instances are never handed to the card class."""

from __future__ import annotations

import json

from dra_driver.controller.allocator import Placed, Unschedulable
from dra_driver.controller.decision_record import decision_annotation, decode
from dra_driver.controller.reasons import Reason
from dra_driver.kube.api import GPU_QUOTAS
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.controller.mig_world import MIG_CLASS, SEVEN_1G, mig_class, mig_slices, profile_selector
from tests.controller.worlds import NODE, World


def mig_world(cards: list[list[str] | None]) -> World:
    world = World()
    world.cache.refresh_inventory(mig_slices(cards, node=NODE))
    world.add_class(mig_class())
    return world


def mig_tenant(world: World, name: str, profile: str) -> None:
    body = claim(name, request(klass=MIG_CLASS))
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = profile_selector(profile)
    world.add_claim(body)
    world.add_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}))


def test_three_1g_pods_bind_on_one_card_then_a_7g_on_the_untouched_card() -> None:
    world = mig_world([SEVEN_1G, ["7g.141gb"], SEVEN_1G])
    for name in ("a", "b", "c"):
        mig_tenant(world, name, "1g.18gb")
        assert world.place(f"{name}-pod").outcome == "bound"
    assert [world.devices(n) for n in ("a", "b", "c")] == [
        ["gpu-0-mig-7-0"],
        ["gpu-0-mig-8-0"],
        ["gpu-0-mig-9-0"],
    ]
    (result,) = world.claim("a")["status"]["allocation"]["devices"]["results"]
    assert "shareID" not in result and "consumedCapacity" not in result  # given out whole
    mig_tenant(world, "big", "7g.141gb")
    assert world.place("big-pod").outcome == "bound"
    assert world.devices("big") == ["gpu-1-mig-0-0"]
    # The pod's decision record names the instance, its placement and what it left free.
    _, records = decode(world.pod("c-pod")["metadata"]["annotations"][decision_annotation(DRIVER)])
    (record,) = records
    assert record.devices == ("gpu-0-mig-9-0",)
    chosen = next(card for card in record.cards if card.chosen)
    assert chosen.note == "1g.18gb at slice 2 of gpu-0 (2 in use); leaves free blocks 4+1 (of 4+2)"


def test_an_instance_in_use_is_not_given_twice_and_the_pod_waits_saying_why() -> None:
    world = mig_world([["3g.71gb", "1g.18gb@4"]])
    mig_tenant(world, "a", "1g.18gb")
    assert world.place("a-pod").outcome == "bound"
    mig_tenant(world, "b", "1g.18gb")
    outcome = world.decide("b-pod")
    assert isinstance(outcome, Unschedulable)
    assert "1/2 DeviceSelectorMismatch, 1/2 MigInstanceInUse" in outcome.message


def test_a_gpu_quota_counts_mig_memory_and_refuses_past_it() -> None:
    world = mig_world([["3g.71gb", "2g.35gb", "1g.18gb"]])
    cap = {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "90Gi"}}}
    world.deliver("GpuQuota", cap)
    mig_tenant(world, "a", "3g.71gb")
    assert world.place("a-pod").outcome == "bound"
    world.cache.quotas.sync(world.kube, force=True)
    used = world.kube.stored(GPU_QUOTAS, NS, "cap")["status"]["used"]
    assert used == {"memory": "71424Mi", "cores": 42, "devices": 1}
    mig_tenant(world, "b", "2g.35gb")  # 71424Mi + 33792Mi > 90Gi
    outcome = world.decide("b-pod")
    assert isinstance(outcome, Unschedulable) and outcome.reason is Reason.QUOTA_EXCEEDED
    assert "memory: used 71424Mi + requested 33Gi > hard 90Gi" in outcome.message
    mig_tenant(world, "c", "1g.18gb")  # 71424Mi + 16896Mi fits
    assert isinstance(world.decide("c-pod"), Placed)


def test_the_card_class_gets_the_whole_card_never_a_mig_instance() -> None:
    world = mig_world([None, SEVEN_1G])
    world.add_claim(claim("w", request(count=2)))
    world.add_pod(pod("w-pod", {"gpu": "claim:w"}))
    outcome = world.decide("w-pod")
    assert isinstance(outcome, Unschedulable)  # one card is not in MIG mode: two cannot be had
    world.add_claim(claim("one", request()))
    world.add_pod(pod("one-pod", {"gpu": "claim:one"}))
    assert world.place("one-pod").outcome == "bound"
    assert world.devices("one") == ["gpu-0"]
    assert json.dumps(world.claim("one")).count("mig") == 0


def test_each_instance_has_its_memory_and_held_series_and_the_claim_its_own() -> None:
    world = mig_world([["3g.71gb", "1g.18gb@4"]])
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    instance = next(i for i in world.cache.ledger.mig_state.instances(NODE) if i.profile == "1g.18gb")
    labels = {
        "node": NODE,
        "device": "gpu-0-mig-11-0",
        "uuid": instance.uuid,
        "model": "NVIDIA H200",
        "profile": "1g.18gb",
        "parent": "gpu-0",
    }
    sample = world.metrics.registry.get_sample_value
    assert sample("hami_dra_mig_instance_memory_bytes", labels) == 16896 * 1024**2
    assert sample("hami_dra_mig_instance_allocated", labels) == 0
    mig_tenant(world, "a", "1g.18gb")
    assert world.place("a-pod").outcome == "bound"
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    assert sample("hami_dra_mig_instance_allocated", labels) == 1
    assert (
        sample(
            "hami_dra_mig_instance_allocated",
            {**labels, "device": "gpu-0-mig-1-0", "uuid": _uuid(world, "3g.71gb"), "profile": "3g.71gb"},
        )
        == 0
    )
    claim = {"claim_namespace": NS, "claim": "a", "claim_pod": "a-pod"}
    gpu = {k: labels[k] for k in ("node", "device", "uuid", "model")}
    assert sample("hami_dra_claim_allocated_memory_bytes", {**claim, **gpu}) == 16896 * 1024**2


def _uuid(world: World, profile: str) -> str:
    return next(i.uuid for i in world.cache.ledger.mig_state.instances(NODE) if i.profile == profile)


def test_hamis_annotation_names_the_instance_and_its_memory() -> None:
    world = mig_world([["3g.71gb", "1g.18gb@4"]])
    mig_tenant(world, "a", "1g.18gb")
    assert world.place("a-pod").outcome == "bound"
    instance = next(i for i in world.cache.ledger.mig_state.instances(NODE) if i.profile == "1g.18gb")
    annotation = world.pod("a-pod")["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    assert annotation == f"{instance.uuid},NVIDIA,16896,14:;"
