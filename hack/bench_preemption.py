#!/usr/bin/env python3
"""What one preemption's choice of victims costs the controller's worker.

    .venv/bin/python hack/bench_preemption.py [--nodes 40] [--gpus 8] [--shares 4]

Every node's ``--gpus`` T4 cards are full of ``--shares`` running pods each (priorities 0 to
shares-1, the younger the higher), and a pod of priority 10 asks for more than any one pod frees
on a card. Reported (JSON): the time ``preemption.candidates_for`` takes, how many plans it asked
the planner for (each plans the pod on one node with some claims hidden), the nodes it found a
candidate on and the victims of the one it chose. The search is bounded by ``TOTAL_BUDGET`` plans,
so the time grows with the shares per node, not with the nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dra_driver.controller.preemption import candidates_for  # noqa: E402
from tests.controller.test_preemption import NOW, Share, preemptor, running  # noqa: E402
from tests.controller.worlds import CacheWorld  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--shares", type=int, default=4)
    args = parser.parse_args()
    nodes = [f"node-{index}" for index in range(args.nodes)]
    world = CacheWorld(args.gpus, nodes=nodes)
    memory = 14800 // args.shares  # a T4 publishes 14967 MiB
    for node in nodes:
        for gpu in range(args.gpus):
            for share in range(args.shares):
                name = f"{node}-{gpu}-{share}"
                running(
                    world, Share(name, memory, priority=share, device=f"gpu-{gpu}", node=node, hour=1 + share)
                )
    pod = preemptor(world, min(14000, 2 * memory + 600), 10)
    plans = 0
    plan_on = world.allocator.plan_on

    def counted(*args: object) -> object:
        nonlocal plans
        plans += 1
        return plan_on(*args)  # type: ignore[arg-type]

    world.allocator.plan_on = counted  # type: ignore[assignment,method-assign]
    started = time.perf_counter()
    found = candidates_for(world.allocator, pod, now=NOW)
    elapsed = time.perf_counter() - started
    print(json.dumps({
        "nodes": args.nodes, "gpus": args.gpus, "shares": args.shares,
        "seconds": round(elapsed, 4), "plans": plans, "candidates": len(found),
        "node": found[0].node if found else None,
        "victims": [victim.key for victim in found[0].victims] if found else [],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
