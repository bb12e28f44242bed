"""``hami-dra top`` end to end through the real ``kubernetes`` client against a real kube-apiserver:
the lab of ``builders.py`` is created as API objects, then the CLI reads it back as a user would
(kubeconfig, current context's namespace, ``-A``, ``-o json``), also as ``kubectl hami-dra``.

``top -A`` reads every namespace, so this suite has an etcd + kube-apiserver of its own
(``own_control_plane``, not the run's shared one) holding the lab alone; every test only reads it.
A tenant who may not list the cluster's claims is one RBAC knows (a client certificate of the
plane's CA, a Role in team-b), not an injected 403.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dra_driver.cli import main
from dra_driver.quantity import GIB, MIB
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.apiserver_fixtures import kubectl_binary, own_control_plane
from tests.top.builders import lab_claims, lab_pods, lab_slices

pytestmark = pytest.mark.apiserver

TENANT = "team-b-tenant"


def _create_lab(api_client: Any) -> None:
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    for namespace in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
        # What kube-controller-manager (not run here) would add: pods need their ServiceAccount.
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    for item in lab_slices():
        resource.create_resource_slice(item)
    uids: dict[tuple[str, str], str] = {}
    for raw in lab_pods():
        meta, status = raw["metadata"], raw.pop("status")
        created = json.loads(core.create_namespaced_pod(meta["namespace"], raw, _preload_content=False).data)
        uids[meta["namespace"], meta["name"]] = created["metadata"]["uid"]
        core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
    for raw in lab_claims():
        meta, status = raw["metadata"], raw.pop("status")
        namespace = meta["namespace"]
        for owner in meta.get("ownerReferences") or ():
            owner["uid"] = uids[namespace, owner["name"]]
        created = json.loads(
            resource.create_namespaced_resource_claim(namespace, raw, _preload_content=False).data
        )
        for entry in status.get("reservedFor") or ():
            entry["uid"] = uids[namespace, entry["name"]]
        created["status"] = status
        resource.replace_namespaced_resource_claim_status(meta["name"], namespace, created)


def _create_tenant(api_client: Any) -> None:
    """A user who may list our slices everywhere and pods and claims of team-b only."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}]
    slices = [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}]
    rbac.create_cluster_role({"metadata": {"name": TENANT}, "rules": slices})
    rbac.create_cluster_role_binding({
        "metadata": {"name": TENANT}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TENANT},
    })  # fmt: skip
    own = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]},
    ]
    rbac.create_namespaced_role("team-b", {"metadata": {"name": TENANT}, "rules": own})
    rbac.create_namespaced_role_binding("team-b", {
        "metadata": {"name": TENANT}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
    })  # fmt: skip


@dataclass(frozen=True)
class Lab:
    plane: ControlPlane
    tenant_kubeconfig: Path

    @property
    def kubeconfig_path(self) -> Path:
        return self.plane.kubeconfig_path


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """The lab on a plane of this module's own (the tests only read it)."""
    with own_control_plane("hami-dra-top-") as plane:
        api_client = plane.api_client()
        try:
            _create_lab(api_client)
            _create_tenant(api_client)
        finally:
            api_client.close()
        yield Lab(plane, plane.user_kubeconfig(TENANT))


