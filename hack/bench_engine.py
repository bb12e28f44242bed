#!/usr/bin/env python3
"""Engine benchmark (`make bench`): placements per second and peak memory.

Clusters of 500 x 8 and 5,000 x 8 GPUs (80 GiB cards, 2 NUMA nodes per node), half of the cards
partly used (1-3 tenants of 4-16 GiB). Each run places-and-allocates a stream of 1-GPU requests
(8 GiB, 10 cores) with one policy chain; every placement updates usage like the controller does.
Successful placements and pending decisions (no card fits: every allowed node is evaluated to
explain why) are timed separately. Figures are printed, not asserted.
Goal: >= 2,000 placements/s at 500x8 and >= 500/s at 5,000x8 on one core.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from dra_driver.engine import (
    MIB,
    ClusterState,
    DeviceShare,
    GpuCard,
    NodePolicy,
    Placement,
    PlacementRequest,
    parse_policy_chain,
    place_and_allocate,
)

GIB = 1024 * MIB


def build_cluster(nodes: int, gpus: int, seed: int) -> ClusterState:
    rng = random.Random(seed)
    cards = [
        GpuCard(
            node=f"node-{n:05d}",
            index=i,
            memory=80 * GIB,
            product_name="NVIDIA H100 80GB HBM3",
            numa_node=i * 2 // gpus,
        )
        for n in range(nodes)
        for i in range(gpus)
    ]
    state = ClusterState(cards)
    for card in cards:
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                share = DeviceShare(card.index, rng.choice([4, 8, 16]) * GIB, rng.choice([0, 10, 20]))
                state.allocate(Placement(card.node, (share,)))
    return state


def bench(nodes: int, gpus: int, chain: str, placements: int, node_policy: NodePolicy) -> dict[str, float]:
    state = build_cluster(nodes, gpus, seed=42)
    request = PlacementRequest(
        name="bench", memory=8 * GIB, cores=10, policy=parse_policy_chain(chain), node_policy=node_policy
    )
    placed = pending = 0
    placed_seconds = pending_seconds = 0.0
    clock = time.perf_counter
    for _ in range(placements):
        start = clock()
        allocated = place_and_allocate(state, request).allocated
        elapsed = clock() - start
        if allocated:
            placed, placed_seconds = placed + 1, placed_seconds + elapsed
        else:
            pending, pending_seconds = pending + 1, pending_seconds + elapsed
    return {
        "rate": placed / placed_seconds if placed else 0.0,
        "placed": placed,
        "pending": pending,
        "pending_ms": 1000 * pending_seconds / pending if pending else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--placements", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    sizes = [(50, 8)] if args.quick else [(500, 8), (5000, 8)]
    print(
        f"{'cluster':>10} {'node policy':>11} {'chain':>14} {'placements/s':>13} {'placed':>7} "
        f"{'pending':>7} {'ms/pending':>10}"
    )
    for nodes, gpus in sizes:
        for node_policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
            for chain in ("spread", "binpack,numa", "mutex,binpack"):
                result = bench(nodes, gpus, chain, args.placements, node_policy)
                print(
                    f"{nodes:>6}x{gpus:<3} {node_policy.value:>11} {chain:>14} "
                    f"{result['rate']:>13,.0f} {int(result['placed']):>7} {int(result['pending']):>7} "
                    f"{result['pending_ms']:>10.2f}"
                )
    tracemalloc.start()
    start = time.perf_counter()
    state = build_cluster(5000, 8, seed=42)
    build_seconds = time.perf_counter() - start
    request = PlacementRequest(name="mem", memory=8 * GIB, policy=parse_policy_chain("binpack,numa"))
    for _ in range(100):
        place_and_allocate(state, request)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"5000x8 cluster state: built in {build_seconds:.2f}s (traced), "
        f"peak traced memory {peak / MIB:.1f} MiB"
    )


if __name__ == "__main__":
    main()
