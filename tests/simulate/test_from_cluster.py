"""``simulate --from-cluster`` against a real kube-apiserver: the snapshot is what the controller
sees, and what-if claims are placed by the controller's own allocator.

The lab is made by the components that make it in a cluster: slices by the kubelet plugin's
``build_resource_slices`` over simulated GPUs, allocations by the controller's ``build_allocation``
(a whole-card result without ``shareID``, as a first-fit allocator writes it, and an
``adminAccess`` one too), quotas as ``GpuQuota`` objects and a HAMi-style ResourceQuota, Nodes
Ready as their kubelets report them. Then the real CLI, through a kubeconfig and its context,
snapshots, saves and places what-if claims, and the result is compared with the controller's own
ledger built from the same objects.

The server is shared by the run (tests/apiserver_fixtures.py): the lab's namespaces, node names,
DeviceClasses and driver name are this test's own, and simulate is told the driver
(``--driver-name``), so the other tests' slices and claims are not ours to count.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from dra_driver.cli import main
from dra_driver.contract import ISOLATION_HAMI_CORE, ISOLATION_NONE
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.ledger import Ledger
from dra_driver.devices.simulated import profile_gpus
from dra_driver.engine import ClusterState, DeviceShare
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    Kube,
    Obj,
)
from dra_driver.quantity import MIB
from dra_driver.quota import crd
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.uses import claim_uses
from dra_driver.simulate.scenario import load_scenario
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.api_objects import allocated_claim
from tests.apiserver_fixtures import create_ready_node, install_crd
from tests.controller.harness import device_class

#: The context of the control plane's kubeconfig (``hami_dra_dev.cluster.configs``).
CONTEXT = "hami-dra"
#: The seed's worked example's node, for the scenario-only tests (examples/worked-example.yaml).
WORKED_EXAMPLE_NODE = "gke-lab-node"


@dataclass(frozen=True)
class Lab:
    """One test's part of the shared server: two namespaces, its nodes, classes and driver."""

    kube: Kube
    kubeconfig: Path
    team_a: str
    team_b: str
    driver: str

    @property
    def lab_node(self) -> str:
        return f"{self.team_a}-lab"

    @property
    def big_node(self) -> str:
        return f"{self.team_a}-a100"

    @property
    def half_node(self) -> str:
        return f"{self.team_a}-half"

    @property
    def binpack_class(self) -> str:
        return f"binpack.{self.driver}"

    @property
    def spread_class(self) -> str:
        return f"spread.{self.driver}"


def lab_slices(lab: Lab) -> list[Obj]:
    """The seed's lab node (four T4s) and a node of two A100s with NVLink: gpu-0 unhealthy and
    tainted, gpu-1 without HAMi-core (isolation none) in Exclusive_Process compute mode; plus a
    node whose newest pool generation is incomplete (its slices are not counted, as the controller
    does not count them)."""
    node, big_node, driver = lab.lab_node, lab.big_node, lab.driver
    four = [replace(gpu, isolation=ISOLATION_HAMI_CORE) for gpu in profile_gpus("t4", node_name=node, gpus=4)]
    big = profile_gpus("a100-80gb", node_name=big_node, gpus=2)
    big = [
        replace(big[0], healthy=False),
        replace(big[1], isolation=ISOLATION_NONE, compute_mode="Exclusive_Process"),
    ]
    slices = build_resource_slices(four, driver_name=driver, node_name=node)
    slices += build_resource_slices(big, driver_name=driver, node_name=big_node, taint_unhealthy=True)
    partial = build_resource_slices(
        profile_gpus("t4", node_name=lab.half_node, gpus=2), node_name=lab.half_node, driver_name=driver
    )
    partial[0]["spec"]["pool"]["resourceSliceCount"] = 2
    return slices + partial


