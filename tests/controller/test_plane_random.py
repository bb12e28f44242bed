"""Random create/delete sequences through the API: no card is ever overcommitted (checked from the API).

On the real control plane: kube-scheduler binds the pods, kube-controller-manager drops a deleted
pod's reservation (tests/controller/harness.py ``plane_harness``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.kube.api import RESOURCE_CLAIMS
from dra_driver.quantity import parse_bytes
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import Harness, claim, device_class, plane_harness, pod, request, wait_for

#: A simulated T4's published memory: nvidia-smi's 15360 MiB total minus 393 MiB reserved.
T4_MEMORY = (15360 - 393) * 2**20


@pytest.fixture
def harness(controller_plane: ControlPlane) -> Iterator[Harness]:
    with plane_harness(controller_plane, ["node-1", "node-2"]) as h:
        yield h


def usage_from_api(h: Harness) -> dict[tuple[str, str], list[int]]:
    used: dict[tuple[str, str], list[int]] = {}
    for item in h.kube.list(RESOURCE_CLAIMS).get("items") or []:
        allocation = (item.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            consumed = result["consumedCapacity"]
            entry = used.setdefault((result["pool"], result["device"]), [0, 0, 0])
            entry[0] += parse_bytes(consumed["memory"])
            entry[1] += int(consumed["cores"])
            entry[2] += int(consumed["slots"])
    return used


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_random_pods_never_overcommit_a_card(harness: Harness, seed: int) -> None:
    rng = random.Random(seed)
    for name in ("node-1", "node-2"):
        harness.publish(name, "t4", 2)
    for policy in ("binpack", "spread", "mutex,binpack"):
        harness.create_class(device_class(policy.replace(",", "-"), {"policy": policy}))
    harness.start_controller()
    live: list[str] = []
    for number in range(30):
        if live and rng.random() < 0.3:
            victim = live.pop(rng.randrange(len(live)))
            harness.delete_pod(victim)
            continue
        name = f"r{number}"
        klass = rng.choice(["binpack", "spread", "mutex-binpack"])
        memory = rng.choice(["1Gi", "4000Mi", "8Gi"])
        cores: Any = rng.choice([None, 20, 50])
        harness.create_claim(claim(name, request(klass=klass, memory=memory, cores=cores)))
        harness.create_pod(pod(name, {"gpu": f"claim:{name}"}))
        live.append(name)

    def settled() -> bool:
        # every live pod is either bound or reported pending
        return all(harness.bound_node(name) or harness.events(name) for name in live)

    wait_for(settled, timeout=30, what="all pods bound or pending")
    for (pool, device), (memory, cores, slots) in usage_from_api(harness).items():
        assert memory <= T4_MEMORY and cores <= 100 and slots <= 10, (pool, device, memory, cores, slots)
    assert any(harness.bound_node(name) for name in live)
