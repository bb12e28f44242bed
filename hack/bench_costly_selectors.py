#!/usr/bin/env python3
"""One tenant's costly selectors against another tenant's pod (issue 34).

    .venv/bin/python hack/bench_costly_selectors.py [--attackers 3] [--nodes 4] [--unbounded]

The controller runs in this process over an in-memory API (tests/controller/fake_cluster.py),
passes driven back to back as its worker would. ``tenant-a`` creates ``--attackers`` pods, each
with one claim of 8 ``firstAvailable`` alternatives x 16 selectors, every selector as costly as
the per-evaluation limit lets through (841 comprehension steps, each comparing two device
quantities, which no rewrite takes out of Python) and the last of each alternative false, so every
alternative is tried on every device. Then ``tenant-b`` creates one plain pod. Reported: the
seconds until tenant-b's pod has its gate lifted, the passes that took, and the attackers' pending
message. ``--unbounded`` lifts the per-evaluation limit, the per-claim budget and the pass budget
(what the controller did before issue 34, less the literal folding).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dra_driver.cel import cost, selectors  # noqa: E402
from tests.controller.fake_cluster import FakeCluster  # noqa: E402
from tests.controller.harness import DRIVER  # noqa: E402

LIST = "[" + ", ".join(str(i) for i in range(29)) + "]"
MEMORY = 'device.capacity["gpu.hami.io"].memory'
SELECTOR = f"{LIST}.all(x, {LIST}.all(y, {MEMORY}.compareTo({MEMORY}) >= {{n}}))"


def attack_claim(alternatives: int = 8, per_alternative: int = 16) -> dict[str, Any]:
    subrequests = []
    for a in range(alternatives):
        exprs = [SELECTOR.format(n=-(a * per_alternative + s) - 1) for s in range(per_alternative)]
        exprs[-1] = "!" + exprs[-1]
        subrequests.append(
            {
                "name": f"alt{a}",
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": e}} for e in exprs],
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "x"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attackers", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--unbounded", action="store_true")
    parser.add_argument("--limit", type=float, default=600.0, help="give up after this many seconds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.unbounded:
        selectors.MAX_ESTIMATED_COST = cost.MAX_ESTIMATED_COST = 10**12  # type: ignore[misc]
        cost.CLAIM_COST_BUDGET = 10**15
    estimate = selectors.compile_selector(SELECTOR.format(n=0))
    cluster = FakeCluster([f"node-{i}" for i in range(args.nodes)])
    if args.unbounded:
        cluster.controller.queue.pass_budget = float("inf")
    for index in range(args.attackers):
        cluster.pod(f"attacker-{index}", attack_claim(), namespace="tenant-a")
    cluster.gpu_pod("victim", "1Gi", namespace="tenant-b")
    started, passes = time.perf_counter(), 0
    while cluster.gated("victim", "tenant-b") and time.perf_counter() - started < args.limit:
        cluster.controller.run_once()
        passes += 1
    waited = time.perf_counter() - started
    attacker = cluster.condition("attacker-0", "tenant-a") or {}
    print(
        json.dumps(
            {
                "unbounded": args.unbounded,
                "attackers": args.attackers,
                "nodes": args.nodes,
                "selector_estimated_cost": estimate.estimated_cost,
                "selector_error": estimate.error,
                "victim_placed": not cluster.gated("victim", "tenant-b"),
                "victim_waited_s": round(waited, 3),
                "passes": passes,
                "attacker_message": str(attacker.get("message", ""))[:240],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
