"""What the controller's informers keep (dra_driver/controller/slim.py): pods that may be ours whole,
every other pod as a neighbour whose node fit reads the same, nodes as placement reads them, our
driver's slices only; through the real informers, paged, over ``FakeKube``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dra_driver.contract import GATE_NAME
from dra_driver.controller.controller import WATCHED, Controller, api_connections
from dra_driver.controller.gang_refs import GROUP_RESOURCES
from dra_driver.controller.inventory import build_inventory
from dra_driver.controller.slim import (
    OUR_POD_ANNOTATIONS,
    SliceParts,
    keep_pod,
    may_be_ours,
    neighbour_pod,
    placement_node,
)
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Kube,
    Obj,
)
from dra_driver.resource.nodes import NodeView
from dra_driver.resource.objects import PodView, bound_requests_by_node
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.webhook.admission import translate_hami_pod
from dra_driver.webhook.hami_resources import TRANSLATED_ANNOTATION, apply_patch
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.api_objects import allocated_claim
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import DRIVER, device_class, plane_harness, wait_for
from tests.controller.harness import NS as HARNESS_NS
from tests.controller.harness import claim as harness_claim
from tests.controller.harness import pod as harness_pod
from tests.controller.harness import request as harness_request

NS = "team"
MANAGED = [
    {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}
]


def container(name: str, **requests: str) -> Obj:
    return {"name": name, "image": "busybox", "resources": {"requests": requests, "limits": requests}}


def a_pod(
    name: str,
    *containers: Obj,
    node: str | None = None,
    phase: str = "Running",
    init: tuple[Obj, ...] = (),
    **spec: Any,
) -> Obj:
    """A pod as the API lists it: managedFields, annotations, a status kubelet filled in."""
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "17",
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {"app": name},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 200 + "}"},
            "managedFields": copy.deepcopy(MANAGED),
        },
        "spec": {"containers": list(containers) or [container("main")], **spec},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True, "imageID": "sha256:" + "0" * 64}],
        },
    }
    if node:
        body["spec"]["nodeName"] = node
    if init:
        body["spec"]["initContainers"] = list(init)
    return body


def without_managed_fields(obj: Obj) -> Obj:
    kept = copy.deepcopy(obj)
    kept["metadata"].pop("managedFields", None)
    return kept


def hami_translated(name: str) -> Obj:
    """A pod with HAMi's resources as our webhook admits it: template claims and our gate."""
    pod = a_pod(name, {"name": "app", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}})
    verdict = translate_hami_pod({"uid": f"review-{name}", "object": pod, "namespace": NS}, DRIVER, DRIVER)
    assert verdict.allowed and verdict.patch
    translated = apply_patch(pod, verdict.patch)
    assert PodView(translated).gated
    return translated


