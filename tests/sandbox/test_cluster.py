"""The simulated control plane: template claims, reservedFor cleanup, the binder and PostFilter."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from hami_dra_dev.sandbox import SandboxServer
from hami_dra_dev.sandbox.claimcontroller import BUILTIN_FINALIZER, POD_CLAIM_NAME
from hami_dra_dev.sandbox.cluster import NodeContext, SandboxCluster
from tests import waiting
from tests.sandbox.helpers import allocation, claim_obj, pod_obj

NS = "default"
GATE = "gpu.hami.io/allocation"


def wait_for(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    return waiting.wait_for(check, timeout)


class FakeKubelet:
    started: list[NodeContext] = []  # noqa: RUF012 - test bookkeeping
    stopped: list[str] = []  # noqa: RUF012

    def __init__(self, ctx: NodeContext) -> None:
        FakeKubelet.started.append(ctx)
        self.name = ctx.name

    def stop(self) -> None:
        FakeKubelet.stopped.append(self.name)


@pytest.fixture
def cluster(sandbox: SandboxServer) -> Iterator[SandboxCluster]:
    FakeKubelet.started, FakeKubelet.stopped = [], []
    with SandboxCluster(sandbox, nodes=2, kubelet_factory=FakeKubelet, resync=0.1) as c:
        yield c


def _template(res: client.ResourceV1Api) -> None:
    res.create_namespaced_resource_claim_template(
        NS,
        {
            "metadata": {"name": "one-gpu"},
            "spec": {"metadata": {"labels": {"from": "template"}}, "spec": claim_obj("x")["spec"]},
        },
    )


def _gated_pod(name: str) -> dict[str, Any]:
    pod = pod_obj(name, claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


def test_nodes_and_kubelet_hook(cluster: SandboxCluster, sandbox_client: Any) -> None:
    nodes = client.CoreV1Api(sandbox_client).list_node().items
    assert [n.metadata.name for n in nodes] == ["node-1", "node-2"]
    assert [c.name for c in FakeKubelet.started] == ["node-1", "node-2"]
    ctx = FakeKubelet.started[0]
    assert ctx.registry_dir.is_dir() and ctx.plugins_dir.is_dir() and ctx.cdi_dir.is_dir()
    cluster.stop()
    assert sorted(FakeKubelet.stopped) == ["node-1", "node-2"]


def test_template_claims_binding_and_cleanup(
    cluster: SandboxCluster, sandbox: SandboxServer, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    _template(res)
    pod = core.create_namespaced_pod(NS, _gated_pod("p1"))
    statuses = wait_for(lambda: core.read_namespaced_pod_status("p1", NS).status.resource_claim_statuses)
    claim_name = statuses[0].resource_claim_name
    assert statuses[0].name == "gpu" and claim_name.startswith("p1-gpu-")
    claim = res.read_namespaced_resource_claim(claim_name, NS)
    assert claim.metadata.annotations[POD_CLAIM_NAME] == "gpu" and claim.metadata.labels == {
        "from": "template"
    }
    owner = claim.metadata.owner_references[0]
    assert (owner.kind, owner.uid, owner.controller, owner.block_owner_deletion) == (
        "Pod",
        pod.metadata.uid,
        True,
        True,
    )
    time.sleep(0.3)
    gated = core.read_namespaced_pod("p1", NS)
    assert gated.spec.node_name is None, "a gated pod is never scheduled"
    assert [(c.type, c.status, c.reason) for c in gated.status.conditions] == [
        ("PodScheduled", "False", "SchedulingGated")
    ]

    # an external allocator allocates for node-2 and removes the gate: the binder does the rest
    res.patch_namespaced_resource_claim_status(
        claim_name, NS, {"status": {"allocation": allocation("node-2")}}
    )
    core.patch_namespaced_pod("p1", NS, [{"op": "remove", "path": "/spec/schedulingGates"}])
    wait_for(lambda: core.read_namespaced_pod("p1", NS).spec.node_name == "node-2")
    reserved = res.read_namespaced_resource_claim(claim_name, NS).status.reserved_for
    assert [(r.resource, r.name, r.uid) for r in reserved] == [("pods", "p1", pod.metadata.uid)]

    # the pod ends: reservedFor is cleaned up and the generated claim deleted
    core.patch_namespaced_pod_status("p1", NS, {"status": {"phase": "Succeeded"}})
    wait_for(lambda: not res.list_namespaced_resource_claim(NS).items)


def test_post_filter_clears_an_allocation_for_an_unusable_node(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_namespaced_resource_claim(NS, claim_obj("c1"))
    res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": allocation("node-9")}})
    core.create_namespaced_pod(NS, pod_obj("p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}]))
    wait_for(lambda: res.read_namespaced_resource_claim("c1", NS).status.allocation is None)

    def deallocation_reported() -> bool:
        # PostFilter clears the allocation first, then records the event and the pod condition.
        events = core.list_namespaced_event(
            NS, field_selector="involvedObject.name=p1,reason=FailedScheduling"
        ).items
        conditions = core.read_namespaced_pod("p1", NS).status.conditions or []
        return any(e.message == "deallocation of ResourceClaim completed" for e in events) and any(
            c.reason == "Unschedulable" for c in conditions
        )

    wait_for(deallocation_reported)
    pod = core.read_namespaced_pod("p1", NS)
    assert pod.spec.node_name is None
    assert pod.status.conditions[0].reason == "Unschedulable"


def test_builtin_finalizer_claims_are_deallocated_when_the_pod_goes(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    claim = claim_obj("c1")
    claim["metadata"]["finalizers"] = [BUILTIN_FINALIZER]
    res.create_namespaced_resource_claim(NS, claim)
    res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": allocation("node-1")}})
    core.create_namespaced_pod(NS, pod_obj("p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}]))
    wait_for(lambda: core.read_namespaced_pod("p1", NS).spec.node_name == "node-1")
    core.delete_namespaced_pod("p1", NS)
    done = wait_for(
        lambda: (c := res.read_namespaced_resource_claim("c1", NS)).metadata.finalizers is None and c
    )
    assert done.status.allocation is None and not done.status.reserved_for


def test_bound_pod_gets_allocated_claims_reserved(cluster: SandboxCluster, sandbox_client: Any) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_namespaced_resource_claim(NS, claim_obj("c1"))
    res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": allocation("node-1")}})
    pod = core.create_namespaced_pod(
        NS, pod_obj("p1", node="node-1", claims=[{"name": "gpu", "resourceClaimName": "c1"}])
    )
    reserved = wait_for(lambda: res.read_namespaced_resource_claim("c1", NS).status.reserved_for)
    assert reserved[0].uid == pod.metadata.uid


def _shared_slice(node: str) -> dict[str, Any]:
    from tests.sandbox.helpers import slice_obj

    obj = slice_obj(f"{node}-shared", node, devices=2, driver="other.example.com")
    for dev in obj["spec"]["devices"]:
        dev["allowMultipleAllocations"] = True
        dev["capacity"]["memory"]["requestPolicy"] = {
            "default": "1Gi",
            "validRange": {"min": "1Mi", "step": "1Mi"},
        }
    obj["spec"]["devices"][0]["taints"] = [{"key": "gpu.hami.io/policy-managed", "effect": "NoSchedule"}]
    return obj


def test_first_fit_allocates_ungated_claims_and_honours_taints(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_device_class(
        {
            "metadata": {"name": "other"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}],
                "config": [{"opaque": {"driver": "other.example.com", "parameters": {"a": 1}}}],
            },
        }
    )
    res.create_resource_slice(_shared_slice("node-2"))
    claim = claim_obj("c1")
    claim["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "other",
        "capacity": {"requests": {"memory": "1000Mi"}},
    }
    res.create_namespaced_resource_claim(NS, claim)
    core.create_namespaced_pod(NS, pod_obj("p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}]))
    wait_for(lambda: core.read_namespaced_pod("p1", NS).spec.node_name == "node-2")
    got = res.read_namespaced_resource_claim("c1", NS)
    result = got.status.allocation.devices.results[0]
    assert result.device == "gpu-1", "gpu-0 carries an untolerated NoSchedule taint"
    assert result.consumed_capacity == {"memory": "1000Mi"} and result.share_id
    assert got.status.allocation.devices.config[0].source == "FromClass"
    assert BUILTIN_FINALIZER in got.metadata.finalizers
    assert [r.name for r in got.status.reserved_for] == ["p1"]


def test_first_fit_leaves_claims_pending_when_nothing_fits(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_device_class(
        {
            "metadata": {"name": "other"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}]},
        }
    )
    res.create_resource_slice(_shared_slice("node-1"))
    claim = claim_obj("big")
    claim["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "other",
        "capacity": {"requests": {"memory": "16Gi"}},
    }
    res.create_namespaced_resource_claim(NS, claim)
    core.create_namespaced_pod(NS, pod_obj("p1", claims=[{"name": "gpu", "resourceClaimName": "big"}]))
    wait_for(lambda: any(e.reason == "FailedScheduling" for e in core.list_namespaced_event(NS).items))
    status = res.read_namespaced_resource_claim("big", NS).status
    assert status is None or status.allocation is None
    assert core.read_namespaced_pod("p1", NS).spec.node_name is None


def test_binder_honours_node_filters(cluster: SandboxCluster, sandbox_client: Any) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    core.patch_node(
        "node-1", {"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}}
    )
    free = allocation("node-1")
    del free["nodeSelector"]  # usable on every node
    for name in ("c1", "c2"):
        res.create_namespaced_resource_claim(NS, claim_obj(name))
        res.patch_namespaced_resource_claim_status(name, NS, {"status": {"allocation": free}})
    core.create_namespaced_pod(
        NS, pod_obj("untolerated", claims=[{"name": "gpu", "resourceClaimName": "c1"}])
    )
    wait_for(lambda: core.read_namespaced_pod("untolerated", NS).spec.node_name == "node-2")
    tolerant = pod_obj("tolerant", claims=[{"name": "gpu", "resourceClaimName": "c2"}])
    tolerant["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    tolerant["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            }
        }
    }
    core.create_namespaced_pod(NS, tolerant)
    wait_for(lambda: core.read_namespaced_pod("tolerant", NS).spec.node_name == "node-1")


def test_first_fit_never_gives_one_device_twice(cluster: SandboxCluster, sandbox_client: Any) -> None:
    from tests.sandbox.helpers import slice_obj

    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_device_class(
        {
            "metadata": {"name": "other"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}]},
        }
    )
    res.create_resource_slice(slice_obj("node-1-other", "node-1", devices=2, driver="other.example.com"))
    for name in ("a", "b", "c"):
        claim = claim_obj(name)
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other"
        res.create_namespaced_resource_claim(NS, claim)
    core.create_namespaced_pod(
        NS,
        pod_obj(
            "two", claims=[{"name": "x", "resourceClaimName": "a"}, {"name": "y", "resourceClaimName": "b"}]
        ),
    )
    wait_for(lambda: core.read_namespaced_pod("two", NS).spec.node_name == "node-1")
    devices = {
        res.read_namespaced_resource_claim(n, NS).status.allocation.devices.results[0].device for n in "ab"
    }
    assert devices == {"gpu-0", "gpu-1"}
    core.create_namespaced_pod(NS, pod_obj("third", claims=[{"name": "x", "resourceClaimName": "c"}]))
    pod = wait_for(lambda: (p := core.read_namespaced_pod("third", NS)).status.conditions and p)
    assert pod.status.conditions[0].reason == "Unschedulable" and pod.spec.node_name is None
    assert "cannot allocate all claims" in pod.status.conditions[0].message


def test_missing_template_is_reported_then_used_once_it_exists(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    long_name = "a-pod-with-a-rather-long-name-for-truncation"
    core.create_namespaced_pod(NS, _gated_pod(long_name))
    events = wait_for(
        lambda: core.list_namespaced_event(NS, field_selector="reason=FailedResourceClaimCreation").items
    )
    assert (
        events[0].type == "Warning"
        and 'resourceclaimtemplates.resource.k8s.io "one-gpu" not found' in events[0].message
    )
    _template(res)
    statuses = wait_for(lambda: core.read_namespaced_pod_status(long_name, NS).status.resource_claim_statuses)
    name = statuses[0].resource_claim_name
    assert len(name) <= 63 and name.startswith(long_name[:28]) and "-gpu-" in name


def test_stop_leaves_no_threads_behind() -> None:
    import threading

    def ours() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("sandbox-")]

    before = ours()
    with SandboxServer.start() as server, SandboxCluster(server, 1, resync=0.1):
        assert len(ours()) > len(before)
    wait_for(lambda: ours() == before)


def test_everything_the_simulator_writes_is_valid_kubernetes(
    cluster: SandboxCluster, sandbox: SandboxServer, sandbox_client: Any
) -> None:
    from tests.kube_validate import assert_valid

    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    res.create_device_class(
        {
            "metadata": {"name": "other"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}],
                "config": [{"opaque": {"driver": "other.example.com", "parameters": {"a": 1}}}],
            },
        }
    )
    res.create_resource_slice(_shared_slice("node-1"))
    res.create_namespaced_resource_claim_template(
        NS,
        {
            "metadata": {"name": "shared"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "other",
                                    "capacity": {"requests": {"memory": "2Gi"}},
                                },
                            }
                        ]
                    }
                }
            },
        },
    )
    core.create_namespaced_pod(
        NS, pod_obj("p1", claims=[{"name": "gpu", "resourceClaimTemplateName": "shared"}])
    )
    wait_for(lambda: core.read_namespaced_pod("p1", NS).spec.node_name == "node-1")
    # The scheduler records its Scheduled event after the binding: wait for it too.
    wait_for(lambda: any(obj["kind"] == "Event" for _, obj in sandbox.api.store.iter_all()))
    stored = list(sandbox.api.store.iter_all())
    kinds = {obj["kind"] for _, obj in stored}
    assert {"Pod", "ResourceClaim", "ResourceSlice", "Event", "Node", "Namespace"} <= kinds
    for _, obj in stored:
        assert_valid(obj)


def test_an_allocation_without_timestamp_never_binds_as_on_kube_scheduler_1_36(
    cluster: SandboxCluster, sandbox_client: Any
) -> None:
    """kube-scheduler 1.36+ stamps allocationTimestamp in PreBind; the API server refuses that change."""
    core, res = client.CoreV1Api(sandbox_client), client.ResourceV1Api(sandbox_client)
    stamped, unstamped = allocation("node-1"), allocation("node-1")
    del unstamped["allocationTimestamp"]
    for name, body in (("stamped", stamped), ("unstamped", unstamped)):
        res.create_namespaced_resource_claim(NS, claim_obj(name))
        res.patch_namespaced_resource_claim_status(name, NS, {"status": {"allocation": body}})
        core.create_namespaced_pod(
            NS, pod_obj(f"{name}-pod", claims=[{"name": "gpu", "resourceClaimName": name}])
        )
    wait_for(lambda: core.read_namespaced_pod("stamped-pod", NS).spec.node_name == "node-1")

    def failed() -> list[str]:
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=unstamped-pod").items
        return [e.message for e in events if e.reason == "FailedScheduling"]

    messages = wait_for(failed)
    assert any("allocation" in m and "immutable" in m for m in messages), messages
    assert core.read_namespaced_pod("unstamped-pod", NS).spec.node_name is None
    assert not res.read_namespaced_resource_claim("unstamped", NS).status.reserved_for
