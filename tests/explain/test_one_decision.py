"""``explain`` and the controller decide with one function (issue 36, item 3).

The same objects go to the controller (through its informer queue, ``FakeCluster``) and to
``explain`` (as a command lists them): what explain says the controller would do now is what it
then does, for a pod it refuses for a quota, one no node can run (node fit), one whose containers
cannot enforce its limits, and one it places (the same node, cards and scores).
"""

from __future__ import annotations

from typing import Any

from dra_driver.controller.containers import GPU_LIMITS_CONFLICT
from dra_driver.controller.decision_record import decision_annotation, decode, encode
from dra_driver.explain.render import render
from dra_driver.explain.report import Explanation, explain
from dra_driver.kube.api import NODES, PODS, RESOURCE_CLAIMS
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS, claim, pod, request
from tests.explain.listed import listed, stored


def explained(cluster: FakeCluster, name: str) -> Explanation:
    body = cluster.kube.stored(PODS, NS, name)
    claims = {c["metadata"]["name"]: c for c in stored(cluster, RESOURCE_CLAIMS.plural)}
    return explain(body, claims=claims, cluster=listed(cluster), driver=DRIVER)


def controller_says(cluster: FakeCluster, name: str) -> tuple[str, str]:
    condition = cluster.condition(name)
    assert condition is not None and condition["status"] == "False", condition
    return str(condition["reason"]), str(condition["message"])


def added_pod(cluster: FakeCluster, name: str, edit: Any = None, *, memory: str = "8Gi") -> None:
    """A claim ``name`` of ``memory`` and a gated pod using it, ``edit``-ed before it is created."""
    body = claim(name, request(memory=memory))
    body["metadata"]["namespace"] = NS
    cluster.add(RESOURCE_CLAIMS, body)
    spec = pod(name, {"gpu": f"claim:{name}"})
    if edit is not None:
        edit(spec)
    cluster.add(PODS, spec)


def test_a_quota_refusal_is_explained_as_the_controller_reports_it() -> None:
    cluster = FakeCluster(gpus=2)
    cluster.quota(NS, "10Gi")
    cluster.gpu_pod("first", "8Gi")
    cluster.run()
    assert not cluster.gated("first")
    cluster.gpu_pod("second", "8Gi")
    before = explained(cluster, "second")  # before the controller saw it
    cluster.run()
    reason, message = controller_says(cluster, "second")
    assert reason == "GpuQuotaExceeded" and "team memory" in message
    assert before.now == (reason, message) == explained(cluster, "second").now
    # The placement the quota refused is shown card by card: the planner found one.
    assert before.requests and before.requests[0].node == "node-1"
    assert before.note != "it fits now: the controller places it at its next pass"
    assert f"now: {message}" in render(before) and message.startswith(f"{reason}: ")


def test_a_node_fit_refusal_is_explained_node_by_node() -> None:
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=1)

    def taint(node: dict[str, Any]) -> None:
        node["spec"] = {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}

    def one_cpu(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {"cpu": "1", "memory": "4Gi"}

    cluster.change(NODES, None, "node-1", taint)
    cluster.change(NODES, None, "node-2", one_cpu)

    def two_cpus(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}

    added_pod(cluster, "big", two_cpus)
    before = explained(cluster, "big")
    cluster.run()
    reason, message = controller_says(cluster, "big")
    assert (reason, message) == ("Unschedulable", "no node can run the pod")
    assert before.now == (reason, message)
    assert before.nodes_refused == {"node-1": "TaintToleration", "node-2": "InsufficientCPU"}
    assert before.requests == [] and before.reasons == {}
    assert "nodes the pod cannot run on: 1 InsufficientCPU (node-2); 1 TaintToleration (node-1)" in render(
        before
    )

    # The same pod tolerating the taint fits on node-1 only: explain says so, the controller agrees.
    def tolerant(body: dict[str, Any]) -> None:
        two_cpus(body)
        body["spec"]["tolerations"] = [{"operator": "Exists"}]

    added_pod(cluster, "tolerant", tolerant)
    fits = explained(cluster, "tolerant")
    assert fits.nodes_refused == {"node-2": "InsufficientCPU"} and fits.now is None
    assert [request.node for request in fits.requests] == ["node-1"]
    cluster.run()
    assert not cluster.gated("tolerant") and cluster.node_of("tolerant") == "node-1"


def test_a_limits_conflict_is_explained_as_the_controller_reports_it() -> None:
    cluster = FakeCluster(gpus=2)

    def limited_twice(body: dict[str, Any]) -> None:
        body["spec"]["containers"].append(
            {"name": "second", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
        )

    added_pod(cluster, "shared", limited_twice)
    before = explained(cluster, "shared")
    cluster.run()
    reason, message = controller_says(cluster, "shared")
    assert reason == GPU_LIMITS_CONFLICT and "consumed by containers main, second" in message
    assert before.now == (reason, message) and before.requests == []


def test_a_pod_that_fits_is_placed_where_explain_said_with_the_same_scores() -> None:
    cluster = FakeCluster(nodes=("node-1", "node-2"), gpus=2)
    cluster.gpu_pod("tenant", "30Gi")
    cluster.run()
    cluster.gpu_pod("next", "20Gi")
    before = explained(cluster, "next")
    assert before.now is None and before.note == "it fits now: the controller places it at its next pass"
    assert before.nodes_refused == {}
    cluster.run()
    assert not cluster.gated("next")
    placed = cluster.kube.stored(PODS, NS, "next")
    _, records = decode(placed["metadata"]["annotations"][decision_annotation(DRIVER)])
    # The pod's record keeps scores to a few decimals: explain's, recorded the same way, are equal.
    assert decode(encode(before.requests, "now"))[1] == records
    after = explained(cluster, "next")
    assert after.state == "allocated" and after.requests == records
