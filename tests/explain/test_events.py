"""``explain`` shows why a placed pod does not start: the Warning events kubelet (and others) put on
the pod, with what to do.

The events are recorded as kubelet 1.37 writes them (``pkg/kubelet/kuberuntime``: "Failed to prepare
dynamic resources: " + the DRA manager's "prepare dynamic resources: NodePrepareResources failed
for ResourceClaim NAME: " + the plugin's message) and as our controller writes its own.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from dra_driver.cli import main
from dra_driver.controller.offline import ClusterObjects
from dra_driver.explain.events import SHOWN, TROUBLESHOOTING, pod_warnings
from dra_driver.explain.render import render
from dra_driver.explain.report import explain
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.fake_cluster import PODS, FakeCluster
from tests.controller.harness import DRIVER, NS, claim, request

PLUGIN_REFUSED = (
    "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for "
    "ResourceClaim train-gpu: gpu-0 memory overcommitted: 10Gi prepared + 8Gi requested > 15Gi"
)
NOT_REGISTERED = (
    "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources: "
    f"DRA driver {DRIVER} is not registered"
)


def event(
    pod: dict[str, Any], reason: str, message: str, *, at: str, kind: str = "Warning", **extra: Any
) -> dict[str, Any]:
    """A core/v1 Event as kubelet records it on the pod."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{reason.lower()}-{at[-3:-1]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }
    body.update(extra)
    return body


def placed_pod() -> tuple[FakeCluster, dict[str, Any]]:
    cluster = FakeCluster(gpus=1)
    cluster.pod("train", claim("train-gpu", request(memory="8Gi")))
    cluster.run()
    return cluster, cluster.kube.stored(PODS, NS, "train")


def test_kubelets_warnings_are_picked_and_explained() -> None:
    _, pod = placed_pod()
    ours = event(pod, "FailedAllocation", "held", at="2026-12-06T10:00:01Z", source={})
    ours["reportingComponent"] = f"{DRIVER}/controller"
    earlier_pod = event(pod, "FailedPrepareDynamicResources", "old", at="2026-12-06T09:00:00Z")
    earlier_pod["involvedObject"]["uid"] = "00000000-0000-0000-0000-000000000000"
    events = [
        event(pod, "FailedPrepareDynamicResources", PLUGIN_REFUSED, at="2026-12-06T10:00:09Z", count=4),
        event(pod, "Scheduled", "Successfully assigned", at="2026-12-06T10:00:00Z", kind="Normal"),
        event(pod, "FailedPrepareDynamicResources", NOT_REGISTERED, at="2026-12-06T10:00:03Z"),
        ours,
        earlier_pod,
    ]
    shown = pod_warnings(events, pod, DRIVER)
    assert [(e.last_seen, e.count) for e in shown] == [
        ("2026-12-06T10:00:03Z", 1),
        ("2026-12-06T10:00:09Z", 4),
    ]
    registered, refused = shown
    assert "kubelet-plugin" in registered.hint and "not registered" in registered.message
    assert TROUBLESHOOTING in refused.hint and refused.source == "kubelet"


def test_only_the_newest_are_shown() -> None:
    _, pod = placed_pod()
    events = [
        event(pod, "BackOff", f"back-off {i}", at=f"2026-12-06T10:00:{i:02d}Z") for i in range(SHOWN + 3)
    ]
    shown = pod_warnings(list(reversed(events)), pod, DRIVER)
    assert [e.message for e in shown] == [f"back-off {i}" for i in range(3, SHOWN + 3)]
    assert all(e.hint == "" for e in shown)


def test_the_runtimes_cdi_failure_gets_its_hint() -> None:
    _, pod = placed_pod()
    message = f"Error: failed to create containerd container: unresolvable CDI devices {DRIVER}/claim-x"
    [shown] = pod_warnings([event(pod, "Failed", message, at="2026-12-06T10:00:00Z")], pod, DRIVER)
    assert "CDI" in shown.hint and "/var/run/cdi" in shown.hint


