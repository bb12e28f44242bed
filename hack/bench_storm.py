#!/usr/bin/env python3
"""A pending storm: a full cluster, many pending pods, one card freed.

    .venv/bin/python hack/bench_storm.py [--nodes 5000] [--gpus 8] [--pending 1000] [--seed 1] [--tenants]

The controller runs in this process over an in-memory API (tests/controller/fake_kube.py), so
what is measured is the controller's own work, not an API server's: ``--nodes`` nodes of ``--gpus``
simulated H100 80GB, every card held whole by one claim, and ``--pending`` gated pods (the older
half needing two cards, the younger half one or two; 8-80 GiB each), all evaluated once and pending.
Then one card's claim is deleted. Reported: the time until the right pod (the oldest one that
fits one card) has its gate lifted, and the controller CPU spent on that event in all (the other
pods that still do not fit included). Before issue 15 every pending pod was planned again on
every node after any release; now only the nodes that gained room are looked at, and only one
pod per shape that stays pending.

``--tenants`` (issue 27): the pending pods all belong to one namespace (``tenant-a``), each with its
own scoring-weights annotation (so no two share a shape and none is skipped), and each needs two
cards. The event is a card freed on one node, that node's Node object updated (a label, as node
feature discovery or an operator writes them) and a one-card pod of another namespace
(``tenant-b``) arriving. Reported: the time until tenant-b's pod has its gate lifted, and the CPU
and passes the controller spends until no pending retry is left queued. Before issue 27 the Node
event replanned all of tenant-a's pods everywhere, in creation order, ahead of tenant-b's pod.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dra_driver.controller.controller import Controller  # noqa: E402
from dra_driver.devices.simulated import profile_gpus  # noqa: E402
from dra_driver.kube.api import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS  # noqa: E402
from dra_driver.resource.slice_builder import build_resource_slices  # noqa: E402
from tests.controller.fake_kube import FakeKube  # noqa: E402
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request  # noqa: E402

PROFILE = "h100-80gb"
#: One card whole: what the profile publishes (NVML's total minus the driver's reserved memory).
WHOLE_CARD = f"{profile_gpus(PROFILE, node_name='n', gpus=1)[0].memory_bytes // 2**20}Mi"
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
WEIGHTS = "hami.io/device-scoring-weights"  # read by the planner: part of a pod's pending shape


def filler(node: str, device: str) -> dict[str, Any]:
    """A claim holding one whole card, as kube-scheduler or an earlier run of ours allocated it."""
    body = claim(f"full-{node}-{device}", request(memory=WHOLE_CARD))
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": device,
                     "shareID": f"00000000-0000-4000-8000-{abs(hash((node, device))) % 10**12:012d}",
                     "consumedCapacity": {"memory": WHOLE_CARD, "cores": "100", "slots": "1"}}
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [
            {"resource": "pods", "name": f"running-{node}-{device}", "uid": f"r-{node}-{device}"}],
    }  # fmt: skip
    return body


def work_left(controller: Controller) -> bool:
    """Pods still queued for a look: woken pending pods past a pass's batch, or pods past a
    pass's time budget (``PodQueue.left_over``)."""
    return controller.queue.left_over() or controller.queue.busy()


