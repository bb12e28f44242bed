"""Wire-level details clients depend on, checked with plain HTTPS requests."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from hami_dra_dev.sandbox import SandboxServer
from hami_dra_dev.sandbox.api import WriteOptions
from hami_dra_dev.sandbox.resources import require
from tests.sandbox.helpers import claim_obj, pod_obj, slice_obj

CLAIMS = require("resource.k8s.io", "v1", "resourceclaims")
PODS = require("", "v1", "pods")
NAMESPACES = require("", "v1", "namespaces")


def call(
    server: SandboxServer,
    method: str,
    path: str,
    body: Any = None,
    accept: str = "application/json",
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context(cafile=str(server.tls.cert_file))
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {server.token}", "Accept": accept, "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_aggregated_and_legacy_discovery(sandbox: SandboxServer) -> None:
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    code, headers, body = call(sandbox, "GET", "/apis", accept=accept)
    assert (
        code == 200
        and headers["Content-Type"] == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    )
    groups = {g["metadata"]["name"]: g for g in json.loads(body)["items"]}
    resource = {r["resource"]: r for r in groups["resource.k8s.io"]["versions"][0]["resources"]}
    assert resource["resourceclaims"]["scope"] == "Namespaced"
    assert resource["resourceclaims"]["subresources"][0]["subresource"] == "status"
    assert resource["resourceslices"]["scope"] == "Cluster"
    code, _, body = call(sandbox, "GET", "/apis/resource.k8s.io/v1")
    names = [r["name"] for r in json.loads(body)["resources"]]
    assert {"resourceclaims", "resourceclaims/status", "resourceslices", "deviceclasses"} <= set(names)
    code, _, body = call(sandbox, "GET", "/api")
    assert json.loads(body)["versions"] == ["v1"]


def test_watch_with_initial_events_and_end_bookmark(sandbox: SandboxServer) -> None:
    sandbox.api.create(CLAIMS, "default", claim_obj("c1"))
    path = (
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?watch=true&sendInitialEvents=true"
        "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
    )
    code, headers, body = call(sandbox, "GET", path)
    events = [json.loads(line) for line in body.splitlines()]
    assert code == 200 and headers["Transfer-Encoding"] == "chunked"
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "c1"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watch_of_a_compacted_version_is_an_error_event(sandbox: SandboxServer) -> None:
    sandbox.api.create(CLAIMS, "default", claim_obj("c1"))
    sandbox.compact()
    code, _, body = call(sandbox, "GET", "/apis/resource.k8s.io/v1/resourceclaims?watch=1&resourceVersion=2")
    event = json.loads(body.splitlines()[0])
    assert code == 200 and event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_history_window_expires_old_versions() -> None:
    with SandboxServer.start(history_window=3) as server:
        for i in range(5):
            server.api.create(CLAIMS, "default", claim_obj(f"c{i}"))
        rv = int(server.api.store.rv)
        ok = call(
            server,
            "GET",
            f"/apis/resource.k8s.io/v1/resourceclaims?watch=1&resourceVersion={rv - 2}&timeoutSeconds=1",
        )[2]
        assert [json.loads(x)["type"] for x in ok.splitlines()] == ["ADDED", "ADDED"]
        old = call(server, "GET", "/apis/resource.k8s.io/v1/resourceclaims?watch=1&resourceVersion=1")[2]
        assert json.loads(old.splitlines()[0])["object"]["code"] == 410


def test_generate_name_dry_run_and_delete_preconditions(sandbox: SandboxServer) -> None:
    body = claim_obj("")
    body["metadata"] = {"generateName": "gen-"}
    code, _, out = call(
        sandbox, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?dryRun=All", body
    )
    assert code == 201 and json.loads(out)["metadata"]["name"].startswith("gen-")
    assert sandbox.api.list_objects(CLAIMS, "default")[0] == []
    code, _, out = call(sandbox, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", body)
    name = json.loads(out)["metadata"]["name"]
    assert len(name) == len("gen-") + 5
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}"
    code, _, out = call(sandbox, "DELETE", path, {"preconditions": {"uid": "not-it"}})
    assert code == 409 and "Precondition failed" in json.loads(out)["message"]
    code, _, out = call(sandbox, "DELETE", path)
    assert code == 200 and json.loads(out)["kind"] == "ResourceClaim"


def test_namespace_deletion_removes_its_objects(sandbox: SandboxServer) -> None:
    api = sandbox.api
    api.create(NAMESPACES, "", {"metadata": {"name": "team"}})
    api.create(CLAIMS, "team", claim_obj("c1"))
    _, deleted = api.delete(NAMESPACES, "", "team")
    assert not deleted
    code, _, _out = call(
        sandbox, "POST", "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims", claim_obj("c2")
    )
    assert code in (403, 404)
    api.wait_idle()
    assert api.store.get("namespaces", ("", "team")) is None
    assert api.list_objects(CLAIMS, "team")[0] == []


def test_orphan_propagation_keeps_dependents(sandbox: SandboxServer) -> None:
    api = sandbox.api
    pod = api.create(PODS, "default", pod_obj("p1"))
    claim = claim_obj("c1")
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": pod["metadata"]["uid"]}
    ]
    api.create(CLAIMS, "default", claim)
    api.delete(PODS, "default", "p1", {"propagationPolicy": "Orphan"})
    api.wait_idle()
    kept = api.get(CLAIMS, "default", "c1")
    assert "ownerReferences" not in kept["metadata"]


def test_table_wide_columns(sandbox: SandboxServer) -> None:
    sandbox.api.create(PODS, "default", pod_obj("p1", node="node-1"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    _, _headers, body = call(sandbox, "GET", "/api/v1/namespaces/default/pods", accept=accept)
    table = json.loads(body)
    assert table["kind"] == "Table" and [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
    ]
    assert (
        table["rows"][0]["cells"][:3] == ["p1", "0/1", "Pending"] and table["rows"][0]["cells"][6] == "node-1"
    )
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_unsupported_requests(sandbox: SandboxServer) -> None:
    sandbox.api.create(PODS, "default", pod_obj("p1"))
    code, _, out = call(
        sandbox,
        "PATCH",
        "/api/v1/namespaces/default/pods/p1",
        {"a": 1},
        content_type="application/apply-patch+yaml",
    )
    assert code == 415 and "server-side apply" in json.loads(out)["message"]
    code, _, _ = call(sandbox, "GET", "/apis/resource.k8s.io/v1beta1/resourceclaims")
    assert code == 404
    code, _, out = call(sandbox, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", [1])
    assert code == 400


@pytest.mark.parametrize("user", ["system:kube-scheduler"])
def test_in_process_writes_are_validated_too(sandbox: SandboxServer, user: str) -> None:
    bad = slice_obj("s1", "node-1")
    bad["spec"]["pool"]["resourceSliceCount"] = 0
    with pytest.raises(Exception) as exc:
        sandbox.api.create(
            require("resource.k8s.io", "v1", "resourceslices"),
            "",
            bad,
            WriteOptions(user=user),
        )
    assert "spec.pool.resourceSliceCount" in str(exc.value)


def test_abandoned_watches_are_cleaned_up() -> None:
    import socket
    import time

    with SandboxServer.start(bookmark_interval=0.05) as server:
        ctx = ssl.create_default_context(cafile=str(server.tls.cert_file))
        raw = socket.create_connection(("127.0.0.1", server.port))
        conn = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        request = (
            f"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n\r\n"
        )
        conn.sendall(request.encode())
        assert b"200 OK" in conn.recv(4096)
        assert server.api.store.watch_count() == 1
        conn.close()
        deadline = time.monotonic() + 5
        while server.api.store.watch_count() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.api.store.watch_count() == 0


def test_uid_and_name_cannot_change(sandbox: SandboxServer) -> None:
    sandbox.api.create(CLAIMS, "default", claim_obj("c1"))
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"
    code, _, out = call(
        sandbox, "PATCH", path, {"metadata": {"uid": "other"}}, content_type="application/merge-patch+json"
    )
    # 422, as kube-apiserver answers a patch (tests/cluster/test_pod_patches.py); an Update's uid
    # is a precondition instead (409).
    assert code == 422 and "metadata.uid" in json.loads(out)["message"], out
    code, _, out = call(
        sandbox, "PATCH", path, {"metadata": {"name": "c2"}}, content_type="application/merge-patch+json"
    )
    assert code == 422 and json.loads(out)["details"]["causes"][0]["field"] == "metadata.name"


def test_delete_collection(sandbox: SandboxServer) -> None:
    sandbox.api.create(NAMESPACES, "", {"metadata": {"name": "team"}})
    for ns in ("default", "team"):
        claim = claim_obj("c1")
        claim["metadata"]["labels"] = {"drop": "yes"}
        sandbox.api.create(CLAIMS, ns, claim)
    sandbox.api.create(CLAIMS, "team", claim_obj("keep"))
    code, _, _ = call(sandbox, "DELETE", "/apis/resource.k8s.io/v1/resourceclaims?labelSelector=drop%3Dyes")
    assert code == 405, "only the namespaced path supports deletecollection"
    for ns in ("default", "team"):
        path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims?labelSelector=drop%3Dyes"
        assert call(sandbox, "DELETE", path)[0] == 200
    assert [c["metadata"]["name"] for c in sandbox.api.list_objects(CLAIMS, None)[0]] == ["keep"]
