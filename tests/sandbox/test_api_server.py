"""The sandbox API server's semantics, through the real ``kubernetes`` Python client."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from dra_driver.kube.errors import KubeError
from hami_dra_dev.sandbox import SandboxServer
from tests.sandbox.helpers import allocation, claim_obj, node_obj, pod_obj, slice_obj

NS = "default"


def rv(obj: Any) -> int:
    return int(obj.metadata.resource_version)


def error(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    import json

    body: dict[str, Any] = json.loads(exc.value.body)
    return body


def test_starts_fast_and_serves_version() -> None:
    t0 = time.monotonic()
    with SandboxServer.start() as server:
        started = time.monotonic() - t0
        info = client.VersionApi(server.api_client()).get_code()
    assert started < 1.0
    assert (info.major, info.minor) == ("1", "36")


def test_kube_version_is_configurable() -> None:
    with SandboxServer.start(kube_version="1.34") as server:
        assert client.VersionApi(server.api_client()).get_code().minor == "34"
    with pytest.raises(ValueError, match=r"unsupported Kubernetes version '1\.20'"):
        SandboxServer(kube_version="1.20")


def test_bearer_token_is_required(sandbox: SandboxServer) -> None:
    cfg = client.Configuration()
    cfg.host = sandbox.url
    cfg.ssl_ca_cert = str(sandbox.tls.cert_file)
    cfg.api_key = {"authorization": "Bearer wrong"}
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(client.ApiClient(cfg)).list_namespace()
    assert exc.value.status == 401


def test_crud_sets_server_fields_and_generation(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    created = res.create_resource_slice(slice_obj("s1", "node-1"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    created.metadata.labels = {"a": "b"}
    relabeled = res.replace_resource_slice("s1", created)
    assert relabeled.metadata.generation == 1, "metadata-only change keeps the generation"
    assert rv(relabeled) > rv(created)
    relabeled.spec.pool.generation = 2
    changed = res.replace_resource_slice("s1", relabeled)
    assert changed.metadata.generation == 2
    assert res.read_resource_slice("s1").spec.pool.generation == 2
    res.delete_resource_slice("s1")
    with pytest.raises(ApiException) as exc:
        res.read_resource_slice("s1")
    assert exc.value.status == 404
    assert error(exc)["reason"] == "NotFound"


def test_already_exists_and_missing_namespace(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    res.create_namespaced_resource_claim(NS, claim_obj("c1"))
    with pytest.raises(ApiException) as exc:
        res.create_namespaced_resource_claim(NS, claim_obj("c1"))
    assert (exc.value.status, error(exc)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as exc:
        res.create_namespaced_resource_claim("nope", claim_obj("c2"))
    assert exc.value.status == 404
    assert error(exc)["message"] == 'namespaces "nope" not found'


def test_invalid_objects_get_422_with_field_paths(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    bad = slice_obj("s1", "node-1")
    bad["spec"]["devices"][1]["name"] = "gpu-0"
    bad["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "not-semver"}
    bad["spec"]["allNodes"] = True
    with pytest.raises(ApiException) as exc:
        res.create_resource_slice(bad)
    body = error(exc)
    assert exc.value.status == 422 and body["reason"] == "Invalid"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"spec", "spec.devices[1].name", "spec.devices[0].attributes[driverVersion].version"}
    assert body["message"].startswith('ResourceSlice.resource.k8s.io "s1" is invalid: [')

    too_many = slice_obj("s2", "node-1", devices=129)
    with pytest.raises(ApiException) as exc:
        res.create_resource_slice(too_many)
    assert error(exc)["details"]["causes"][0]["field"] == "spec.devices"

    claim = claim_obj("c1")
    claim["spec"]["devices"]["config"] = [
        {"requests": ["missing"], "opaque": {"driver": "gpu.hami.io", "parameters": {}}}
    ]
    with pytest.raises(ApiException) as exc:
        res.create_namespaced_resource_claim(NS, claim)
    assert error(exc)["details"]["causes"][0]["field"] == "spec.devices.config[0].requests[0]"


def test_unknown_fields_are_rejected_like_strict_decoding(sandbox: SandboxServer) -> None:
    obj = slice_obj("s1", "node-1")
    obj["spec"]["devices"][0]["capacity"]["memory"]["bogus"] = 1
    with pytest.raises(Exception) as exc:
        sandbox.api.create(sandbox.api.store and _rt("resourceslices"), "", obj)
    assert "strict decoding error" in str(exc.value) and "spec.devices[0].capacity.memory.bogus" in str(
        exc.value
    )


def test_type_errors_are_400_and_missing_fields_422(sandbox: SandboxServer) -> None:
    from hami_dra_dev.sandbox.errors import ApiError

    obj = slice_obj("s1", "node-1")
    obj["spec"]["devices"][0]["name"] = 5
    with pytest.raises(ApiError) as exc:
        sandbox.api.create(_rt("resourceslices"), "", obj)
    assert exc.value.code == 400
    assert (
        "cannot unmarshal number into Go struct field ResourceSlice.spec.devices[0].name" in exc.value.message
    )
    with pytest.raises(ApiError) as exc:
        sandbox.api.create(_rt("resourceslices"), "", {"metadata": {"name": "s2"}})
    assert exc.value.code == 422 and exc.value.status()["details"]["causes"][0]["field"] == "spec"


def _rt(plural: str) -> Any:
    from hami_dra_dev.sandbox.resources import RESOURCE_TYPES

    return next(r for r in RESOURCE_TYPES if r.plural == plural)


def test_stale_resource_version_conflicts(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    first = res.create_resource_slice(slice_obj("s1", "node-1"))
    stale = copy.deepcopy(first)
    first.metadata.labels = {"x": "1"}
    res.replace_resource_slice("s1", first)
    stale.metadata.labels = {"x": "2"}
    with pytest.raises(ApiException) as exc:
        res.replace_resource_slice("s1", stale)
    body = error(exc)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in body["message"]


def test_status_subresource_rules(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    claim = claim_obj("c1")
    claim["status"] = {"allocation": allocation("node-1")}
    created = res.create_namespaced_resource_claim(NS, claim)
    assert created.status is None or created.status.allocation is None, "status is dropped on create"

    # reservedFor needs an allocation
    with pytest.raises(ApiException) as exc:
        res.patch_namespaced_resource_claim_status(
            "c1", NS, {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
        )
    assert error(exc)["details"]["causes"][0]["field"] == "status.reservedFor"

    # a status update ignores metadata/spec, a main-resource update ignores status
    body = res.read_namespaced_resource_claim("c1", NS).to_dict()
    body = sandbox_client.sanitize_for_serialization(res.read_namespaced_resource_claim("c1", NS))
    body["status"] = {"allocation": allocation("node-1")}
    body["metadata"]["labels"] = {"ignored": "yes"}
    allocated = res.replace_namespaced_resource_claim_status("c1", NS, body)
    assert allocated.status.allocation.devices.results[0].device == "gpu-0"
    assert not allocated.metadata.labels
    main = sandbox_client.sanitize_for_serialization(allocated)
    main["status"] = None
    main["metadata"]["labels"] = {"kept": "yes"}
    updated = res.replace_namespaced_resource_claim("c1", NS, main)
    assert updated.status.allocation is not None and updated.metadata.labels == {"kept": "yes"}

    # spec is immutable
    changed = sandbox_client.sanitize_for_serialization(updated)
    changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    with pytest.raises(ApiException) as exc:
        res.replace_namespaced_resource_claim("c1", NS, changed)
    assert error(exc)["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "field": "spec",
        "message": error(exc)["details"]["causes"][0]["message"],
    }
    assert "field is immutable" in error(exc)["message"]

    # allocation immutable once set, but may be cleared
    with pytest.raises(ApiException) as exc:
        res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": allocation("node-2")}})
    assert exc.value.status == 422 and error(exc)["details"]["causes"][0]["field"] == "status.allocation"
    cleared = res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": None}})
    assert cleared.status.allocation is None


def test_allocation_results_are_checked(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    res.create_namespaced_resource_claim(NS, claim_obj("c1"))
    bad = allocation("node-1", request="other")
    bad["devices"]["results"][0]["shareID"] = "not-a-uuid"
    with pytest.raises(ApiException) as exc:
        res.patch_namespaced_resource_claim_status("c1", NS, {"status": {"allocation": bad}})
    fields = {c["field"] for c in error(exc)["details"]["causes"]}
    assert fields == {
        "status.allocation.devices.results[0].request",
        "status.allocation.devices.results[0].shareID",
    }


def test_patch_types(sandbox_client: Any) -> None:
    core = client.CoreV1Api(sandbox_client)
    core.create_namespaced_pod(NS, pod_obj("p1"))
    # JSON merge patch (the Python client's default for dict bodies is strategic for core types)
    merged = core.patch_namespaced_pod(
        "p1", NS, {"metadata": {"labels": {"a": "1"}, "finalizers": ["x/one"]}}
    )
    assert merged.metadata.labels == {"a": "1"}
    # strategic merge patch merges finalizers (a set), JSON patch can test and remove
    merged = core.patch_namespaced_pod("p1", NS, {"metadata": {"finalizers": ["x/two"]}})
    assert merged.metadata.finalizers == ["x/one", "x/two"]
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "remove", "path": "/metadata/finalizers"},
    ]
    patched = core.patch_namespaced_pod("p1", NS, ops)
    assert patched.metadata.finalizers is None
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p1", NS, [{"op": "test", "path": "/metadata/labels/a", "value": "2"}])
    assert exc.value.status == 422


def test_label_and_field_selectors(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    core = client.CoreV1Api(sandbox_client)
    for i, node in enumerate(("node-1", "node-2", "node-2")):
        obj = slice_obj(f"s{i}", node, driver="gpu.hami.io" if i < 2 else "other.example.com")
        obj["metadata"]["labels"] = {"tier": "gold" if i == 0 else "silver"}
        res.create_resource_slice(obj)
    names = lambda items: sorted(o.metadata.name for o in items)  # noqa: E731
    assert names(res.list_resource_slice(field_selector="spec.nodeName=node-2").items) == ["s1", "s2"]
    assert names(
        res.list_resource_slice(field_selector="spec.driver=gpu.hami.io,spec.nodeName!=node-1").items
    ) == ["s1"]
    assert names(res.list_resource_slice(label_selector="tier in (gold)").items) == ["s0"]
    assert names(res.list_resource_slice(label_selector="tier!=gold,!missing").items) == ["s1", "s2"]
    assert names(res.list_resource_slice(field_selector="metadata.name=s2").items) == ["s2"]
    with pytest.raises(ApiException) as exc:
        res.list_resource_slice(field_selector="spec.pool.name=x")
    assert exc.value.status == 400 and "field label not supported" in error(exc)["message"]
    core.create_namespaced_pod(NS, pod_obj("on-1", node="node-1"))
    core.create_namespaced_pod(NS, pod_obj("unbound"))
    assert names(core.list_namespaced_pod(NS, field_selector="spec.nodeName=node-1").items) == ["on-1"]
    assert names(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items) == ["unbound"]


def test_pagination(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    for i in range(5):
        res.create_resource_slice(slice_obj(f"s{i}", f"node-{i}"))
    page = res.list_resource_slice(limit=2)
    seen = [o.metadata.name for o in page.items]
    while page.metadata._continue:
        page = res.list_resource_slice(limit=2, _continue=page.metadata._continue)
        seen += [o.metadata.name for o in page.items]
    assert seen == [f"s{i}" for i in range(5)]


def test_watch_resume_bookmarks_and_410(sandbox: SandboxServer, sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    start = int(res.list_resource_slice().metadata.resource_version)
    res.create_resource_slice(slice_obj("s1", "node-1"))
    res.create_resource_slice(slice_obj("s2", "node-2"))
    w = watch.Watch()
    got = []
    for ev in w.stream(
        res.list_resource_slice,
        resource_version=str(start),
        field_selector="spec.nodeName=node-2",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        got.append((ev["type"], ev["raw_object"]["metadata"].get("name")))
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert got == [("ADDED", "s2"), ("BOOKMARK", None)], "resumed from the RV, filtered, then a bookmark"

    sandbox.compact()
    with pytest.raises(ApiException) as exc:
        for _ in watch.Watch().stream(
            res.list_resource_slice, resource_version=str(start), timeout_seconds=2
        ):
            pass
    assert exc.value.status == 410
    # relist-and-watch from the list's RV works again
    listed = res.list_resource_slice()
    res.delete_resource_slice("s1")
    w = watch.Watch()
    events = []
    for ev in w.stream(
        res.list_resource_slice, resource_version=listed.metadata.resource_version, timeout_seconds=5
    ):
        events.append((ev["type"], ev["object"].metadata.name))
        w.stop()
    assert events == [("DELETED", "s1")]


def test_watch_reports_selector_transitions(sandbox: SandboxServer, sandbox_client: Any) -> None:
    core = client.CoreV1Api(sandbox_client)
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod_obj("p1"))
    core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"app": "x"}}})
    core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"app": "y"}}})
    w = watch.Watch()
    types = []
    for ev in w.stream(
        core.list_namespaced_pod, NS, resource_version=start, label_selector="app=x", timeout_seconds=3
    ):
        types.append(ev["type"])
        if len(types) == 2:
            w.stop()
    assert types == ["ADDED", "DELETED"]


def test_finalizers_and_deletion_timestamp(sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    claim = claim_obj("c1")
    claim["metadata"]["finalizers"] = ["gpu.hami.io/allocation"]
    res.create_namespaced_resource_claim(NS, claim)
    res.delete_namespaced_resource_claim("c1", NS)
    pending = res.read_namespaced_resource_claim("c1", NS)
    assert pending.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as exc:
        res.patch_namespaced_resource_claim(
            "c1", NS, {"metadata": {"finalizers": ["gpu.hami.io/allocation", "b/c"]}}
        )
    assert exc.value.status == 422
    res.patch_namespaced_resource_claim("c1", NS, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        res.read_namespaced_resource_claim("c1", NS)
    assert exc.value.status == 404


def test_owner_reference_garbage_collection(sandbox: SandboxServer, sandbox_client: Any) -> None:
    core = client.CoreV1Api(sandbox_client)
    res = client.ResourceV1Api(sandbox_client)
    pod = core.create_namespaced_pod(NS, pod_obj("p1"))
    owned = claim_obj("p1-gpu")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": pod.metadata.uid, "controller": True}
    ]
    res.create_namespaced_resource_claim(NS, owned)
    res.create_namespaced_resource_claim(NS, claim_obj("unowned"))
    core.delete_namespaced_pod("p1", NS)
    sandbox.api.wait_idle()
    assert [c.metadata.name for c in res.list_namespaced_resource_claim(NS).items] == ["unowned"]


def test_fault_injection(sandbox: SandboxServer, sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    sandbox.faults.inject(r"/resourceslices$", status=500, count=2, methods={"GET"})
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            res.list_resource_slice()
        assert exc.value.status == 500
    res.list_resource_slice()
    sandbox.faults.inject(r"/resourceslices/s0$", status=409, methods={"PUT"})
    sandbox.faults.inject(r"/resourceslices", status=429)
    with pytest.raises(ApiException) as exc:
        res.create_resource_slice(slice_obj("s1", "n"))
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "1"
    created = res.create_resource_slice(slice_obj("s0", "n"))
    with pytest.raises(ApiException) as exc:
        res.replace_resource_slice("s0", created)
    assert (exc.value.status, error(exc)["reason"]) == (409, "Conflict")
    res.replace_resource_slice("s0", created)
    sandbox.faults.inject(r"/resourceslices", delay=0.3)
    t0 = time.monotonic()
    res.list_resource_slice()
    assert time.monotonic() - t0 >= 0.3

    # closing watches ends the stream early (clients must re-watch)
    ended = threading.Event()

    def consume() -> None:
        for _ in watch.Watch().stream(res.list_resource_slice, timeout_seconds=30):
            pass
        ended.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while not sandbox.faults.close_watches() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ended.wait(5)


def test_concurrent_writers_lose_no_update(sandbox_client: Any, sandbox: SandboxServer) -> None:
    core = client.CoreV1Api(sandbox_client)
    core.create_namespace({"metadata": {"name": "counter", "annotations": {"n": "0"}}})
    writers, per_writer = 8, 15
    conflicts = []

    def writer() -> None:
        api = client.CoreV1Api(sandbox.api_client())
        for _ in range(per_writer):
            while True:
                ns = api.read_namespace("counter")
                ns.metadata.annotations["n"] = str(int(ns.metadata.annotations["n"]) + 1)
                try:
                    api.replace_namespace("counter", ns)
                    break
                except ApiException as err:
                    assert err.status == 409
                    conflicts.append(1)

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert core.read_namespace("counter").metadata.annotations["n"] == str(writers * per_writer)
    assert conflicts, "concurrent read-modify-write must have produced conflicts"


def test_nodes_and_pod_binding(sandbox_client: Any) -> None:
    core = client.CoreV1Api(sandbox_client)
    core.create_node(node_obj("node-1"))
    core.create_namespaced_pod(NS, pod_obj("p1"))
    core.create_namespaced_binding(
        NS, {"metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "node-1"}}, _preload_content=False
    )
    assert core.read_namespaced_pod("p1", NS).spec.node_name == "node-1"


def test_pod_rules_for_claims_and_gates(sandbox_client: Any) -> None:
    core = client.CoreV1Api(sandbox_client)
    bad = pod_obj("bad", claims=[{"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}])
    bad["spec"]["containers"][0]["resources"] = {"claims": [{"name": "other"}]}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, bad)
    fields = {c["field"] for c in error(exc)["details"]["causes"]}
    assert fields == {"spec.resourceClaims[0]", "spec.containers[0].resources.claims[0].name"}

    gated = pod_obj("p1", claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    gated["spec"]["schedulingGates"] = [{"name": "gpu.hami.io/allocation"}]
    core.create_namespaced_pod(NS, gated)
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p1", NS, {"spec": {"schedulingGates": [{"name": "gpu.hami.io/allocation"}, {"name": "another"}]}}
        )
    assert "only deletion is allowed" in error(exc)["message"]
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod(
            "p1", NS, [{"op": "replace", "path": "/spec/restartPolicy", "value": "Never"}]
        )
    assert "pod updates may not change fields" in error(exc)["message"]
    # allowed: node selector while gated, image, then removing the gate
    core.patch_namespaced_pod("p1", NS, {"spec": {"nodeSelector": {"zone": "a"}}})
    core.patch_namespaced_pod(
        "p1", NS, [{"op": "replace", "path": "/spec/containers/0/image", "value": "b:2"}]
    )
    done = core.patch_namespaced_pod("p1", NS, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert done.spec.scheduling_gates is None and done.spec.node_selector == {"zone": "a"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p1", NS, {"spec": {"nodeName": "node-1"}})
    assert exc.value.status == 422


def test_an_eviction_deletes_the_pod_with_its_options(sandbox: SandboxServer) -> None:
    """``POST pods/NAME/eviction`` as the controller's preemption sends it (dra_driver/kube/
    eviction.py): a dry run changes nothing, a wrong uid is 409, else the pod goes (the sandbox
    serves no PodDisruptionBudgets, so nothing refuses it)."""
    from dra_driver.kube.api import PODS, Kube
    from dra_driver.kube.eviction import Evicted, evict

    api_client = sandbox.api_client()
    try:
        kube = Kube(api_client)
        created = kube.create(PODS, "default", pod_obj("victim"))
        uid = created["metadata"]["uid"]
        assert evict(kube, "default", "victim", uid, dry_run=True) is Evicted.EVICTED
        assert kube.get(PODS, "default", "victim")["metadata"]["uid"] == uid
        assert evict(kube, "default", "victim", "another-uid") is Evicted.GONE
        assert evict(kube, "default", "victim", uid) is Evicted.EVICTED
        with pytest.raises(KubeError) as gone:
            kube.get(PODS, "default", "victim")
        assert gone.value.status == 404
        assert evict(kube, "default", "victim", uid) is Evicted.GONE
    finally:
        api_client.close()