def lab_claims(lab: Lab) -> list[Obj]:
    """GPU 0 of the lab node has two 1000Mi tenants, GPU 1 one (the seed's worked example); the
    A100 without HAMi-core is taken whole, the unhealthy one keeps the tenant it had; an
    adminAccess result takes nothing; one result names a device nobody publishes."""
    mib = 1000 * MIB
    a, b, node, big = lab.team_a, lab.team_b, lab.lab_node, lab.big_node
    ours = {"klass": lab.driver, "driver": lab.driver}
    return [
        allocated_claim(a, "tenant-a", node, [(0, mib, 0)], **ours),
        allocated_claim(a, "tenant-b", node, [(0, mib, 0)], klass=lab.binpack_class, driver=lab.driver),
        allocated_claim(b, "tenant-c", node, [(1, mib, 0)], **ours),
        allocated_claim(b, "whole", big, [(1, None, 0)], **ours),
        allocated_claim(b, "before-it-failed", big, [(0, 8 * 1024 * MIB, 30)], **ours),
        allocated_claim(b, "admin", node, [(3, None, 0)], admin=True, **ours),
        allocated_claim(b, "ghost", f"{a}-gone", [(0, mib, 0)], **ours),
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


#: A label each lab node carries with its own name (kubelet's hostname label, which no kubelet sets here).
NODE_LABEL = "lab.hami.io/node"


def ready_node(name: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": {NODE_LABEL: name}},
        "spec": {},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }


@pytest.fixture
def lab(apiserver: ControlPlane, api_kube: Kube, api_namespace: str, api_driver: str) -> Lab:
    kube = api_kube
    lab = Lab(kube, apiserver.kubeconfig_path, api_namespace, f"{api_namespace}-b", api_driver)
    install_crd(kube, crd.manifest())
    # adminAccess is allowed only in a namespace labelled for it (DRAAdminAccess).
    labels = {"resource.kubernetes.io/admin-access": "true"}
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": lab.team_b, "labels": labels}})
    for name in (lab.lab_node, lab.big_node):
        create_ready_node(kube, ready_node(name))
    for klass in (lab.driver, lab.binpack_class, lab.spread_class):
        kube.create(DEVICE_CLASSES, None, device_class(klass, selectors=[f'device.driver == "{lab.driver}"']))
    for item in lab_slices(lab):
        kube.create(RESOURCE_SLICES, None, item)
    for raw in lab_claims(lab):
        status = raw.pop("status")
        created = kube.create(RESOURCE_CLAIMS, raw["metadata"]["namespace"], raw)
        created["status"] = status
        kube.update(RESOURCE_CLAIMS, created, status=True)
    a = lab.team_a
    kube.create(GPU_QUOTAS, a, gpu_quota(a, a, {"memory": "2500Mi"}))
    kube.create(GPU_QUOTAS, a, gpu_quota(a, "binpack-cards", {"devices": 1}, [lab.binpack_class]))
    kube.create(
        RESOURCE_QUOTAS,
        lab.team_b,
        {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}}},
    )
    return lab