NEIGHBOURS = {
    "bound, running": a_pod(
        "web", container("a", cpu="500m", memory="1Gi"), container("b", cpu="1"), node="n1"
    ),
    "larger init container": a_pod(
        "init",
        container("a", cpu="100m", memory="64Mi"),
        node="n1",
        init=(container("i", cpu="2", memory="4Gi"),),
    ),
    "overhead": a_pod(
        "kata", container("a", cpu="1"), node="n1", overhead={"cpu": "250m", "memory": "120Mi"}
    ),
    "finished": a_pod("job", container("a", cpu="3"), node="n1", phase="Succeeded"),
    "not bound yet": a_pod("new", container("a", cpu="3"), phase="Pending"),
    "another component's gate": a_pod(
        "kueue",
        container("a", cpu="1"),
        phase="Pending",
        schedulingGates=[{"name": "kueue.x-k8s.io/admission"}],
    ),
    "no requests": a_pod("best-effort", {"name": "a", "image": "busybox"}, node="n1"),
    "HAMi resources, created before the install": a_pod(
        "hami-old",
        {"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "2"}}},
        node="n1",
    ),
}


@pytest.mark.parametrize("pod", NEIGHBOURS.values(), ids=NEIGHBOURS.keys())
def test_a_pod_that_is_not_ours_reads_as_before_where_anything_reads_it(pod: Obj) -> None:
    assert not may_be_ours(pod)
    full, kept = PodView(pod), PodView(keep_pod(copy.deepcopy(pod)))
    for attribute in ("key", "uid", "resource_version", "created", "deleting", "bound_to", "active"):
        assert getattr(kept, attribute) == getattr(full, attribute), attribute
    for attribute in ("requests", "gated", "other_gates", "claim_names", "claim_keys"):
        assert getattr(kept, attribute) == getattr(full, attribute), attribute
    assert bound_requests_by_node([kept]) == bound_requests_by_node([full])
    assert "managedFields" not in kept.raw["metadata"] and "annotations" not in kept.raw["metadata"]
    assert set(kept.raw.get("status") or {}) <= {"phase"}


def test_a_deleted_neighbour_still_reads_as_deleting() -> None:
    pod = a_pod("leaving", container("a", cpu="1"), node="n1")
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:01:00Z"
    assert PodView(neighbour_pod(pod)).deleting


POSSIBLY_OURS = {
    "gated by our webhook": a_pod(
        "gated",
        schedulingGates=[{"name": GATE_NAME}],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
    ),
    "created before the install, claim by name": a_pod(
        "old", node="n1", resourceClaims=[{"name": "gpu", "resourceClaimName": "old-claim"}]
    ),
    "translated from HAMi's resources": hami_translated("hami"),
    "another driver's claim": a_pod(
        "other", resourceClaims=[{"name": "nic", "resourceClaimTemplateName": "nic"}]
    ),
}


#: Every attribute of ``PodView`` but ``placement_spec`` (the spec kept: compared on its own).
POD_VIEW_ATTRIBUTES = (
    "key", "uid", "resource_version", "created", "deleting", "bound_to", "active", "gated",
    "other_gates", "claim_names", "claim_keys", "claim_entries", "containers", "init_containers",
    "requests", "allocated_condition", "node_name", "node_selector", "required_affinity", "tolerations",
    "priority", "preemption_policy",
)  # fmt: skip


def placed_somewhere(pod: Obj) -> Obj:
    """``pod`` with everything the node filter reads, our condition and a status kubelet wrote."""
    placed = copy.deepcopy(pod)
    spec = placed["spec"]
    spec["nodeSelector"] = {"gpu": "yes"}
    spec["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }  # fmt: skip
    spec["priorityClassName"] = "batch-high"  # admission resolved it into the two fields below
    spec["priority"] = 1000
    spec["preemptionPolicy"] = "Never"
    spec["volumes"] = [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]
    spec["containers"][0]["env"] = [{"name": "X", "value": "y" * 500}]
    placed["metadata"]["annotations"].update({"hami.io/gpu-scheduler-policy": "spread", "team/x": "y"})
    placed["status"]["conditions"].append({"type": "gpu.hami.io/Allocated", "status": "False"})
    placed["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "gated-gpu-x"}]
    return placed


@pytest.mark.parametrize("pod", POSSIBLY_OURS.values(), ids=POSSIBLY_OURS.keys())
def test_a_pod_that_may_be_ours_reads_as_before_where_anything_reads_it(pod: Obj) -> None:
    """Kept as the controller reads it: every view of it, the placement annotations, the HAMi
    translation's note; the spec keeps what tells placements apart (images, environment and volumes
    do not); an annotations map stays a map (the gate's patch adds to it key by key)."""
    for full_pod in (pod, placed_somewhere(pod)):
        assert may_be_ours(full_pod)
        full, kept = PodView(full_pod), PodView(keep_pod(copy.deepcopy(full_pod)))
        for attribute in POD_VIEW_ATTRIBUTES:
            assert getattr(kept, attribute) == getattr(full, attribute), attribute
        assert kept.annotations == {
            key: value for key, value in full.annotations.items() if key in OUR_POD_ANNOTATIONS
        }
        assert "hami.io/gpu-scheduler-policy" in kept.annotations or full_pod is pod
        assert (kept.priority, kept.preemption_policy) == (
            (0, "PreemptLowerPriority") if full_pod is pod else (1000, "Never")
        )
        assert full.placement_spec.keys() >= kept.placement_spec.keys()
        assert "volumes" not in kept.placement_spec and "managedFields" not in kept.raw["metadata"]
        assert len(json.dumps(kept.raw)) < len(json.dumps(full_pod)) / (1 if full_pod is pod else 2)


def test_pods_of_one_workload_keep_one_placement_spec_and_others_another() -> None:
    """Pods that differ in an image or a volume place alike; a node selector tells them apart."""
    first = placed_somewhere(POSSIBLY_OURS["gated by our webhook"])
    second = copy.deepcopy(first)
    second["spec"]["containers"][0]["image"] = "busybox:2"
    second["spec"]["volumes"] = []
    third = copy.deepcopy(first)
    third["spec"]["nodeSelector"] = {"gpu": "other"}
    shapes = [PodView(keep_pod(copy.deepcopy(p))).placement_spec for p in (first, second, third)]
    assert shapes[0] == shapes[1] != shapes[2]


def test_a_node_keeps_what_placement_reads() -> None:
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1", "uid": "u", "resourceVersion": "9", "labels": {"zone": "a"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "managedFields": copy.deepcopy(MANAGED),
        },
        "spec": {
            "taints": [{"key": "gpu", "effect": "NoSchedule"}], "unschedulable": True,
            "podCIDR": "10.0.0.0/24",
        },
        "status": {
            "allocatable": {"cpu": "7900m", "memory": "30Gi", "pods": "110"},
            "capacity": {"cpu": "8"},
            "images": [{"names": [f"registry/image-{i}"], "sizeBytes": i} for i in range(50)],
        },
    }  # fmt: skip
    kept = placement_node(copy.deepcopy(node))
    assert NodeView.parse(kept) == NodeView.parse(node)
    assert NodeView.parse(kept).allocatable_quantities == NodeView.parse(node).allocatable_quantities
    assert "images" not in kept["status"] and "managedFields" not in kept["metadata"]
    assert kept["metadata"]["resourceVersion"] == "9"


def node_slices(node: str, gpus: int = 4) -> list[Obj]:
    found = build_resource_slices(profile_gpus("h100-80gb", node_name=node, gpus=gpus), node_name=node)
    for item in found:
        item["metadata"]["managedFields"] = copy.deepcopy(MANAGED)
    return found


@pytest.mark.parametrize("limit", [1_000_000, 3], ids=["kept", "table emptied as it fills"])
def test_slices_read_as_published_with_equal_values_kept_once(limit: int) -> None:
    published = [item for node in ("n1", "n2") for item in node_slices(node)]
    parts = SliceParts(limit)
    kept = [parts(copy.deepcopy(item)) for item in published]
    assert kept == [without_managed_fields(item) for item in published]
    assert build_inventory(kept, DRIVER) == build_inventory(published, DRIVER)
    devices = [device for item in kept for device in item["spec"]["devices"]]
    assert len({id(device) for device in devices}) == len(devices) == 8, "each device keeps its own entry"
    assert len({id(device["attributes"]) for device in devices}) == 8
    products = {id(device["attributes"]["productName"]) for device in devices}
    uuids = {id(device["attributes"]["uuid"]) for device in devices}
    memory = {id(device["capacity"]["memory"]) for device in devices}
    if limit > 3:
        assert len(products) == len(memory) == 1, "one product name, one capacity: kept once"
    assert len(uuids) == 8, "values that differ stay apart"


# --- through the informers -------------------------------------------------------------------------


def cluster() -> tuple[FakeKube, dict[str, Obj]]:
    """Objects in the API before the controller starts: a GPU node with our slices and another
    driver's, a pod bound before the install with our allocated claim, a HAMi pod the webhook
    translated, and neighbours."""
    kube = FakeKube()
    node_meta = {"name": "n1", "labels": {"gpu": "yes"}, "managedFields": copy.deepcopy(MANAGED)}
    node_status = {"allocatable": {"cpu": "8", "memory": "32Gi"}, "images": [{"names": ["x"]}]}
    kube.put(NODES, {"metadata": node_meta, "status": node_status})
    for item in build_resource_slices(
        profile_gpus("t4", node_name="n1", gpus=2), node_name="n1", driver_name=DRIVER
    ):
        kube.put(RESOURCE_SLICES, item)
    other = build_resource_slices(
        profile_gpus("t4", node_name="n1", gpus=1), node_name="n1", driver_name="nic.example.com"
    )
    for item in other:
        item["metadata"]["name"] = "nic-" + item["metadata"]["name"]
        kube.put(RESOURCE_SLICES, item)
    kube.put(DEVICE_CLASSES, device_class(DRIVER))
    pods = {
        "old": a_pod("old", container("main", cpu="1"), node="n1",
                     resourceClaims=[{"name": "gpu", "resourceClaimName": "old-claim"}]),
        "hami": hami_translated("hami"),
        **{name: pod for name, pod in NEIGHBOURS.items() if pod["metadata"]["name"] != "hami-old"},
        "hami-old": NEIGHBOURS["HAMi resources, created before the install"],
    }  # fmt: skip
    stored = {name: kube.put(PODS, copy.deepcopy(pod)) for name, pod in pods.items()}
    claim = allocated_claim(
        NS, "old-claim", "n1", [(0, 2 * 2**30, 30)], reserved_for=(("old", stored["old"]["metadata"]["uid"]),)
    )
    claim["metadata"]["managedFields"] = copy.deepcopy(MANAGED)
    kube.put(RESOURCE_CLAIMS, claim)
    return kube, stored


def synced(kube: FakeKube) -> Controller:
    """A controller whose informers listed the cluster, two objects a page, and whose worker took
    the events in; it plans nothing (not leading)."""
    controller = Controller(kube, DRIVER, write_workers=0, is_leader=lambda: False)
    for informer in controller.informers.values():
        informer.page_size = 2
        informer._relist()
    controller.run_once()
    return controller


def test_pods_listed_before_the_install_and_hami_pods_are_found_and_neighbours_counted() -> None:
    kube, stored = cluster()
    controller = synced(kube)
    cache = controller.cache
    assert set(cache.pods) == {f"{NS}/{pod['metadata']['name']}" for pod in stored.values()}
    # The pod bound before the install: its claim is ours, counted, and the pod is its consumer.
    claim = cache.claims[f"{NS}/old-claim"]
    assert claim.uses and cache.consumers[claim.key] == {f"{NS}/old"}
    assert cache.live_consumers(claim, bound_only=True)
    assert cache.ledger.generation and cache.pods[f"{NS}/old"].raw == keep_pod(copy.deepcopy(stored["old"]))
    # The HAMi pod, with its annotation (read when it is placed), waiting for its template claim.
    hami = cache.pods[f"{NS}/hami"]
    assert hami.gated and TRANSLATED_ANNOTATION in hami.annotations
    assert hami.raw == keep_pod(copy.deepcopy(stored["hami"]))
    # Every active bound pod counts on its node, ours and not, exactly as the full pods would.
    assert cache.bound_requests() == bound_requests_by_node(PodView(pod) for pod in stored.values())
    assert cache.bound_requests()["n1"]["cpu"] == pytest.approx(1 + 1.5 + 2 + 1.25 + 2)
    for key, pod in cache.pods.items():
        if key.partition("/")[2] not in ("old", "hami"):
            assert "annotations" not in pod.raw["metadata"], key
    for informer in controller.informers.values():
        for obj in informer.cache.values():
            assert "managedFields" not in obj["metadata"], informer.resource.plural


def test_the_informers_list_in_pages_only_our_slices_and_nodes_as_placement_reads_them() -> None:
    kube, _ = cluster()
    controller = synced(kube)
    pod_lists = [call for call in kube.calls if call[:2] == ("list", "pods")]
    pods = [key for key in kube.objects if key[0] == PODS.plural]
    assert len(pod_lists) == (len(pods) + 1) // 2 > 1
    slices = controller.informers["ResourceSlice"].cache.values()
    assert slices and {item["spec"]["driver"] for item in slices} == {DRIVER}
    assert "n1" in controller.cache.ledger.inventory
    node = controller.informers["Node"].cache["n1"]
    assert "images" not in node["status"] and controller.cache.nodes["n1"].labels == {"gpu": "yes"}


def test_the_connection_pool_has_room_for_every_watch_writer_and_worker() -> None:
    """7 watches, 4 watches of gang objects (gang_refs.py; each only where served), 4 writers,
    the worker, the event sender and the leader elector: 18 threads that may each hold a
    connection at once (the client's default keeps 5 per CPU)."""
    controller = Controller(FakeKube(), DRIVER)
    watched = {informer.resource for informer in controller.informers.values()}
    assert watched == set(WATCHED) | set(GROUP_RESOURCES)
    assert api_connections() == 18
    assert api_connections(8) == 22  # --write-workers 8: four more writers, four more connections


def test_the_controller_command_sizes_its_pool_from_write_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hami-dra controller --write-workers N`` opens a client whose pool holds the N writers."""
    from dra_driver.cli import build_parser
    from dra_driver.controller import command

    sizes: list[int | None] = []

    class Stop(Exception):
        pass

    def fake_client(kubeconfig: str | None, *, connections: int | None = None) -> object:
        sizes.append(connections)
        raise Stop

    monkeypatch.setattr(command, "load_api_client", fake_client)
    with pytest.raises(Stop):
        command.run(
            build_parser().parse_args(["controller", "--driver-name", DRIVER, "--write-workers", "8"])
        )
    assert sizes == [api_connections(8)]


# --- against the real control plane (HTTP, field selectors, pages, kube-scheduler) ----------------


def test_on_a_real_plane_neighbours_count_and_only_our_slices_are_listed(
    controller_plane: ControlPlane,
) -> None:
    """Everything exists before the controller starts (as before an install): another driver's
    slice, pods of other workloads (bound by kube-scheduler) and our gated pod with its claim.
    Listed in pages of two over HTTP, the controller places our pod, keeps it whole, counts the
    others' CPU on their node, and never sees the other driver's slice."""
    with plane_harness(controller_plane) as h:
        h.publish("node-1")
        nic = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-1-nic"},
            "spec": {"driver": "nic.example.com", "nodeName": "node-1",
                     "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "nic-0"}]},
        }  # fmt: skip
        h.kube.create(RESOURCE_SLICES, None, nic)
        h.create_class(device_class(DRIVER))
        for number in range(3):
            web = a_pod(f"web-{number}", container("main", cpu="250m", memory="64Mi"))
            web["metadata"] = {"name": f"web-{number}", "namespace": HARNESS_NS, "annotations": {"note": "x"}}
            del web["status"]
            h.create_pod(web)
        for number in range(3):
            wait_for(lambda number=number: h.bound_node(f"web-{number}"), what=f"web-{number} bound")
        h.create_claim(harness_claim("gpu-claim", harness_request(memory="1Gi")))
        h.create_pod(harness_pod("gpu-pod", {"gpu": "claim:gpu-claim"}))
        controller = Controller(Kube(h.server.api_client()), DRIVER)
        for informer in controller.informers.values():
            informer.page_size = 2
        h.controllers.append(controller)
        controller.start()
        wait_for(lambda: h.bound_node("gpu-pod"), what="our pod placed")
        slices = controller.informers["ResourceSlice"].snapshot()
        assert slices and {item["spec"]["driver"] for item in slices} == {DRIVER}
        pods = controller.informers["Pod"].cache
        assert "annotations" not in pods[f"{HARNESS_NS}/web-0"]["metadata"]
        assert pods[f"{HARNESS_NS}/gpu-pod"]["spec"]["resourceClaims"]
        assert controller.cache.bound_requests()["node-1"]["cpu"] >= 0.75
