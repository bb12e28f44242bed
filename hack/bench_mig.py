#!/usr/bin/env python3
"""MIG placement benchmark (issue 37): placements per second and a pending decision's cost.

Clusters of N nodes x 8 H200 cards in MIG mode, each card cut into seven 1g.18gb instances (the
most instances a card has: the worst case for the per-card free-block comparisons). A stream of
1g claims is placed-and-allocated under binpack and under spread (every placement updates the
instances in use, as the controller's ledger does), then one 7g claim that no instance can take
is decided: every node is evaluated to explain why. Figures are printed, not asserted.

    .venv/bin/python hack/bench_mig.py [--nodes 1000] [--placements 500]
"""

from __future__ import annotations

import argparse
import time

from dra_driver.devices.mig import gpu_instance_id, place
from dra_driver.devices.mig_profiles import MIG_MODELS
from dra_driver.engine import parse_policy_chain
from dra_driver.engine.mig import MigInstance, MigRequest, MigState, place_mig, place_mig_and_allocate
from dra_driver.quantity import MIB

PRODUCT = "NVIDIA H200"


def build(nodes: int, cards: int) -> MigState:
    model = MIG_MODELS[PRODUCT]
    layout = place(model, [("1g.18gb", None)] * 7)
    instances = [
        MigInstance(
            node=f"node-{n:05d}",
            name=f"gpu-{c}-mig-{gpu_instance_id(start, profile.placement_size)}-0",
            parent=c,
            parent_name=f"gpu-{c}",
            gpu_instance=gpu_instance_id(start, profile.placement_size),
            compute_instance=0,
            profile=profile.name,
            memory=profile.memory_mib * MIB,
            slices=profile.slices,
            placement_start=start,
            placement_size=profile.placement_size,
            product_name=PRODUCT,
            numa_node=c // 4,
        )
        for n in range(nodes)
        for c in range(cards)
        for profile, start in layout
    ]
    return MigState(instances)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--placements", type=int, default=500)
    args = parser.parse_args()
    for chain in ("binpack", "spread"):
        started = time.perf_counter()
        state = build(args.nodes, 8)
        built = time.perf_counter() - started
        request = MigRequest(profile="1g.18gb", policy=parse_policy_chain(chain))
        started = time.perf_counter()
        for _ in range(args.placements):
            assert place_mig_and_allocate(state, request).placement is not None
        placing = time.perf_counter() - started
        started = time.perf_counter()
        pending = place_mig(state, MigRequest(profile="7g.141gb", policy=parse_policy_chain(chain)))
        deciding = time.perf_counter() - started
        assert pending.placement is None
        print(
            f"{args.nodes} nodes x 8 cards x 7 instances, {chain}: built in {built:.2f}s; "
            f"{args.placements / placing:.0f} placements/s ({placing / args.placements * 1000:.2f} ms each); "
            f"a pending decision over every node {deciding * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
