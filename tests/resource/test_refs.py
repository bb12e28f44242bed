"""Who names what (``dra_driver/resource/refs.py``): requests -> classes, containers -> claims,
allocation results."""

from __future__ import annotations

from dra_driver.contract import DeviceId
from dra_driver.resource.refs import (
    AllocationResult,
    ClaimRef,
    ContainerView,
    PodClaimEntry,
    RequestRef,
    allocation_results,
    claim_request_refs,
    container_view,
    pod_claim_entries,
    request_refs,
    template_request_refs,
)


def body(klass: str, capacity: str | None = None, **extra: str) -> dict[str, object]:
    requests = {capacity: "1"} if capacity else {}
    return {"deviceClassName": klass, "capacity": {"requests": requests}, **extra}


SPEC = {
    "devices": {
        "requests": [
            {"name": "gpu", "exactly": body("gpu.hami.io", "memory")},
            {
                "name": "alt",
                "firstAvailable": [
                    body("big.gpu.hami.io", "cores", name="big"),
                    body("rdma.example.com", "slots", name="nic"),
                ],
            },
            {"name": "plain", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
        ]
    }
}


def test_each_request_and_each_alternative_is_one_ref_in_order() -> None:
    refs = request_refs(SPEC)
    assert [(ref.key, ref.class_name) for ref in refs] == [
        ("gpu", "gpu.hami.io"),
        ("alt/big", "big.gpu.hami.io"),
        ("alt/nic", "rdma.example.com"),
        ("plain", "gpu.nvidia.com"),
    ]
    assert [ref.request for ref in refs] == ["gpu", "alt", "alt", "plain"]
    assert refs[0] == RequestRef("gpu", None, "gpu.hami.io", frozenset({"memory"}))
    # memory or cores means HAMi-core limits; slots alone (or nothing) does not.
    assert [ref.asks_limits for ref in refs] == [True, True, False, False]


def test_claims_and_templates_are_read_at_their_own_paths() -> None:
    assert claim_request_refs({"spec": SPEC}) == request_refs(SPEC)
    assert template_request_refs({"spec": {"spec": SPEC}}) == request_refs(SPEC)
    assert claim_request_refs({}) == () and template_request_refs({"spec": {}}) == ()
    assert request_refs({"devices": {"requests": [{"name": "x"}]}}) == (), "neither exactly nor a list"


def test_a_container_names_its_claims_and_its_device_plugin_gpus() -> None:
    container = {
        "name": "app",
        "resources": {
            "claims": [{"name": "gpu"}, {"name": "two", "request": "r1"}],
            "limits": {"nvidia.com/gpu": "1", "cpu": "1"},
            "requests": {"amd.com/gpu": "1", "memory": "1Gi"},
        },
    }
    assert container_view(container) == ContainerView(
        "app", (ClaimRef("gpu"), ClaimRef("two", "r1")), ("amd.com/gpu", "nvidia.com/gpu")
    )
    assert container_view({}) == ContainerView("?", ())


def test_pod_claim_entries_keep_claim_and_template_names() -> None:
    spec = {
        "resourceClaims": [
            {"name": "a", "resourceClaimName": "shared"},
            {"name": "b", "resourceClaimTemplateName": "tpl"},
            {"name": "c"},
        ]
    }
    assert pod_claim_entries(spec) == (
        PodClaimEntry("a", claim="shared"),
        PodClaimEntry("b", template="tpl"),
        PodClaimEntry("c"),
    )


def test_allocation_results_and_which_container_request_gets_them() -> None:
    raw = [
        {"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0"},
        {"request": "alt/big", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-1", "adminAccess": True},
    ]
    results = allocation_results({"devices": {"results": raw}})
    assert results == (
        AllocationResult("gpu", DeviceId("gpu.hami.io", "n1", "gpu-0"), False, raw[0]),
        AllocationResult("alt/big", DeviceId("gpu.hami.io", "n1", "gpu-1"), True, raw[1]),
    )
    gpu, alt = results
    assert gpu.for_request(None) and gpu.for_request("gpu") and not gpu.for_request("alt")
    assert alt.for_request("alt") and alt.for_request("alt/big") and not alt.for_request("al")
    assert allocation_results(None) == () and allocation_results({}) == ()
