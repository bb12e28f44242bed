"""``simulate --from-cluster``, ``explain`` and the controller decide with one function (issue 36, item 3).

The same objects go to the controller (through its informer queue, ``FakeCluster``), to
``explain`` (a pod created on them) and to ``simulate`` (a what-if claim of the same name and
size, placed on the objects as a command lists them): the three say the same for a quota refusal,
a node-fit refusal and a placement (the same node, cards and scores).
"""

from __future__ import annotations

from typing import Any

from dra_driver.controller.decision_record import decision_annotation, decode, encode, request_record
from dra_driver.explain.report import explain
from dra_driver.kube.api import NODES, PODS, RESOURCE_CLAIMS
from dra_driver.quantity import MIB
from dra_driver.simulate.cluster import ClusterSimulation, simulate_on_cluster
from dra_driver.simulate.scenario import ClaimSpec, Defaults
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS
from tests.explain.listed import listed, stored


def simulated(
    cluster: FakeCluster, *claims: dict[str, Any], defaults: Defaults | None = None
) -> ClusterSimulation:
    specs = [ClaimSpec.model_validate({"namespace": NS, **claim}) for claim in claims]
    return simulate_on_cluster(listed(cluster), specs, DRIVER, defaults)


def explained_now(cluster: FakeCluster, name: str) -> tuple[str, str] | None:
    body = cluster.kube.stored(PODS, NS, name)
    claims = {c["metadata"]["name"]: c for c in stored(cluster, RESOURCE_CLAIMS.plural)}
    return explain(body, claims=claims, cluster=listed(cluster), driver=DRIVER).now


def controller_says(cluster: FakeCluster, name: str) -> tuple[str, str]:
    condition = cluster.condition(name)
    assert condition is not None and condition["status"] == "False", condition
    return str(condition["reason"]), str(condition["message"])


def test_a_quota_refusal_is_the_controllers_and_the_next_claim_sees_what_was_placed() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.quota(NS, "10Gi")
    cluster.gpu_pod("first", "8Gi")
    cluster.run()
    assert not cluster.gated("first")
    # "second" would take the namespace past its quota; "small" still fits after it, and then
    # "extra" does not (claims are placed in order, each seeing the ones placed before it).
    simulation = simulated(
        cluster,
        {"name": "second", "memory": "8Gi"},
        {"name": "small", "memory": "2Gi"},
        {"name": "extra", "memory": "1Gi"},
    )
    held, small, extra = simulation.result.decisions
    assert simulation.reasons == ("GpuQuotaExceeded", None, "GpuQuotaExceeded")
    assert simulation.result.quota_blocks == (f"{NS}/team", None, f"{NS}/team")
    assert extra.reason is not None and "used 10Gi + requested 1Gi > hard 10Gi" in extra.reason
    assert held.placement is None and held.candidates  # the planner found a placement first
    assert small.placement is not None and small.placement.node == "node-1"

    cluster.gpu_pod("second", "8Gi")
    explain_says = explained_now(cluster, "second")
    cluster.run()
    reason, message = controller_says(cluster, "second")
    assert (reason, message) == explain_says == (simulation.reasons[0], held.reason)
    cluster.gpu_pod("small", "2Gi")
    cluster.run()
    assert not cluster.gated("small") and cluster.node_of("small") == small.placement.node

    # On the cluster the controller made, "extra" is refused with the message it gave before.
    (after,) = simulated(cluster, {"name": "extra", "memory": "1Gi"}).result.decisions
    assert after.reason == extra.reason


def test_a_node_fit_refusal_is_the_controllers_node_by_node() -> None:
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=1)

    def taint(node: dict[str, Any]) -> None:
        node["spec"] = {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}

    def one_cpu(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {"cpu": "1", "memory": "4Gi"}

    cluster.change(NODES, None, "node-1", taint)
    cluster.change(NODES, None, "node-2", one_cpu)
    simulation = simulated(
        cluster,
        {"name": "big", "memory": "8Gi", "pod": {"cpu": "2"}},
        {"name": "tolerant", "memory": "8Gi", "pod": {"cpu": "2", "tolerations": [{"operator": "Exists"}]}},
        {"name": "plain", "memory": "8Gi"},  # no CPU asked: node-2 takes it, node-1 is tainted
    )
    big, tolerant, plain = simulation.result.decisions
    assert simulation.reasons == ("Unschedulable", None, None)
    assert big.placement is None and big.reason == "no node can run the pod" and big.candidates == ()
    assert simulation.result.refused_on(0) == {"node-1": "TaintToleration", "node-2": "InsufficientCPU"}
    assert tolerant.placement is not None and tolerant.placement.node == "node-1"
    assert plain.placement is not None and plain.placement.node == "node-2"

    def two_cpus(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}

    def tolerating(body: dict[str, Any]) -> None:
        two_cpus(body)
        body["spec"]["tolerations"] = [{"operator": "Exists"}]

    for name, edit in (("big", two_cpus), ("tolerant", tolerating), ("plain", None)):
        cluster.gpu_pod(name, "8Gi")
        if edit is not None:
            cluster.change(PODS, NS, name, edit)
    explain_says = explained_now(cluster, "big")
    cluster.run()
    assert controller_says(cluster, "big") == explain_says == ("Unschedulable", big.reason)
    assert cluster.node_of("tolerant") == "node-1" and cluster.node_of("plain") == "node-2"


def test_a_placement_is_the_controllers_with_the_same_cards_and_scores() -> None:
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=2)
    cluster.gpu_pod("tenant", "30Gi")
    cluster.run()
    # The claim's own policy (its GpuConfig) beats the defaults, as in the controller.
    simulation = simulated(
        cluster, {"name": "next", "memory": "20Gi", "policy": "binpack"}, defaults=Defaults(policy="spread")
    )
    (decision,) = simulation.result.decisions
    assert decision.placement is not None and decision.policy.text == "binpack"

    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "next", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "20Gi"}}},
                    }
                ],
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "gpu.hami.io/v1alpha1",
                                "kind": "GpuConfig",
                                "policy": "binpack",
                            },
                        }
                    }
                ],
            }
        },
    }
    cluster.pod("next", body)
    cluster.run()
    placed = cluster.kube.stored(PODS, NS, "next")
    _, (record,) = decode(placed["metadata"]["annotations"][decision_annotation(DRIVER)])
    device_name = cluster.controller.cache.ledger.device_name
    (simulated_record,) = decode(
        encode([request_record(record.subject, decision, record.config, device_name)], "now")
    )[1]
    assert simulated_record == record  # node, devices, every card's score and reason
    assert record.node == cluster.node_of("next") == "node-1"  # binpack: next to the tenant


