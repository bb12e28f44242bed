"""The typed views parsed once where objects enter the controller (dra_driver/resource/objects.py):
PodView, ClaimView, DeviceClassView, and the helpers they are made of."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.contract import FINALIZER, GATE_NAME, DeviceId
from dra_driver.controller.allocation import node_selector
from dra_driver.resource.objects import (
    ClaimView,
    DeviceClassView,
    ObjectView,
    PodView,
    bound_requests_by_node,
    pinned_node,
    pod_requests,
    template_claim,
)
from dra_driver.resource.uses import claim_uses
from tests.controller.harness import DRIVER, NS, claim, device_class, pod, request


def test_a_pod_view_reads_identity_gate_and_requests_once() -> None:
    raw = pod("p", {"gpu": "claim:c1"})
    raw["metadata"].update(uid="u-1", resourceVersion="7", creationTimestamp="2026-12-01T00:00:00Z")
    raw["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    raw["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2"}}}]
    view = PodView.parse(raw)
    assert (view.key, view.uid, view.resource_version, view.created) == (
        f"{NS}/p",
        "u-1",
        "7",
        "2026-12-01T00:00:00Z",
    )
    assert view.gated and view.other_gates and view.active and not view.bound_to and not view.deleting
    assert view.requests == {"cpu": 2.0, "memory": 1024.0**3}  # the larger init container wins for CPU
    assert PodView.parse(view) is view  # parsing a view again costs nothing


def test_a_pod_view_is_the_object_itself_read_only() -> None:
    raw = pod("p", {})
    view = PodView.parse(raw)
    assert view == raw and dict(view) == raw and view["metadata"]["name"] == "p"
    assert copy.deepcopy(dict(view)) == raw  # a write starts from a copy of the object
    with pytest.raises(TypeError):
        view["spec"] = {}  # type: ignore[index]


@pytest.mark.parametrize(
    ("edit", "gated", "other", "active", "bound"),
    [
        (lambda p: p["spec"].pop("schedulingGates"), False, False, True, ""),
        (lambda p: p["spec"].update(schedulingGates=[{"name": "x/y"}]), False, True, True, ""),
        (
            lambda p: p["spec"].update(schedulingGates=[{"name": GATE_NAME}], nodeName="n1"),
            True,
            True,
            True,
            "n1",
        ),
        (lambda p: p.update(status={"phase": "Succeeded"}), True, True, False, ""),
    ],
    ids=["ungated", "another-gate", "bound", "finished"],
)
def test_a_pod_views_gate_activity_and_binding_flags(
    edit: Any, gated: bool, other: bool, active: bool, bound: str
) -> None:
    raw = pod("p", {})
    edit(raw)
    view = PodView.parse(raw)
    assert (view.gated, view.other_gates, view.active, view.bound_to) == (gated, other, active, bound)


def test_a_pods_template_claims_resolve_through_its_status_and_are_none_until_created() -> None:
    raw = pod("p", {"a": "claim:direct", "b": "template:t"})
    view = PodView.parse(raw)
    assert view.claim_names == (("a", "direct"), ("b", None))
    assert view.claim_keys == (f"{NS}/direct",)
    raw["status"] = {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-xyz"}]}
    view = PodView.parse(raw)
    assert view.claim_names == (("a", "direct"), ("b", "p-b-xyz"))
    assert view.claim_keys == (f"{NS}/direct", f"{NS}/p-b-xyz")


@pytest.mark.parametrize(
    ("spec", "priority", "policy"),
    [
        ({}, 0, "PreemptLowerPriority"),  # no PriorityClass applies: 0, and kube-scheduler's default
        ({"priority": 1000, "preemptionPolicy": "Never"}, 1000, "Never"),
        ({"priority": -5}, -5, "PreemptLowerPriority"),
        ({"priority": 2_000_001_000}, 2_000_001_000, "PreemptLowerPriority"),  # system-node-critical
        ({"priority": "1000"}, 0, "PreemptLowerPriority"),  # not what the API server accepts
        ({"priority": True}, 0, "PreemptLowerPriority"),
    ],
)
def test_a_pod_views_priority_is_what_admission_resolved_and_zero_otherwise(
    spec: dict[str, Any], priority: int, policy: str
) -> None:
    raw = pod("p", {"gpu": "claim:c"})
    raw["spec"].update(spec)
    view = PodView.parse(raw)
    assert (view.priority, view.preemption_policy) == (priority, policy)


def test_pod_requests_take_the_larger_of_containers_and_init_containers_plus_overhead() -> None:
    def container(**amounts: str) -> dict[str, Any]:
        return {"name": "c", "resources": {"requests": amounts}}

    spec = {
        "containers": [container(cpu="500m"), container(cpu="1")],
        "initContainers": [container(cpu="2", memory="1Gi")],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests({"spec": spec}) == {"cpu": 2.1, "memory": float(2**30)}


def test_a_claim_view_reads_finalizer_allocation_reservations_owners_and_uses() -> None:
    raw = claim("c", request(memory="1Gi"))
    raw["metadata"].update(
        uid="cu", resourceVersion="12", finalizers=["other/keep", FINALIZER],
        annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
        ownerReferences=[{"kind": "Pod", "uid": "pod-u", "name": "p"}, {"kind": "Job", "uid": "job-u"}],
    )  # fmt: skip
    raw["status"] = {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-3", "shareID": "s",
             "consumedCapacity": {"memory": "1Gi", "cores": "10", "slots": "1"}},
            {"request": "gpu", "driver": "other.io", "pool": "n1", "device": "x"}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-u"}],
    }  # fmt: skip
    view = ClaimView(raw, DRIVER)
    assert view.ours and view.reserved and view.reserved_uids == ("pod-u",)
    assert view.owners == (("pod-u", "gpu"),)  # only Pod owners name a pod claim
    assert view.owner_uids == ("pod-u", "job-u")
    assert view.request_classes == {"gpu": DRIVER}
    assert view.uses == claim_uses(raw, DRIVER)
    assert [use.device for use in view.uses] == [DeviceId(DRIVER, "n1", "gpu-3")]  # other drivers not counted
    assert view.allocation is raw["status"]["allocation"]
    assert ClaimView.parse(view, DRIVER) is view


def test_an_unallocated_claim_without_owners_or_finalizer() -> None:
    view = ClaimView(claim("c", request()), DRIVER)
    assert not view.ours and view.allocation is None and not view.reserved
    assert view.owners == () and view.uses == ()


def test_a_pod_owned_claim_without_the_pod_claim_annotation_names_no_pod_claim() -> None:
    raw = claim("c", request())
    raw["metadata"]["ownerReferences"] = [{"kind": "Pod", "uid": "pod-u", "name": "p"}]
    view = ClaimView(raw, DRIVER)
    assert view.owners == () and view.owner_uids == ("pod-u",)  # owned, but not made from a template entry


def test_the_pinned_node_is_the_one_node_an_allocations_node_selector_names() -> None:
    assert pinned_node({"nodeSelector": node_selector("x")}) == "x"
    assert pinned_node(None) is None


@pytest.mark.parametrize(
    ("mine", "theirs", "newer", "at_least"),
    [("10", "9", True, True), ("10", "10", False, True), ("9", "10", False, False),
     ("abc", "abc", False, True), ("abd", "abc", False, False), ("10", "", False, False)],
)  # fmt: skip
def test_resource_versions_compare_as_numbers_and_opaque_ones_only_by_equality(
    mine: str, theirs: str, newer: bool, at_least: bool
) -> None:
    def view(rv: str) -> ObjectView:
        return ObjectView({"metadata": {"resourceVersion": rv}})

    assert view(mine).newer_than(view(theirs)) is newer
    assert view(mine).at_least(view(theirs)) is at_least


def test_bound_requests_count_active_bound_pods_only() -> None:
    def bound(name: str, node: str, cpu: str, phase: str = "Running") -> PodView:
        raw = pod(name, {}, gated=False)
        raw["spec"]["nodeName"] = node
        raw["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
        raw["status"] = {"phase": phase}
        return PodView.parse(raw)

    pods = [bound("a", "n1", "500m"), bound("b", "n1", "250m"), bound("c", "n2", "1"),
            bound("done", "n1", "4", phase="Succeeded"), PodView.parse(pod("gated", {}))]  # fmt: skip
    assert bound_requests_by_node(pods) == {
        "n1": {"cpu": 0.75, "memory": 0.0},
        "n2": {"cpu": 1.0, "memory": 0.0},
    }


def test_a_device_class_view_knows_whether_it_is_ours() -> None:
    ours = DeviceClassView(device_class("gpu-small"), DRIVER)
    assert ours.ours
    foreign = {"metadata": {"name": "other"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    assert not DeviceClassView(foreign, DRIVER).ours


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ({"extendedResourceName": "nvidia.com/gpu"}, "nvidia.com/gpu"),
        ({"extendedResourceName": ""}, None),
        ({}, None),
        (None, None),
    ],
)
def test_a_device_class_view_reads_the_extended_resource_it_maps(spec: Any, name: str | None) -> None:
    view = DeviceClassView({"metadata": {"name": "gpus"}, "spec": spec}, DRIVER)
    assert view.extended_resource_name == name
    assert not view.ours and view.config == ()


def test_missing_metadata_reads_as_empty_not_as_a_name() -> None:
    view = ObjectView({"spec": {}})
    assert (view.namespace, view.name, view.key, view.uid, view.resource_version, view.created) == (
        "",
        "",
        "/",
        "",
        "",
        "",
    )
    assert not view.deleting and view.annotations == {}


def test_a_view_names_its_object_for_events_even_as_a_list_item() -> None:
    """A list's items carry no apiVersion/kind: the view knows its own (an Event's ``regarding``)."""
    meta = {"name": "c", "namespace": "ns", "uid": "u1"}
    assert ClaimView({"metadata": meta}, DRIVER).reference() == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
    }
    assert PodView({"metadata": meta}).reference()["kind"] == "Pod"
    assert PodView({"metadata": meta}).reference()["apiVersion"] == "v1"
    assert DeviceClassView({"metadata": {"name": "x"}}, DRIVER).reference()["kind"] == "DeviceClass"
    # What the object says wins (a newer version served to a client that asked for it).
    said = {"apiVersion": "resource.k8s.io/v2", "kind": "ResourceClaim", "metadata": meta}
    assert ClaimView(said, DRIVER).reference()["apiVersion"] == "resource.k8s.io/v2"


def test_a_template_reads_as_the_claim_it_stamps_out() -> None:
    config = [{"opaque": {"driver": DRIVER, "parameters": {"policy": "binpack"}}}]
    requests = [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]
    template = {
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": requests, "config": config}}},
    }
    claim = template_claim(template, DRIVER)
    assert (claim.key, claim.config, claim.request_classes) == ("ns/t", tuple(config), {"gpu": "x"})
    assert template_claim({"metadata": {"name": "t"}}, DRIVER).config == ()