def test_explain_renders_them_under_the_placement() -> None:
    _, pod = placed_pod()
    refused = event(pod, "FailedPrepareDynamicResources", PLUGIN_REFUSED, at="2026-12-06T10:00:09Z", count=4)
    with_events = explain(pod, claims={}, cluster=ClusterObjects(), driver=DRIVER, events=[refused])
    text = render(with_events)
    assert "warnings on the pod (newest last):" in text
    assert f"FailedPrepareDynamicResources x4 (kubelet): {PLUGIN_REFUSED}" in text
    assert (
        f"what to do: the kubelet plugin refused the claim; its message and the fix: {TROUBLESHOOTING}"
        in text
    )
    document = json.loads(json.dumps(with_events.to_json()))
    assert (
        document["events"][0]["reason"] == "FailedPrepareDynamicResources"
        and document["events"][0]["count"] == 4
    )


def test_explain_leaves_out_the_controllers_own_warnings() -> None:
    """The controller's refusals are on the pod's condition (the pending line): not repeated."""
    _, pod = placed_pod()
    ours = event(pod, "FailedAllocation", "held", at="2026-12-06T10:00:01Z", source={})
    ours["reportingComponent"] = f"{DRIVER}/controller"
    kubelet = event(pod, "BackOff", "back-off restarting", at="2026-12-06T10:00:02Z")
    explanation = explain(pod, claims={}, cluster=ClusterObjects(), driver=DRIVER, events=[ours, kubelet])
    assert [(e.reason, e.source) for e in explanation.events] == [("BackOff", "kubelet")]


#: What a tenant of the test below may read: everything ``explain`` reads except Events.
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods", "nodes", "resourcequotas"], "verbs": ["get", "list"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims", "resourceslices", "deviceclasses"],
        "verbs": ["get", "list"],
    },
    {"apiGroups": ["gpu.hami.io"], "resources": ["gpuquotas"], "verbs": ["get", "list"]},
]


def events_forbidden_kubeconfig(apiserver: ControlPlane, rbac: Any, namespace: str) -> str:
    """A kubeconfig of a user whom RBAC lets read all that explain reads but Events."""
    user = f"tenant-{namespace}"
    rbac.create_cluster_role({"metadata": {"name": user}, "rules": TENANT_RULES})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    return str(apiserver.user_kubeconfig(user))


def test_the_command_reads_the_pods_events(
    apiserver: ControlPlane, apiserver_client: Any, api_namespace: str, capsys: Any
) -> None:
    """Through the real client against a real kube-apiserver: the events of this pod only."""
    core, ns = client.CoreV1Api(apiserver_client), api_namespace
    created = []
    for name in ("train", "other"):
        body = {"metadata": {"name": name, "namespace": ns},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
        created.append(json.loads(core.create_namespaced_pod(ns, body, _preload_content=False).data))
    train, other = created
    for pod, message in ((train, PLUGIN_REFUSED), (other, NOT_REGISTERED)):
        body = event(pod, "FailedPrepareDynamicResources", message, at="2026-12-06T10:00:09Z")
        core.create_namespaced_event(ns, body)
    status = main(
        ["explain", "pod/train", "-n", ns, "--kubeconfig", str(apiserver.kubeconfig_path), "-o", "json"]
    )
    document = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [e["message"] for e in document["events"]] == [PLUGIN_REFUSED]
    assert "warnings are not shown" not in document["note"]
    # Events a tenant may not list (RBAC answers 403): the rest of the explanation, and a note
    # saying what is missing.
    tenant = events_forbidden_kubeconfig(apiserver, client.RbacAuthorizationV1Api(apiserver_client), ns)
    status = main(["explain", "pod/train", "-n", ns, "--kubeconfig", tenant, "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert status == 0 and document["events"] == []
    assert "could not list the pod's events (403" in document["note"]
