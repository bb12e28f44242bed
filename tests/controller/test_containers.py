"""Who may consume a claim with memory/cores limits (``dra_driver/controller/containers.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.containers import PodClaim, claim_facts, container_conflict, limits_conflict
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import container_view

OURS = "binpack.gpu.hami.io"


def is_ours(class_name: str) -> bool:
    return class_name.endswith("gpu.hami.io")


def claim(name: str, *classes: str, capacity: bool = True, reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    requests = []
    for index, class_name in enumerate(classes):
        body: dict[str, Any] = {"deviceClassName": class_name}
        if capacity and is_ours(class_name):
            body["capacity"] = {"requests": {"memory": "1Gi"}}
        requests.append({"name": f"r{index}", "exactly": body})
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"devices": {"requests": requests}},
        "status": {"reservedFor": [{"resource": "pods", "name": f"pod-{u}", "uid": u} for u in reserved]},
    }


def pod(*containers: tuple[str, list[str], dict[str, str] | None]) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": name, "resources": {"claims": [{"name": c} for c in claims], "limits": limits or {}}}
                for name, claims, limits in containers
            ]
        }
    }


def conflict(pod: dict[str, Any], claims: list[PodClaim]) -> str | None:
    return limits_conflict(PodView(pod), claims)


def facts(*claims: tuple[str, dict[str, Any]]) -> list[PodClaim]:
    return [claim_facts(name, ClaimView(body, OURS), "me", is_ours) for name, body in claims]


def test_claim_facts_read_limits_gpus_and_other_pods() -> None:
    limited = claim_facts("a", ClaimView(claim("x", OURS, reserved=("me", "u2")), OURS), "me", is_ours)
    assert limited == PodClaim("a", "ns/x", limited=True, gpu=True, other_pods=("pod-u2",), requests=("r0",))
    whole = claim_facts("b", ClaimView(claim("y", OURS, capacity=False), OURS), "me", is_ours)
    assert (whole.limited, whole.gpu) == (False, True)
    nic = claim_facts("c", ClaimView(claim("z", "rdma.example.com"), OURS), "me", is_ours)
    assert (nic.limited, nic.gpu) == (False, False)
    theirs = claim_facts("d", ClaimView(claim("w", "gpu.nvidia.com"), OURS), "me", is_ours)
    assert (theirs.limited, theirs.gpu) == (False, True)


def test_one_container_with_its_limited_claim_and_a_nic_is_fine() -> None:
    claims = facts(("gpu", claim("x", OURS)), ("nic", claim("n", "rdma.example.com")))
    assert conflict(pod(("app", ["gpu", "nic"], None)), claims) is None
    assert conflict(pod(("app", ["nic"], None)), facts(("nic", claim("n", "rdma.example.com")))) is None


@pytest.mark.parametrize(
    ("other", "what"),
    [
        (claim("w", OURS, capacity=False), "claim ns/w"),
        (claim("w", "gpu.nvidia.com"), "claim ns/w"),
        (claim("v", OURS), "claim ns/v"),
    ],
)
def test_a_limited_claim_with_another_gpu_claim_in_one_container_is_refused(
    other: dict[str, Any], what: str
) -> None:
    claims = facts(("gpu", claim("x", OURS)), ("whole", other))
    message = conflict(pod(("app", ["gpu", "whole"], None)), claims)
    assert message is not None and "container app consumes claim" in message
    assert "ns/x" in message and what in message


def test_a_limited_claim_with_a_device_plugin_gpu_in_one_container_is_refused() -> None:
    message = conflict(pod(("app", ["gpu"], {"nvidia.com/gpu": "1"})), facts(("gpu", claim("x", OURS))))
    assert message is not None and "nvidia.com/gpu" in message


def test_a_limited_claim_consumed_by_two_containers_or_reserved_by_another_pod_is_refused() -> None:
    claims = facts(("gpu", claim("x", OURS)))
    message = conflict(pod(("a", ["gpu"], None), ("b", ["gpu"], None)), claims)
    assert (
        message is not None
        and "claim ns/x with memory/cores limits is consumed by containers a, b" in message
    )
    shared = facts(("gpu", claim("x", OURS, reserved=("u2",))))
    message = conflict(pod(("a", ["gpu"], None)), shared)
    assert message is not None and "already in use by pod pod-u2" in message


def test_a_limited_claim_must_be_consumed_with_all_its_requests() -> None:
    """The claim's ordinals count all its GPUs: a container with only some of them gets wrong limits."""
    claims = facts(("gpu", claim("x", OURS, OURS)))
    partial = pod(("app", ["gpu"], None))
    partial["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu", "request": "r0"}]
    message = conflict(partial, claims)
    assert (
        message is not None and "container app consumes only some requests of claim ns/x (not r1)" in message
    )
    partial["spec"]["containers"][0]["resources"]["claims"].append({"name": "gpu", "request": "r1"})
    assert conflict(partial, claims) is None
    whole = claims[0]
    assert (
        container_conflict(
            container_view({"name": "app", "resources": {"claims": [{"name": "gpu"}]}}), {"gpu": whole}
        )
        is None
    )


def test_two_entries_naming_one_limited_claim_in_one_container_are_one_gpu_set() -> None:
    claims = facts(("g1", claim("x", OURS)), ("g2", claim("x", OURS)))
    assert conflict(pod(("app", ["g1", "g2"], None)), claims) is None


def test_whole_cards_may_be_shared_and_combined() -> None:
    claims = facts(
        ("g1", claim("x", OURS, capacity=False, reserved=("u2",))), ("g2", claim("y", "gpu.nvidia.com"))
    )
    assert conflict(pod(("a", ["g1", "g2"], {"nvidia.com/gpu": "1"}), ("b", ["g1"], None)), claims) is None


def test_the_controller_keeps_such_a_pod_pending_and_places_a_correct_one() -> None:
    """Pods created before their claims skip the webhook's check: the controller has the last word."""
    import copy

    from tests.controller.fake_cluster import PODS, FakeCluster
    from tests.controller.harness import claim as api_claim
    from tests.controller.harness import request

    cluster = FakeCluster(gpus=2)
    cluster.pod("fine", api_claim("x", request(memory="1Gi")))
    cluster.pod("twice", api_claim("x", request(memory="1Gi")))
    twice = copy.deepcopy(cluster.kube.stored(PODS, "default", "twice"))
    twice["spec"]["containers"].append({**twice["spec"]["containers"][0], "name": "sidecar"})
    cluster.add(PODS, twice)
    cluster.run()
    assert not cluster.gated("fine")
    assert cluster.gated("twice")
    condition = cluster.condition("twice")
    assert condition is not None and condition["reason"] == "GpuLimitsConflict"
    assert "consumed by containers main, sidecar" in condition["message"]