def top(capsys: pytest.CaptureFixture[str], server: Any, *args: str) -> tuple[int, str, str]:
    status = main(["top", "--kubeconfig", str(server.kubeconfig_path), *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_top_reads_the_live_cluster(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    status, table, _ = top(capsys, lab, "-A")
    assert status == 0
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["NODE", "DEVICE"]
    assert "[#####.....] 7.5Gi/14.6Gi" in lines[1] and "team-a/train-0/train (5Gi 30%)" in lines[1]
    assert lines[2].strip() == "team-b/infer-0/infer (2.5Gi 10%)"
    assert "team-a/whole-0/whole (whole card)" in lines[3]
    assert "unhealthy (tainted)" in lines[4] and " none " in lines[5] and " unknown " in lines[6]
    assert "Unschedulable        2         team-a/big-0, team-a/big-1" in lines

    status, nodes, _ = top(capsys, lab, "nodes", "-A")
    assert status == 0
    assert nodes.splitlines()[1].split()[:5] == ["node-1", "4", "3/4", "[####......]", "22.1Gi/58.5Gi"]

    status, text, _ = top(capsys, lab, "-A", "-o", "json")
    document = json.loads(text)
    assert document["namespace"] is None
    assert [n["name"] for n in document["nodes"]] == ["node-1", "node-2"]
    shared = document["nodes"][0]["devices"][0]
    assert [(t["namespace"], t["pods"], t["claim"]) for t in shared["tenants"]] == [
        ("team-a", ["train-0"], "train"),
        ("team-b", ["infer-0"], "infer"),
    ]
    assert [(g["reason"], g["count"]) for g in document["pending"]] == [
        ("Unschedulable", 2), ("AwaitingController", 1), ("GpuQuotaExceeded", 1),
    ]  # fmt: skip


def test_namespace_defaults_to_the_context_and_n_picks_one(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    # The plane's context names no namespace, so "default": no tenants, no pending pods there.
    status, text, _ = top(capsys, lab, "-o", "json")
    document = json.loads(text)
    assert status == 0 and document["namespace"] == "default" and document["pending"] == []
    assert all(not d["tenants"] for n in document["nodes"] for d in n["devices"])
    status, table, _ = top(capsys, lab, "-n", "team-b")
    assert "team-b/infer-0/infer" in table and "team-a/" not in table
    assert "GpuQuotaExceeded" in table and "namespace team-b only (usage counts every namespace)" in table
    # The shared card's usage is the card's (team-a's 5Gi too), not team-b's 2.5Gi share.
    lines = table.splitlines()
    assert "[#####.....] 7.5Gi/14.6Gi" in lines[1] and "team-b/infer-0/infer (2.5Gi 10%)" in lines[1]
    assert lines[2].strip() == "+1 of other namespaces"


def test_a_user_who_may_not_list_every_namespaces_claims_gets_the_namespaces_share(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tenant's Role: claims of all namespaces forbidden, the namespace's allowed.
    status, text, err = top(capsys, Tenant(lab.tenant_kubeconfig), "-n", "team-b", "-o", "yaml")
    document = yaml.safe_load(text)
    assert status == 0 and err == ""
    assert document["usageNamespace"] == "team-b" and document["namespace"] == "team-b"
    shared = document["nodes"][0]["devices"][0]
    assert shared["memory"]["used"] == 2 * GIB + 512 * MIB and shared["otherTenants"] == 0


def test_errors_are_one_line_with_exit_status_2(
    lab: Lab,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    status, out, err = top(capsys, Tenant(lab.tenant_kubeconfig), "-A")
    assert status == 2 and out == ""
    assert err.startswith("hami-dra top: error: forbidden: cannot list resourceclaims in all namespaces (")
    assert err.endswith("; -n NAMESPACE reads one namespace\n")
    assert err.count("\n") == 1

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = tmp_path / "kubeconfig"
    apiserver_port = lab.plane.layout.ports.apiserver
    unreachable.write_text(lab.kubeconfig_path.read_text().replace(f":{apiserver_port}", f":{port}"))
    assert main(["top", "--kubeconfig", str(unreachable)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hami-dra top: error: cannot reach the API server at https://127.0.0.1:{port}: "
        "Failed to establish a new connection: [Errno 111] Connection refused\n"
    )
    assert not caplog.records  # no retry warnings before the line

    assert main(["top", "--kubeconfig", str(lab.kubeconfig_path), "--context", "nope"]) == 2
    assert "context 'nope' not in" in capsys.readouterr().err
    assert main(["top", "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.endswith("missing does not exist (pass --kubeconfig or set KUBECONFIG)\n")


def test_runs_as_a_kubectl_plugin(lab: Lab, tmp_path: Path) -> None:
    binary = kubectl_binary()
    entry = Path(sys.executable).parent / "hami-dra"
    if binary is None or not entry.exists():
        pytest.skip("kubectl or the hami-dra entry point is not installed")
    plugins = tmp_path / "bin"
    plugins.mkdir()
    (plugins / "kubectl-hami_dra").symlink_to(entry)
    env = {**os.environ, "PATH": f"{plugins}:{os.environ['PATH']}", "KUBECONFIG": str(lab.kubeconfig_path)}
    done = subprocess.run(
        [shutil.which("kubectl") or binary, "hami-dra", "top", "nodes", "-A"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[0] == "node-1"
    # Usage and errors name the program as the user typed it.
    done = subprocess.run(
        [shutil.which("kubectl") or binary, "hami-dra", "top", "--outptu=json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "usage: kubectl hami-dra top " in done.stderr
    assert "kubectl hami-dra top: error: unrecognized arguments: --outptu=json (did you mean --output?)" in (
        done.stderr
    )


@dataclass(frozen=True)
class Tenant:
    """``top``'s ``--kubeconfig`` as the tenant of team-b."""

    kubeconfig_path: Path
