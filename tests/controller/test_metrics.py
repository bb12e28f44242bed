"""The controller's capacity, per-claim and pending series, and its readiness.

Driven over the controller's test world (tests/controller/worlds.py, FakeKube): a claim placed by
the controller shows up with its namespace, name and pod on its card, and the per-claim series add
up to the card's; a pod held pending is counted under its condition's reason with its age; a
replica that stops leading drops what only the leader may say.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.controller.allocator import Unschedulable
from dra_driver.controller.controller import Controller
from dra_driver.controller.metrics import created_epoch
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, NS
from tests.controller.worlds import NODE, World, tenant


def _sample(world: World, name: str, **labels: str) -> float | None:
    return world.metrics.registry.get_sample_value(name, labels)


def _card(world: World, device: str) -> dict[str, str]:
    card = world.cache.ledger.state.nodes[NODE].card(int(device.rsplit("-", 1)[1]))
    return {"node": NODE, "device": device, "uuid": card.uuid, "model": card.product_name}


def test_claims_are_labelled_with_their_namespace_name_and_pod() -> None:
    world = World(gpus=2)
    tenant(world, "a", memory="2Gi", cores=30)
    tenant(world, "b", memory="1Gi", cores=10)
    world.place("a-pod")
    world.place("b-pod")
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    placed = {
        name: world.claim(name)["status"]["allocation"]["devices"]["results"][0]["device"] for name in "ab"
    }
    card = _card(world, placed["a"])
    who = {"claim_namespace": NS, "claim": "a", "claim_pod": "a-pod"}
    assert _sample(world, "hami_dra_claim_allocated_memory_bytes", **who, **card) == 2 * 1024**3
    assert _sample(world, "hami_dra_claim_allocated_cores", **who, **card) == 30
    assert (
        _sample(world, "hami_dra_gpu_memory_capacity_bytes", **card) == (15360 - 393) * 1024**2
    )  # a T4: total minus reserved
    assert _sample(world, "hami_dra_gpu_cores_capacity", **card) == 100
    for device in set(placed.values()):
        card = _card(world, device)
        claims = [c for c in "ab" if placed[c] == device]
        total = sum(
            _sample(world, "hami_dra_claim_allocated_memory_bytes",
                    claim_namespace=NS, claim=c, claim_pod=f"{c}-pod", **card) or 0
            for c in claims
        )  # fmt: skip
        assert _sample(world, "hami_dra_gpu_allocated_memory_bytes", **card) == total
        assert _sample(world, "hami_dra_gpu_tenants", **card) == len(claims)


def test_a_cards_series_are_exposed_with_its_node_device_uuid_and_model() -> None:
    world = World(gpus=1)
    tenant(world, "a")
    world.place("a-pod")
    world.metrics.update_gpus(world.cache.ledger)
    text = generate_latest(world.metrics.registry).decode()
    card = _card(world, "gpu-0")
    labels = f'device="gpu-0",model="{card["model"]}",node="{NODE}",uuid="{card["uuid"]}"'
    assert f"hami_dra_gpu_allocated_memory_bytes{{{labels}}} 1.073741824e+09" in text
    assert f"hami_dra_gpu_allocated_slots{{{labels}}} 1.0" in text


def test_pending_pods_by_reason_with_the_oldest_age() -> None:
    world = World(gpus=1)
    tenant(world, "huge", memory="100Gi")
    pod = world.cache.pods[f"{NS}/huge-pod"]
    assert isinstance(world.controller.decide(pod), Unschedulable)
    groups = world.reports.groups(world.cache.pod_by_uid)
    [(reason, group)] = groups.items()
    assert group.count == 1
    created = created_epoch(pod.created)
    assert created is not None and group.oldest_created == created
    world.metrics.update_pending(groups, now=created + 90)
    assert _sample(world, "hami_dra_pending_pods", reason=reason) == 1
    assert _sample(world, "hami_dra_pending_pod_max_age_seconds", reason=reason) == 90


def test_a_replica_that_stops_leading_drops_the_leaders_series() -> None:
    world = World(gpus=1)
    tenant(world, "a")
    world.place("a-pod")
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    assert _sample(world, "hami_dra_gpu_allocated_memory_bytes", **_card(world, "gpu-0")) == 1024**3
    world.metrics.clear_leader_series()
    assert _sample(world, "hami_dra_gpu_allocated_memory_bytes", **_card(world, "gpu-0")) is None


def test_ready_once_every_informer_has_listed() -> None:
    controller = Controller(FakeKube(), DRIVER, write_workers=0)
    why = controller.metrics.ready()
    assert why is not None and why.startswith("listing ") and "pods" in why
    for informer in controller.informers.values():
        informer.synced.set()
    assert controller.metrics.ready() is None


def _families(text: str) -> dict[str, list[tuple[str, tuple[tuple[str, str], ...], float]]]:
    return {
        family.name: sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples)
        for family in text_string_to_metric_families(text)
    }


def test_the_served_page_has_every_series_the_registry_collects() -> None:
    world = World(gpus=2)
    tenant(world, "a", memory="2Gi", cores=30)
    tenant(world, "huge", memory="100Gi")
    world.place("a-pod")
    assert isinstance(world.controller.decide(world.cache.pods[f"{NS}/huge-pod"]), Unschedulable)
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    world.metrics.update_pending(world.reports.groups(world.cache.pod_by_uid), now=1e10)
    body, _ = world.metrics.registry.page("text/plain")
    served = _families(body.decode())
    assert served == _families(generate_latest(world.metrics.registry).decode())
    assert served["hami_dra_claim_allocated_memory_bytes"] and served["hami_dra_pending_pods"]


def test_a_served_registry_is_warmed_once_per_term_after_the_first_publish() -> None:
    world = World(gpus=1)
    tenant(world, "a")
    world.place("a-pod")
    warms: list[str] = []
    world.metrics.registry.warm = lambda accept="": warms.append(accept) or None  # type: ignore[method-assign]
    world.metrics.update_gpus(world.cache.ledger, world.cache.tenants())
    assert warms == []  # nothing serves the page: nothing to render ahead
    world.metrics.serving = True
    world.metrics.publish_gpus()
    world.metrics.publish_gpus()
    assert len(warms) == 1  # the term's first publish only: later ones bring few new pieces
    world.metrics.clear_leader_series()
    world.metrics.publish_gpus()
    assert len(warms) == 2  # a new term publishes every card again