def in_namespace(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    body["metadata"]["namespace"] = namespace
    return body


def stamp(index: int) -> str:
    return f"2026-12-01T{index // 3600:02d}:{index // 60 % 60:02d}:{index % 60:02d}Z"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tenants", action="store_true", help="pending pods of one tenant, another arrives")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # one warning per pending pod would be the bulk of the run
    rng = random.Random(args.seed)
    kube = FakeKube()
    # Synchronous writes (the pass's CPU is all measured here); no periodic resync in the way.
    controller = Controller(kube, DRIVER, write_workers=0, resync_seconds=3600)
    cache = controller.cache

    def add(kind: str, resource: Any, body: dict[str, Any]) -> dict[str, Any]:
        stored = kube.put(resource, body)
        controller._on_change(kind, None, stored)
        return stored

    started = time.perf_counter()
    slices = []
    for index in range(args.nodes):
        name = f"node-{index:05d}"
        add("Node", NODES, {"metadata": {"name": name}, "status": {"allocatable": {"pods": "250"}}})
        slices += build_resource_slices(profile_gpus(PROFILE, node_name=name, gpus=args.gpus), node_name=name,
                                        driver_name=DRIVER)  # fmt: skip
        for gpu in range(args.gpus):
            add("ResourceClaim", RESOURCE_CLAIMS, filler(name, f"gpu-{gpu}"))
    cache.refresh_inventory(slices)
    add("DeviceClass", DEVICE_CLASSES, device_class(DRIVER))
    # The older half all need two cards (no single freed card helps them); the younger half mixes
    # one- and two-card pods: the right pod is the oldest one-card pod, in the middle of the queue.
    two_cards = [(2, memory) for memory in range(8, 81, 8)]
    shapes = two_cards + [(1, memory) for memory in range(8, 81, 8)]
    pending_shapes = []
    namespace = TENANT_A if args.tenants else NS
    for index in range(args.pending):
        gpus, memory = rng.choice(two_cards if index < args.pending // 2 or args.tenants else shapes)
        pending_shapes.append((gpus, memory))
        body = claim(f"want-{index}", request(memory=f"{memory}Gi", count=gpus))
        add("ResourceClaim", RESOURCE_CLAIMS, in_namespace(body, namespace))
        annotations = {WEIGHTS: f"slot=1,core=1,memory={index + 1}"} if args.tenants else None
        body = pod(f"want-{index}", {"gpu": f"claim:want-{index}"}, annotations=annotations)
        body["metadata"]["creationTimestamp"] = stamp(index)
        add("Pod", PODS, in_namespace(body, namespace))
    controller.run_once()
    while work_left(controller):  # each pass stops at its time budget: every pod planned once
        controller.run_once()
    setup = time.perf_counter() - started
    pending = len(controller.queue.unschedulable)
    assert pending == args.pending, f"{pending} pending"
    right = (
        "tenant-b-pod"
        if args.tenants
        else f"want-{next(index for index, (gpus, _) in enumerate(pending_shapes) if gpus == 1)}"
    )

    # The event: one card's claim goes (its pod finished).
    node, device = f"node-{rng.randrange(args.nodes):05d}", f"gpu-{rng.randrange(args.gpus)}"
    key = (RESOURCE_CLAIMS.plural, NS, f"full-{node}-{device}")
    gone = kube.objects.pop(key)
    lifted_at: list[float] = []
    update = kube.update

    def timed_update(resource: Any, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        written = update(resource, obj, status=status)
        if resource is PODS and written["metadata"]["name"] == right and not status:
            lifted_at.append(time.perf_counter())  # the gate is lifted: kube-scheduler takes over
        return written

    kube.update = timed_update  # type: ignore[method-assign]
    cpu, wall = time.process_time(), time.perf_counter()
    controller._on_change("ResourceClaim", gone, None)
    if args.tenants:
        stored = kube.objects[(NODES.plural, "", node)]
        touched = {**stored, "metadata": {**stored["metadata"], "labels": {"bench/touched": "yes"}}}
        controller._on_change("Node", stored, kube.put(NODES, touched))
        body = claim(right, request(memory="8Gi"))
        add("ResourceClaim", RESOURCE_CLAIMS, in_namespace(body, TENANT_B))
        body = pod(right, {"gpu": f"claim:{right}"})
        body["metadata"]["creationTimestamp"] = stamp(args.pending)
        add("Pod", PODS, in_namespace(body, TENANT_B))
    passes = 0
    while passes < 3 or work_left(controller):  # until no pod is left queued
        controller.run_once()
        passes += 1
    placed_after = lifted_at[0] - wall if lifted_at else None
    cpu_spent = time.process_time() - cpu
    drained_after = time.perf_counter() - wall
    placed = [
        name for (plural, _, name), obj in kube.objects.items()
        if plural == PODS.plural and not obj["spec"].get("schedulingGates")
    ]  # fmt: skip
    figures = {
        "nodes": args.nodes,
        "gpus": args.nodes * args.gpus,
        "pending": args.pending,
        "setup_seconds": round(setup, 1),
        "tenants": args.tenants,
        "right_pod": right,
        "placed": placed,
        "seconds_until_right_pod_placed": None if placed_after is None else round(placed_after, 4),
        "controller_cpu_seconds_for_the_event": round(cpu_spent, 4),
        "seconds_until_no_retry_queued": round(drained_after, 4),
        "passes": passes,
        "still_pending": len(controller.queue.unschedulable),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        outcome = "placed" if right in placed else "NOT placed"
        which = "tenant-b's pod" if args.tenants else "the oldest pod that fits"
        print(
            f"pending storm: {args.nodes} nodes x {args.gpus} GPUs full, {args.pending} pods pending, "
            f"one card freed: {which} ({right}) {outcome} after "
            f"{figures['seconds_until_right_pod_placed']} s ({len(placed)} placed on the card); "
            f"controller CPU for the event {figures['controller_cpu_seconds_for_the_event']} s in "
            f"{passes} passes ({figures['seconds_until_no_retry_queued']} s until no retry queued); "
            f"{figures['still_pending']} still pending"
        )
    return 0 if right in placed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