def simulate(
    lab: Lab, capsys: pytest.CaptureFixture[str], *args: str, driver: str | None = None
) -> tuple[int, str, str]:
    kubeconfig = ["--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT]
    code = main(["simulate", "--from-cluster", *kubeconfig, "--driver-name", driver or lab.driver, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_claims(tmp_path: Path, text: str) -> str:
    path = tmp_path / "what-if.yaml"
    path.write_text(text)
    return str(path)


def what_if(lab: Lab) -> str:
    return (
        "claims:\n"
        '  - {name: latency-tier, policy: "mutex,binpack", memory: 1000Mi}\n'
        "  - {name: packed, policy: binpack, memory: 1000Mi}\n"
        f"  - {{name: over-quota, namespace: {lab.team_a}, policy: binpack, memory: 1000Mi}}\n"
    )


def test_what_if_claims_are_placed_on_the_live_cluster_as_the_controller_would(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = simulate(lab, capsys, "--claims", write_claims(tmp_path, what_if(lab)), "-o", "json")
    assert code == 0, err
    results = {result["claim"]: result for result in json.loads(out)["results"]}
    latency = results["latency-tier"]
    # The seed's worked example: mutex removes GPUs 0 and 1, binpack ties 2 and 3, index picks 2.
    assert latency["node"] == lab.lab_node and [d["index"] for d in latency["devices"]] == [2]
    lab_cards = [c for c in latency["candidates"] if c["node"] == lab.lab_node]
    assert [c["score"] for c in lab_cards] == [3.336273, 1.668137, 0.0, 0.0]  # T4s of total - reserved
    assert [c["tenants"] for c in lab_cards] == [2, 1, 0, 0]
    # Plain binpack takes the busiest card (latency-tier is on gpu-2 now, so still gpu-0).
    assert results["packed"]["node"] == lab.lab_node and results["packed"]["devices"][0]["index"] == 0
    held = results["over-quota"]
    a = lab.team_a
    assert not held["allocated"] and held["quota"] == f"{a}/{a}"
    assert held["reason"] == f"GpuQuotaExceeded: {a}/{a} memory: used 2000Mi + requested 1000Mi > hard 2500Mi"
    assert held["nodesRefused"] == []  # the quota refused it, not the nodes
    ghost = f"{lab.team_b}/ghost: device {a}-gone/gpu-0 is not in a complete published pool"
    assert ghost in err


def test_the_nodes_a_claims_pod_cannot_run_on_are_named(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node fit from the cluster's Node objects: a pod asking more CPU than any node has is
    refused node by node; a pod selecting the A100 node is planned there alone (where no card
    takes it) while the same claim without the selector fits on the lab node."""
    claims = [
        {"name": "hungry", "memory": "1000Mi", "pod": {"cpu": "16"}},
        {"name": "binpacked", "policy": "binpack", "memory": "1000Mi"},
        {
            "name": "selective",
            "policy": "binpack",
            "memory": "1000Mi",
            "pod": {"nodeSelector": {NODE_LABEL: lab.big_node}},
        },
    ]
    path = write_claims(tmp_path, yaml.safe_dump({"claims": claims}))
    code, out, err = simulate(lab, capsys, "--claims", path, "-o", "json")
    assert code == 0, err
    hungry, binpacked, selective = json.loads(out)["results"]
    assert not hungry["allocated"] and hungry["reason"] == "no node can run the pod"
    assert hungry["candidates"] == []
    assert hungry["nodesRefused"] == sorted(
        [
            {"node": lab.big_node, "reason": "InsufficientCPU"},
            {"node": lab.lab_node, "reason": "InsufficientCPU"},
        ],
        key=lambda refused: refused["node"],
    )
    assert binpacked["node"] == lab.lab_node
    assert not selective["allocated"]
    assert selective["nodesRefused"] == [{"node": lab.lab_node, "reason": "NodeSelectorMismatch"}]
    assert {card["node"] for card in selective["candidates"]} == {lab.big_node}
    code, out, _ = simulate(lab, capsys, "--claims", path)
    assert code == 0 and f"{lab.big_node} InsufficientCPU" in out and "nodes the pod cannot run on: " in out


def test_the_snapshot_round_trips_every_gpu_field_and_the_ledgers_usage(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, driver = lab.kube, lab.driver
    slices = kube.list(RESOURCE_SLICES)["items"]
    claims = kube.list(RESOURCE_CLAIMS)["items"]
    inventory = build_inventory(slices, driver)
    ledger = Ledger()
    ledger.set_inventory(inventory)
    for claim in claims:
        ledger.set_claim(claim["metadata"]["uid"], claim_uses(claim, driver))

    for name in ("snapshot.yaml", "snapshot.json"):
        saved = tmp_path / name
        code, _, err = simulate(lab, capsys, "--save", str(saved))
        assert code == 0, err
        assert f"wrote {saved}: 2 nodes, 6 GPUs" in err
        scenario = load_scenario(saved)
        assert scenario.snapshot is not None and scenario.snapshot.context == CONTEXT
        state = scenario.cluster_state()
        # The half node's pool is incomplete.
        assert sorted(state.nodes) == sorted(inventory) == sorted([lab.big_node, lab.lab_node])
        for node in inventory:
            expected, got = ledger.state.nodes[node], state.nodes[node]
            assert got.cards == expected.cards  # every field the engine compares
            assert [dict(card.links) for card in got.cards] == [dict(card.links) for card in expected.cards]
            assert {i: (u.tenants, u.used_memory, u.used_cores) for i, u in got.usage.items()} == {
                i: (u.tenants, u.used_memory, u.used_cores) for i, u in expected.usage.items()
            }

    data = yaml.safe_load((tmp_path / "snapshot.yaml").read_text())
    big = {
        gpu["index"]: gpu for node in data["nodes"] if node["name"] == lab.big_node for gpu in node["gpus"]
    }
    assert big[0]["healthy"] is False and big[0]["links"] == {1: 1200}
    assert big[1]["isolation"] == ISOLATION_NONE
    assert big[1]["wholeOnly"] is True and "wholeOnly" not in big[0]
    assert big[1]["allocations"] == [
        {
            "memory": "81157Mi",  # an A100 80GB: 81920 MiB total minus 763 MiB reserved
            "cores": 100,
            "slots": 1,  # Exclusive_Process: the card publishes one slot
            "namespace": lab.team_b,
            "deviceClass": driver,
            "claim": f"{lab.team_b}/whole (whole card)",
        }
    ]
    ours = [quota for quota in data["quotas"] if quota["namespace"] in (lab.team_a, lab.team_b)]
    assert ours == [
        {
            "name": "binpack-cards",
            "namespace": lab.team_a,
            "hard": {"devices": 1},
            "deviceClassNames": [lab.binpack_class],
        },
        {"name": lab.team_a, "namespace": lab.team_a, "hard": {"memory": "2500Mi"}},
        {"name": "resourcequota/gpu-quota", "namespace": lab.team_b, "hard": {"memory": "20000Mi"}},
    ]


def test_a_saved_snapshot_is_edited_and_simulated_with_a_claims_file(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "snapshot.yaml"
    assert simulate(lab, capsys, "--save", str(saved))[0] == 0
    data = yaml.safe_load(saved.read_text())
    lab_node = next(node for node in data["nodes"] if node["name"] == lab.lab_node)
    lab_node["gpus"][0].pop("allocations")  # what if both tenants of gpu-0 were gone?
    saved.write_text(yaml.safe_dump(data, sort_keys=False))
    claims = write_claims(tmp_path, "- {name: latency-tier, policy: 'mutex,binpack', memory: 1000Mi}\n")
    assert main(["simulate", str(saved), "--claims", claims, "-o", "json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert [d["index"] for d in result["devices"]] == [0]  # idle now, and first by index


def test_device_class_quotas_count_only_their_classes(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = lab.team_a
    claims = write_claims(
        tmp_path,
        "claims:\n"
        f"  - {{name: other-class, namespace: {a}, deviceClass: {lab.spread_class}, memory: 100Mi}}\n"
        f"  - {{name: second-card, namespace: {a}, deviceClass: {lab.binpack_class}, policy: spread,"
        " memory: 100Mi}\n",
    )
    code, out, err = simulate(lab, capsys, "--claims", claims, "-o", "json")
    assert code == 0, err
    results = {result["claim"]: result for result in json.loads(out)["results"]}
    assert results["other-class"]["allocated"]
    assert results["second-card"]["quota"] == f"{a}/binpack-cards"  # tenant-b's class holds gpu-0


def test_the_table_output_and_saving_to_stdout(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = simulate(lab, capsys, "--claims", write_claims(tmp_path, what_if(lab)))
    assert code == 0 and f"{lab.lab_node} gpu-2" in out and "PENDING GpuQuotaExceeded" in out
    code, out, _ = simulate(lab, capsys, "--save", "-")
    assert code == 0 and yaml.safe_load(out)["snapshot"]["driver"] == lab.driver


def test_a_what_if_claim_may_not_take_the_name_of_the_clusters(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write_claims(tmp_path, f"- {{name: tenant-a, namespace: {lab.team_a}, memory: 1Gi}}\n")
    code, _, err = simulate(lab, capsys, "--claims", claims)
    assert code == 2
    assert f"claims[0](tenant-a): the cluster has a ResourceClaim {lab.team_a}/tenant-a" in err


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
    apiserver: ControlPlane, api_driver: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = ["--kubeconfig", str(apiserver.kubeconfig_path)]
    save = ["--save", str(tmp_path / "s.yaml"), "--driver-name", api_driver]
    assert main(["simulate", "--from-cluster", *kubeconfig, *save]) == 2
    err = capsys.readouterr().err
    assert f"no node publishes a complete ResourceSlice pool of driver {api_driver}" in err
    kubeconfig = ["--kubeconfig", str(apiserver.kubeconfig_path), "--context", "prod"]
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
    node = WORKED_EXAMPLE_NODE
    by_hand = ClusterState(state.nodes[node].cards)
    from dra_driver.engine import Placement

    for index, memory in ((0, 1000 * MIB), (0, 1000 * MIB), (1, 1000 * MIB)):
        by_hand.allocate(Placement(node, (DeviceShare(index, memory, 0),)))
    assert state.nodes[node].score == by_hand.nodes[node].score
    assert state.nodes[node].free == by_hand.nodes[node].free


def test_an_unreachable_cluster_is_one_line(
    apiserver: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control plane's kubeconfig, pointed at a loopback port nobody listens on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    config = yaml.safe_load(apiserver.kubeconfig_path.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig.write_text(yaml.safe_dump(config))
    assert main(["simulate", "--from-cluster", "--kubeconfig", str(kubeconfig), "--save", "-"]) == 2
    err = capsys.readouterr().err
    # The line every command prints for an unreachable server (tests/test_cli.py checks them all).
    assert err.startswith("hami-dra simulate: error: cannot reach the API server at https://127.0.0.1:")
    assert err.endswith(": Failed to establish a new connection: [Errno 111] Connection refused\n")


def test_a_claims_pod_is_not_used_on_a_scenario_and_it_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario has no Node objects: a claim's node fit is said to be unused, not silently dropped."""
    scenario = Path(__file__).resolve().parents[2] / "examples" / "worked-example.yaml"
    claims = write_claims(
        tmp_path, "- {name: fits, memory: 1000Mi, pod: {cpu: '64', nodeSelector: {a: b}}}\n"
    )
    assert main(["simulate", str(scenario), "--claims", claims, "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"][-1]["allocated"]
    assert (
        "claims[" in captured.err and "(fits).pod is not used: a scenario has no Node objects" in captured.err
    )
    bad = write_claims(tmp_path, "- {name: c, pod: {cpu: lots, tolerations: [{operator: Maybe}]}}\n")
    assert main(["simulate", str(scenario), "--claims", bad]) == 2
    err = capsys.readouterr().err
    assert "claims[0](c).pod.cpu:" in err and "claims[0](c).pod.tolerations[0].operator:" in err
