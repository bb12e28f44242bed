#!/usr/bin/env python3
"""``hami-dra simulate`` benchmark (`make bench`): scenario load time and placements/s end to end.

Scenarios of 500 x 8 and 5,000 x 8 GPUs (80 GiB H100s, 2 NUMA nodes per node, UUIDs, half of the
cards with 1-3 tenants of 4-16 GiB in four namespaces, a quota per namespace), like what
``simulate --from-cluster`` writes for a busy cluster, and 2,000 claims (8 GiB, 10 cores) cycling
through three policy chains. Each size is written to a temporary YAML file, then timed:

* ``load``: reading, parsing and validating the file (``load_scenario``), as YAML and as JSON;
* ``place``: building the cluster state and placing every claim in order (``run_scenario``);
* ``json``: rendering the result (``result_to_json``);
* ``end to end``: ``hami-dra simulate FILE.yaml -o json`` in-process, stdout discarded; the
  placements/s a user sees (claims / that time);
* ``snapshot``: ``simulate --from-cluster``'s conversion of API objects (the kubelet plugin's
  slices for 8 H100s per node, one allocated claim per tenant) into a scenario, without the
  API server round trip.

Figures are printed, not asserted. Goal: a 5,000-node scenario loads and answers in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import main as cli_main
from dra_driver.controller.offline import ClusterObjects
from dra_driver.devices.simulated import profile_gpus
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.simulate.render import result_to_json
from dra_driver.simulate.run import run_scenario
from dra_driver.simulate.scenario import load_scenario
from dra_driver.simulate.snapshot import take_snapshot

NAMESPACES = ("team-a", "team-b", "team-c", "team-d")
CHAINS = ("spread", "binpack,numa", "mutex,binpack")


def scenario_data(nodes: int, gpus: int, claims: int, seed: int) -> dict[str, Any]:
    """A scenario as ``simulate --from-cluster`` would write it for a busy cluster."""
    rng = random.Random(seed)
    node_specs = []
    for n in range(nodes):
        name = f"node-{n:05d}"
        cards = []
        for i in range(gpus):
            card: dict[str, Any] = {
                "index": i,
                "productName": "NVIDIA H100 80GB HBM3",
                "memory": "80Gi",
                "numaNode": i * 2 // gpus,
                "uuid": f"GPU-{n:05d}-{i:02d}-0000-0000-000000000000",
                "cores": 100,
                "slots": 10,
                "healthy": True,
                "isolation": "hami-core",
            }
            if rng.random() < 0.5:
                card["allocations"] = [
                    {
                        "memory": f"{rng.choice([4, 8, 16])}Gi",
                        "cores": rng.choice([0, 10, 20]),
                        "namespace": rng.choice(NAMESPACES),
                    }
                    for _ in range(rng.randint(1, 3))
                ]
            cards.append(card)
        node_specs.append({"name": name, "gpus": cards})
    # Large enough that most claims fit, so the figures are about placing, not refusing.
    quotas = [
        {"name": namespace, "namespace": namespace, "hard": {"memory": f"{nodes * 40}Gi"}}
        for namespace in NAMESPACES
    ]
    claim_specs = [
        {
            "name": f"claim-{c:05d}",
            "namespace": NAMESPACES[c % len(NAMESPACES)],
            "policy": CHAINS[c % len(CHAINS)],
            "memory": "8Gi",
            "cores": 10,
        }
        for c in range(claims)
    ]
    return {"nodes": node_specs, "quotas": quotas, "claims": claim_specs}


def write_scenario(path: Path, data: dict[str, Any]) -> None:
    """Plain PyYAML (not the project's writer), so the file is the same whatever is measured."""
    if path.suffix == ".json":
        path.write_text(json.dumps(data), encoding="utf-8")
        return
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    with path.open("w", encoding="utf-8") as out:
        yaml.dump(data, out, Dumper=dumper, sort_keys=False, default_flow_style=None, width=200)


def cluster_objects(nodes: int, seed: int) -> ClusterObjects:
    """Slices as the kubelet plugin publishes them and allocated claims, half the cards shared."""
    rng = random.Random(seed)
    objects = ClusterObjects()
    for n in range(nodes):
        name = f"node-{n:05d}"
        gpus = profile_gpus("h100-80gb", node_name=name, gpus=8)
        objects.slices += build_resource_slices(gpus, driver_name=DEFAULT_DRIVER_NAME, node_name=name)
        for gpu in gpus:
            for tenant in range(rng.randint(1, 3) if rng.random() < 0.5 else 0):
                result = {
                    "request": "gpu",
                    "driver": DEFAULT_DRIVER_NAME,
                    "pool": name,
                    "device": gpu.name,
                    "shareID": f"{name}-{gpu.index}-{tenant}",
                    "consumedCapacity": {
                        "memory": f"{rng.choice([4, 8, 16])}Gi",
                        "cores": "10",
                        "slots": "1",
                    },
                }
                objects.claims.append(
                    {
                        "metadata": {
                            "namespace": rng.choice(NAMESPACES),
                            "name": f"{name}-{gpu.index}-{tenant}",
                        },
                        "status": {"allocation": {"devices": {"results": [result]}}},
                    }
                )
    return objects


def timed(work: Any) -> float:
    """CPU-bound work timed without the cycle collector, as the CLI runs it (``simulate/command.py``)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start
    finally:
        gc.enable()


def bench(path: Path, claims: int) -> dict[str, float]:
    """Each step on its own, then the whole command; all without the cycle collector, as the CLI runs."""
    out: dict[str, Any] = {}
    load = timed(lambda: out.update(scenario=load_scenario(path)))
    load_json = timed(lambda: load_scenario(path.with_suffix(".json")))
    place = timed(lambda: out.update(result=run_scenario(out["scenario"])))
    render = timed(lambda: result_to_json(out["result"]))
    gc.collect()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["simulate", str(path), "--output", "json"]) == 0
    end_to_end = time.perf_counter() - start
    placed = sum(1 for decision in out["result"].decisions if decision.placement is not None)
    return {
        "load": load,
        "load_json": load_json,
        "place": place,
        "json": render,
        "end_to_end": end_to_end,
        "placed": placed,
        "rate": claims / end_to_end,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--no-snapshot", action="store_true", help="skip the --from-cluster conversion")
    args = parser.parse_args()
    sizes = [(50, 8)] if args.quick else [(500, 8), (5000, 8)]
    print(
        f"{'scenario':>10} {'file MiB':>8} {'load s':>7} {'json load s':>11} {'place s':>7} "
        f"{'output s':>8} {'end to end s':>12} {'placements/s':>12} {'placed':>7} {'snapshot s':>10}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-simulate-") as tmp:
        for nodes, gpus in sizes:
            path = Path(tmp) / f"scenario-{nodes}x{gpus}.yaml"
            data = scenario_data(nodes, gpus, args.claims, seed=42)
            write_scenario(path, data)
            write_scenario(path.with_suffix(".json"), data)
            result = bench(path, args.claims)
            snapshot = float("nan")
            if not args.no_snapshot:
                objects = cluster_objects(nodes, seed=42)
                snapshot = timed(lambda objects=objects: take_snapshot(objects, DEFAULT_DRIVER_NAME))
            print(
                f"{nodes:>6}x{gpus:<3} {path.stat().st_size / 2**20:>8.1f} {result['load']:>7.2f} "
                f"{result['load_json']:>11.2f} {result['place']:>7.2f} {result['json']:>8.2f} "
                f"{result['end_to_end']:>12.2f} {result['rate']:>12,.0f} {int(result['placed']):>7} "
                f"{snapshot:>10.2f}"
            )


if __name__ == "__main__":
    main()
