"""``simulate --from-cluster`` against the sandbox API server: the snapshot is what the controller sees.

The lab is made by the components that make it in a cluster: slices by the kubelet plugin's
``build_resource_slices`` over simulated GPUs, allocations by the controller's ``build_allocation``
(a whole-card result without ``shareID``, as a first-fit allocator writes it, and an
``adminAccess`` one too), quotas as ``GpuQuota`` objects and a HAMi-style ResourceQuota. Then the
real CLI, through a kubeconfig and its context, snapshots, saves and places what-if claims, and
the result is compared with the controller's own ledger built from the same objects.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import main
from dra_driver.contract import ISOLATION_HAMI_CORE, ISOLATION_NONE
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import ClusterState, DeviceShare
from dra_driver.kube.api import GPU_QUOTAS, RESOURCE_CLAIMS, RESOURCE_QUOTAS, RESOURCE_SLICES, Kube, Obj
from dra_driver.quantity import MIB
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.uses import claim_uses
from dra_driver.simulate.scenario import load_scenario
from hami_dra_dev.sandbox import SandboxServer
from tests.api_objects import DRIVER, allocated_claim

LAB = "gke-lab-node"
BIG = "a100-node"


def lab_slices() -> list[Obj]:
    """The seed's lab node (four T4s) and a node of two A100s with NVLink: gpu-0 unhealthy and
    tainted, gpu-1 without HAMi-core (isolation none) in Exclusive_Process compute mode; plus a
    node whose newest pool generation is incomplete (its slices are not counted, as the controller
    does not count them)."""
    lab = [replace(gpu, isolation=ISOLATION_HAMI_CORE) for gpu in profile_gpus("t4", node_name=LAB, gpus=4)]
    big = profile_gpus("a100-80gb", node_name=BIG, gpus=2)
    big = [
        replace(big[0], healthy=False),
        replace(big[1], isolation=ISOLATION_NONE, compute_mode="Exclusive_Process"),
    ]
    slices = build_resource_slices(lab, driver_name=DRIVER, node_name=LAB)
    slices += build_resource_slices(big, driver_name=DRIVER, node_name=BIG, taint_unhealthy=True)
    partial = build_resource_slices(profile_gpus("t4", node_name="half-node", gpus=2), node_name="half-node")
    partial[0]["spec"]["pool"]["resourceSliceCount"] = 2
    return slices + partial


def lab_claims() -> list[Obj]:
    """GPU 0 of the lab node has two 1000Mi tenants, GPU 1 one (the seed's worked example); the
    A100 without HAMi-core is taken whole, the unhealthy one keeps the tenant it had; an
    adminAccess result takes nothing; one result names a device nobody publishes."""
    mib = 1000 * MIB
    return [
        allocated_claim("team-a", "tenant-a", LAB, [(0, mib, 0)]),
        allocated_claim("team-a", "tenant-b", LAB, [(0, mib, 0)], klass="gpu-binpack"),
        allocated_claim("team-b", "tenant-c", LAB, [(1, mib, 0)]),
        allocated_claim("team-b", "whole", BIG, [(1, None, 0)]),
        allocated_claim("team-b", "before-it-failed", BIG, [(0, 8 * 1024 * MIB, 30)]),
        allocated_claim("team-b", "admin", LAB, [(3, None, 0)], admin=True),
        allocated_claim("team-b", "ghost", "gone-node", [(0, mib, 0)]),
    ]


def gpu_quota(namespace: str, name: str, hard: Obj, classes: list[str] | None = None) -> Obj:
    spec: Obj = {"hard": hard}
    if classes:
        spec["deviceClassNames"] = classes
    return {
        "apiVersion": "gpu.hami.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def lab(sandbox: SandboxServer, sandbox_client: Any) -> SandboxServer:
    kube = Kube(sandbox_client)
    for namespace in ("team-a", "team-b"):
        kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    for item in lab_slices():
        kube.create(RESOURCE_SLICES, None, item)
    for raw in lab_claims():
        status = raw.pop("status")
        created = kube.create(RESOURCE_CLAIMS, raw["metadata"]["namespace"], raw)
        created["status"] = status
        kube.update(RESOURCE_CLAIMS, created, status=True)
    kube.create(GPU_QUOTAS, "team-a", gpu_quota("team-a", "team-a", {"memory": "2500Mi"}))
    kube.create(GPU_QUOTAS, "team-a", gpu_quota("team-a", "binpack-cards", {"devices": 1}, ["gpu-binpack"]))
    kube.create(
        RESOURCE_QUOTAS,
        "team-b",
        {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}}},
    )
    return sandbox


def simulate(server: SandboxServer, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    kubeconfig = ["--kubeconfig", str(server.kubeconfig_path), "--context", "sandbox"]
    code = main(["simulate", "--from-cluster", *kubeconfig, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_claims(tmp_path: Path, text: str) -> str:
    path = tmp_path / "what-if.yaml"
    path.write_text(text)
    return str(path)


WHAT_IF = """\
claims:
  - {name: latency-tier, policy: "mutex,binpack", memory: 1000Mi}
  - {name: packed, policy: binpack, memory: 1000Mi}
  - {name: over-quota, namespace: team-a, policy: binpack, memory: 1000Mi}
"""


def test_what_if_claims_are_placed_on_the_live_cluster_as_the_controller_would(
    lab: SandboxServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = simulate(lab, capsys, "--claims", write_claims(tmp_path, WHAT_IF), "-o", "json")
    assert code == 0, err
    results = {result["claim"]: result for result in json.loads(out)["results"]}
    latency = results["latency-tier"]
    # The seed's worked example: mutex removes GPUs 0 and 1, binpack ties 2 and 3, index picks 2.
    assert latency["node"] == LAB and [d["index"] for d in latency["devices"]] == [2]
    lab_cards = [c for c in latency["candidates"] if c["node"] == LAB]
    assert [c["score"] for c in lab_cards] == [3.336273, 1.668137, 0.0, 0.0]  # T4s of total - reserved
    assert [c["tenants"] for c in lab_cards] == [2, 1, 0, 0]
    # Plain binpack takes the busiest card (latency-tier is on gpu-2 now, so still gpu-0).
    assert results["packed"]["node"] == LAB and results["packed"]["devices"][0]["index"] == 0
    held = results["over-quota"]
    assert not held["allocated"] and held["quota"] == "team-a/team-a"
    assert held["reason"] == (
        "GpuQuotaExceeded: team-a/team-a memory: used 2000Mi + requested 1000Mi > hard 2500Mi"
    )
    assert "team-b/ghost: device gone-node/gpu-0 is not in a complete published pool" in err


def test_the_snapshot_round_trips_every_gpu_field_and_the_ledgers_usage(
    lab: SandboxServer, sandbox_client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = Kube(sandbox_client)
    slices = kube.list(RESOURCE_SLICES)["items"]
    claims = kube.list(RESOURCE_CLAIMS)["items"]
    inventory = build_inventory(slices, DRIVER)
    ledger = Ledger()
    ledger.set_inventory(inventory)
    for claim in claims:
        ledger.set_claim(claim["metadata"]["uid"], claim_uses(claim, DRIVER))

    for name in ("snapshot.yaml", "snapshot.json"):
        saved = tmp_path / name
        code, _, err = simulate(lab, capsys, "--save", str(saved))
        assert code == 0, err
        assert f"wrote {saved}: 2 nodes, 6 GPUs" in err
        scenario = load_scenario(saved)
        assert scenario.snapshot is not None and scenario.snapshot.context == "sandbox"
        state = scenario.cluster_state()
        assert sorted(state.nodes) == sorted(inventory) == [BIG, LAB]  # half-node: pool incomplete
        for node in inventory:
            expected, got = ledger.state.nodes[node], state.nodes[node]
            assert got.cards == expected.cards  # every field the engine compares
            assert [dict(card.links) for card in got.cards] == [dict(card.links) for card in expected.cards]
            assert {i: (u.tenants, u.used_memory, u.used_cores) for i, u in got.usage.items()} == {
                i: (u.tenants, u.used_memory, u.used_cores) for i, u in expected.usage.items()
            }

    data = yaml.safe_load((tmp_path / "snapshot.yaml").read_text())
    big = {gpu["index"]: gpu for node in data["nodes"] if node["name"] == BIG for gpu in node["gpus"]}
    assert big[0]["healthy"] is False and big[0]["links"] == {1: 1200}
    assert big[1]["isolation"] == ISOLATION_NONE
    assert big[1]["wholeOnly"] is True and "wholeOnly" not in big[0]
    assert big[1]["allocations"] == [
        {
            "memory": "81157Mi",  # an A100 80GB: 81920 MiB total minus 763 MiB reserved
            "cores": 100,
            "slots": 1,  # Exclusive_Process: the card publishes one slot
            "namespace": "team-b",
            "deviceClass": DRIVER,
            "claim": "team-b/whole (whole card)",
        }
    ]
    assert data["quotas"] == [
        {
            "name": "binpack-cards",
            "namespace": "team-a",
            "hard": {"devices": 1},
            "deviceClassNames": ["gpu-binpack"],
        },
        {"name": "team-a", "namespace": "team-a", "hard": {"memory": "2500Mi"}},
        {"name": "resourcequota/gpu-quota", "namespace": "team-b", "hard": {"memory": "20000Mi"}},
    ]


def test_a_saved_snapshot_is_edited_and_simulated_with_a_claims_file(
    lab: SandboxServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "snapshot.yaml"
    assert simulate(lab, capsys, "--save", str(saved))[0] == 0
    data = yaml.safe_load(saved.read_text())
    lab_node = next(node for node in data["nodes"] if node["name"] == LAB)
    lab_node["gpus"][0].pop("allocations")  # what if both tenants of gpu-0 were gone?
    saved.write_text(yaml.safe_dump(data, sort_keys=False))
    claims = write_claims(tmp_path, "- {name: latency-tier, policy: 'mutex,binpack', memory: 1000Mi}\n")
    assert main(["simulate", str(saved), "--claims", claims, "-o", "json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert [d["index"] for d in result["devices"]] == [0]  # idle now, and first by index


def test_device_class_quotas_count_only_their_classes(
    lab: SandboxServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write_claims(
        tmp_path,
        "claims:\n"
        "  - {name: other-class, namespace: team-a, deviceClass: gpu-spread, memory: 100Mi}\n"
        "  - {name: second-card, namespace: team-a, deviceClass: gpu-binpack, policy: spread,"
        " memory: 100Mi}\n",
    )
    code, out, err = simulate(lab, capsys, "--claims", claims, "-o", "json")
    assert code == 0, err
    results = {result["claim"]: result for result in json.loads(out)["results"]}
    assert results["other-class"]["allocated"]
    assert results["second-card"]["quota"] == "team-a/binpack-cards"  # tenant-b's class holds gpu-0


def test_the_table_output_and_saving_to_stdout(
    lab: SandboxServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = simulate(lab, capsys, "--claims", write_claims(tmp_path, WHAT_IF))
    assert code == 0 and f"{LAB} gpu-2" in out and "PENDING GpuQuotaExceeded" in out
    code, out, _ = simulate(lab, capsys, "--save", "-")
    assert code == 0 and yaml.safe_load(out)["snapshot"]["driver"] == DRIVER


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a scenario file or --from-cluster"),
        (["--from-cluster"], "nothing to place: give --claims FILE"),
        (["x.yaml", "--from-cluster", "--save", "y"], "give a scenario file or --from-cluster"),
        (["x.yaml", "--save", "y.yaml"], "--save goes with --from-cluster"),
        (["x.yaml", "--context", "c"], "--context goes with --from-cluster"),
        (["--from-cluster", "--claims", "c.yaml", "--save", "-"], "--save - writes the snapshot to stdout"),
        (
            ["--from-cluster", "--save", "s.yaml", "--kubeconfig", "/nonexistent"],
            "cannot load Kubernetes config",
        ),
    ],
)
def test_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_empty_cluster_and_a_missing_context_are_reported(
    sandbox: SandboxServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = simulate(sandbox, capsys, "--save", str(tmp_path / "s.yaml"))
    assert code == 2 and "no node publishes a complete ResourceSlice pool of driver gpu.hami.io" in err
    kubeconfig = ["--kubeconfig", str(sandbox.kubeconfig_path), "--context", "prod"]
    assert main(["simulate", "--from-cluster", *kubeconfig, "--save", "-"]) == 2
    assert "cannot load Kubernetes config" in capsys.readouterr().err


def test_an_overcommitted_card_is_recorded_as_observed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The controller records what others allocated even past a card's capacity; a snapshot too."""
    card = "{index: 0, memory: 1Gi, allocations: [{memory: 1Gi}, {memory: 1Gi}]}"
    for snapshot, code in (("snapshot: {context: lab}\n", 0), ("", 2)):
        path = tmp_path / "s.yaml"
        path.write_text(
            f"{snapshot}nodes: [{{name: n, gpus: [{card}]}}]\nclaims: [{{name: c, memory: 1Mi}}]\n"
        )
        assert main(["simulate", str(path), "-o", "json"]) == code
        captured = capsys.readouterr()
        if code == 0:
            (result,) = json.loads(captured.out)["results"]
            assert result["reason"] == "1/1 CardInsufficientMemory"
        else:
            assert "allocations use 2147483648 bytes of memory" in captured.err


def test_observed_state_matches_a_state_built_by_hand() -> None:
    """``cluster_state`` records each node's tenants in one placement: same usage as one by one."""
    scenario_path = Path(__file__).resolve().parents[2] / "examples" / "worked-example.yaml"
    state = load_scenario(scenario_path).cluster_state()
    by_hand = ClusterState(state.nodes[LAB].cards)
    from dra_driver.engine import Placement

    for index, memory in ((0, 1000 * MIB), (0, 1000 * MIB), (1, 1000 * MIB)):
        by_hand.allocate(Placement(LAB, (DeviceShare(index, memory, 0),)))
    assert state.nodes[LAB].score == by_hand.nodes[LAB].score
    assert state.nodes[LAB].free == by_hand.nodes[LAB].free


def test_an_unreachable_cluster_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SandboxServer.start() as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(server.kubeconfig_path.read_text())
    assert main(["simulate", "--from-cluster", "--kubeconfig", str(kubeconfig), "--save", "-"]) == 2
    err = capsys.readouterr().err
    # The line every command prints for an unreachable server (tests/test_cli.py checks them all).
    assert err.startswith("hami-dra simulate: error: cannot reach the API server at https://127.0.0.1:")
    assert err.endswith(": Failed to establish a new connection: [Errno 111] Connection refused\n")