def test_a_what_if_claims_fields_reach_the_controllers_decision() -> None:
    """Card filters become HAMi's pod annotations, memoryPercent the claim's config, count, memory
    and cores the request's, and a refusal
    before planning shows the claim's policy (else the defaults'); a pending claim lists at most
    ``max_candidates`` cards."""
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=2)
    specs = [
        ClaimSpec.model_validate({"name": name, "namespace": NS, **fields})
        for name, fields in (
            ("other-model", {"memory": "1Gi", "productNames": ["A100"]}),
            ("this-model", {"memory": "1Gi", "productNames": ["H100"], "excludeUuids": ["GPU-nope"]}),
            ("half", {"memoryPercent": 50, "policy": "binpack"}),
            ("nowhere", {"memory": "1Gi", "pod": {"nodeSelector": {"pool": "none"}}}),
            ("pair", {"memory": "1Gi", "count": 2, "cores": 30}),
        )
    ]
    result = simulate_on_cluster(listed(cluster), specs, DRIVER, Defaults(policy="binpack"), max_candidates=3)
    other, this, half, nowhere, pair = result.result.decisions
    assert other.placement is None and other.reason is not None and "CardTypeMismatch" in other.reason
    assert len(other.candidates) == 3  # four cards scored, three listed
    assert {card.reason.value for card in other.candidates if card.reason} == {"CardTypeMismatch"}
    assert this.placement is not None
    assert half.placement is not None
    (share,) = half.placement.devices
    card = next(c for c in half.candidates if c.index == share.index and c.node == half.placement.node)
    assert share.memory == card.total_memory // 2 // MIB * MIB  # half of the card, floored to MiB
    assert nowhere.placement is None and nowhere.reason == "no node can run the pod"
    assert nowhere.policy.text == "binpack"  # the defaults': the claim names none
    assert result.result.refused_on(3) == {"node-1": "NodeSelectorMismatch", "node-2": "NodeSelectorMismatch"}
    assert result.result.refused_on(1) == {}  # placed: nothing to say
    assert pair.placement is not None and [(d.memory, d.cores) for d in pair.placement.devices] == [
        (1024 * MIB, 30),
        (1024 * MIB, 30),
    ]


def test_a_placed_claims_pod_takes_its_cpu_on_the_node_for_the_next_claims() -> None:
    """Each placement is folded back as it settles (claim allocated, pod bound): the next claim's
    pod finds the node's CPU taken, as the controller does once kube-scheduler bound the first."""
    cluster = FakeCluster(nodes=("node-1",), gpus=2)

    def one_cpu(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {"cpu": "1", "memory": "4Gi"}

    cluster.change(NODES, None, "node-1", one_cpu)
    simulation = simulated(
        cluster,
        {"name": "first", "memory": "1Gi", "pod": {"cpu": "1"}},
        {"name": "second", "memory": "1Gi", "pod": {"cpu": "1"}},
    )
    first, second = simulation.result.decisions
    assert first.placement is not None and first.placement.node == "node-1"
    assert second.placement is None and simulation.result.refused_on(1) == {"node-1": "InsufficientCPU"}

    def one_cpu_pod(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}

    cluster.gpu_pod("first", "1Gi")
    cluster.change(PODS, NS, "first", one_cpu_pod)
    cluster.run()
    cluster.bind("first")
    cluster.gpu_pod("second", "1Gi")
    cluster.change(PODS, NS, "second", one_cpu_pod)
    cluster.run()
    assert controller_says(cluster, "second") == ("Unschedulable", second.reason)


def test_a_claim_naming_no_class_gets_a_plain_one_where_the_cluster_has_none() -> None:
    """The lab of ``hami-dra cluster`` has only its recipes' classes: a what-if claim naming no
    class is placed with its own policy on a plain class of the driver's devices; one naming a
    class that does not exist waits for it, as the controller makes a real claim wait."""
    cluster = FakeCluster(gpus=2)
    objects = listed(cluster)
    objects.classes = [c for c in objects.classes if c["metadata"]["name"] != DRIVER]
    specs = [
        ClaimSpec.model_validate({"name": "plain", "namespace": NS, "memory": "1Gi", "policy": "binpack"}),
        ClaimSpec.model_validate({"name": "named", "namespace": NS, "memory": "1Gi", "deviceClass": "gone"}),
    ]
    plain, named = simulate_on_cluster(objects, specs, DRIVER).result.decisions
    assert plain.placement is not None and plain.policy.text == "binpack"
    assert named.placement is None and named.reason == f"claim {NS}/named: DeviceClass gone not found"
