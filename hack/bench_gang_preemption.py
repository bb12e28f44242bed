#!/usr/bin/env python3
"""What one gang's preemption search costs the controller's worker.

    .venv/bin/python hack/bench_gang_preemption.py [--nodes 40] [--gpus 8] [--shares 4] [--members 4]

Every node's ``--gpus`` T4 cards are full of ``--shares`` running pods each (priorities 0 to
shares-1), and a gang of ``--members`` pods of priority 10, each asking for more than any one pod
frees on a card, cannot be placed. Reported (JSON): the time ``gang_preemption.gang_candidate``
takes, how many joint plans of the gang it asked for (each plans every member on every node with
some claims hidden), the nodes its victims are on and how many. The search is bounded
(``preemption.select_joint``: 8 nodes, 24 reprieves, 8 further plans), so the time grows with the
gang's members and the nodes each joint plan looks at, not with the candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dra_driver.controller import gang_preemption  # noqa: E402
from dra_driver.controller.gang_plan import plan_gang  # noqa: E402
from dra_driver.controller.gang_refs import POD_GROUP_LABEL, GangPolicy, group_of  # noqa: E402
from tests.controller.harness import claim, pod, request  # noqa: E402
from tests.controller.test_preemption import NOW, Share, running  # noqa: E402
from tests.controller.worlds import CacheWorld  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--shares", type=int, default=4)
    parser.add_argument("--members", type=int, default=4)
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
    members = []
    for index in range(args.members):
        name = f"worker-{index}"
        world.add_claim(claim(name, request(memory=f"{min(14000, 2 * memory + 600)}Mi")))
        body = pod(name, {"gpu": f"claim:{name}"})
        body["metadata"]["labels"] = {POD_GROUP_LABEL: "train"}
        body["spec"]["priority"] = 10
        members.append(world.add_pod(body))
    ref = group_of(members[0])
    assert ref is not None
    plan = plan_gang(world.allocator, ref, GangPolicy(args.members), members)
    assert not plan.ready
    plans = 0
    real = gang_preemption.plan_gang

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal plans
        plans += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    gang_preemption.plan_gang = counted  # type: ignore[assignment]
    started = time.perf_counter()
    found = gang_preemption.gang_candidate(world.allocator, plan, now=NOW)
    elapsed = time.perf_counter() - started
    print(json.dumps({
        "nodes": args.nodes, "gpus": args.gpus, "shares": args.shares, "members": args.members,
        "seconds": round(elapsed, 4), "joint_plans": plans,
        "victim_nodes": sorted({victim.node for victim in found.victims}) if found else [],
        "victims": len(found.victims) if found else 0,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
