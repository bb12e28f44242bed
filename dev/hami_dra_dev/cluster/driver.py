"""The driver on the local cluster as host processes: webhook, controller, kubelet plugin.

The kubelet plugin puts its registration socket into the real kubelet's plugin registry
(``<kubelet root>/plugins_registry``) and its DRA socket under ``<kubelet root>/plugins/<driver>``,
exactly where the chart's DaemonSet mounts them on a real node; its CDI specs go to
``/var/run/cdi``, which containerd reads. The webhook serves on loopback TLS with a certificate
of the cluster CA and is registered by URL with the configurations of hami_dra_dev/webhooks.py.
"""

from __future__ import annotations

import base64
import socket
import sys
from dataclasses import dataclass
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import CHILD_ENTRY
from hami_dra_dev.cluster.layout import CDI_DIR, NODE_NAME, Layout
from hami_dra_dev.cluster.pki import ClusterPki
from hami_dra_dev.cluster.processes import HostProcess

WEBHOOK_PORT = 9443
WEBHOOK_URL = f"https://127.0.0.1:{WEBHOOK_PORT}"
#: What ``hami-dra controller`` logs once its informers are synced (dra_driver/controller/command.py).
CONTROLLER_RUNNING = "running for driver"


@dataclass(frozen=True)
class DriverOptions:
    profile: str = "t4"
    gpus: int = 4
    driver_name: str = DEFAULT_DRIVER_NAME
    #: Where the controller reaches the API (default: the admin kubeconfig); the fault tests put
    #: a proxy of theirs in between.
    controller_kubeconfig: str | None = None
    #: Where the webhook reaches the API (default: the admin kubeconfig); the benchmark gives it an
    #: identity of its own, to tell its requests from others' in the API server's audit log.
    webhook_kubeconfig: str | None = None
    #: False: webhook and controller only (the benchmark's simulated nodes publish their own slices).
    plugin: bool = True
    #: More ``hami-dra controller`` flags (the benchmark's --controller-args).
    controller_args: tuple[str, ...] = ()
    #: What gates new pods with claims: ``webhook`` (its ``/mutate``) or ``policy`` (a
    #: MutatingAdmissionPolicy, 1.36+: the chart's ``webhook.podGate``, webhook/pod_gate.py).
    pod_gate: str = "webhook"


def _hami(name: str, layout: Layout, *args: str, ready: Any = None) -> HostProcess:
    return HostProcess(name, [sys.executable, "-c", CHILD_ENTRY, "-v", *args], layout.logs, ready=ready)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


#: The name of our admission objects on the local cluster (the sandbox's, the benchmark deletes them).
ADMISSION_NAME = "hami-dra"


def serves_mutating_policies(api_client: Any) -> bool:
    """Whether kube-apiserver serves ``admissionregistration.k8s.io/v1`` MutatingAdmissionPolicy
    (1.36+; the chart's ``.Capabilities`` check, by discovery)."""
    from dra_driver.kube.api import Kube
    from dra_driver.webhook.policy import API_VERSION, POLICY_RESOURCE

    listing = Kube(api_client).request("GET", f"/apis/{API_VERSION}")
    return any(resource.get("name") == POLICY_RESOURCE for resource in listing.get("resources") or ())


#: The pod gate's MutatingAdmissionPolicy and binding (``DriverOptions.pod_gate`` policy).
POD_GATE_NAME = f"{ADMISSION_NAME}-pod-gate"


def apply_admission_policy(api_client: Any, bodies: list[dict[str, Any]]) -> None:
    """Create or replace MutatingAdmissionPolicy objects (a policy and its binding)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.webhook.policy import PLURALS

    api: Any = client.CustomObjectsApi(api_client)
    group, _, version = "admissionregistration.k8s.io/v1".partition("/")
    for body in bodies:
        plural, name = PLURALS[body["kind"]], body["metadata"]["name"]
        try:
            api.create_cluster_custom_object(group, version, plural, body)
        except ApiException as err:
            if err.status != 409:
                raise
            current = api.get_cluster_custom_object(group, version, plural, name)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            api.replace_cluster_custom_object(group, version, plural, name, body)


def remove_admission_policy(api_client: Any, name: str) -> None:
    """Delete the MutatingAdmissionPolicy ``name`` and its binding (gone already, or an API server
    without the policy API: nothing to do)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.webhook.policy import BINDING_KIND, PLURALS, POLICY_KIND

    api: Any = client.CustomObjectsApi(api_client)
    for plural in (PLURALS[BINDING_KIND], PLURALS[POLICY_KIND]):
        try:
            api.delete_cluster_custom_object("admissionregistration.k8s.io", "v1", plural, name)
        except ApiException as err:
            if err.status != 404:
                raise


def install_claim_finalizer_policy(api_client: Any, driver_name: str) -> None:
    """Create or replace the claim finalizer's MutatingAdmissionPolicy and binding (webhook/policy.py)."""
    from dra_driver.webhook.policy import claim_finalizer_policy

    apply_admission_policy(api_client, claim_finalizer_policy(driver_name, ADMISSION_NAME))


def remove_claim_finalizer_policy(api_client: Any) -> None:
    """Delete what ``install_claim_finalizer_policy`` created (gone already: nothing to do)."""
    remove_admission_policy(api_client, ADMISSION_NAME)


def check_pod_gate(mode: str, served: bool) -> None:
    """``ValueError`` for a mode that is none of ``POD_GATE_MODES``, or ``policy`` on an API server
    that does not serve the policy API (the chart's ``auto`` would fall back; here the caller asked
    for the policy by name, and a benchmark must not measure the webhook under its name)."""
    from dra_driver.webhook.pod_gate import POD_GATE_MODES

    if mode not in POD_GATE_MODES:
        raise ValueError(f"pod gate must be one of {', '.join(POD_GATE_MODES)}, not {mode!r}")
    if mode == "policy" and not served:
        raise ValueError(
            "pod gate policy needs kube-apiserver serving admissionregistration.k8s.io/v1 "
            "MutatingAdmissionPolicy (Kubernetes 1.36+); use the webhook on this cluster"
        )


def register_webhooks(
    api_client: Any, base_url: str, ca_pem: bytes, driver_name: str, pod_gate: str = "webhook"
) -> None:
    """Create or replace our Mutating/ValidatingWebhookConfiguration (hami_dra_dev/webhooks.py)
    and, as the chart does, the claim finalizer: a MutatingAdmissionPolicy where the API server
    serves one, else the ``claims`` webhook. ``pod_gate`` policy: the pod gate's policy too, the
    webhook's ``pods`` entry keeping what it leaves (webhook/pod_gate.py); webhook: that policy
    removed if an earlier call made it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.webhook.pod_gate import pod_gate_policy
    from hami_dra_dev.webhooks import MUTATING, webhook_configurations

    api: Any = client.AdmissionregistrationV1Api(api_client)
    ca = base64.b64encode(ca_pem).decode()
    policy = serves_mutating_policies(api_client)
    check_pod_gate(pod_gate, policy)
    if policy:
        install_claim_finalizer_policy(api_client, driver_name)
    if pod_gate == "policy":
        apply_admission_policy(api_client, pod_gate_policy(POD_GATE_NAME))
    configurations = webhook_configurations(
        base_url, ca, driver_name, claim_finalizer=not policy, pod_gate=pod_gate
    )
    for kind, body in configurations:
        name = body["metadata"]["name"]
        create, read, replace = (
            (api.create_mutating_webhook_configuration, api.read_mutating_webhook_configuration,
             api.replace_mutating_webhook_configuration)
            if kind == MUTATING
            else (api.create_validating_webhook_configuration, api.read_validating_webhook_configuration,
                  api.replace_validating_webhook_configuration)
        )  # fmt: skip
        try:
            create(body)
        except ApiException as err:
            if err.status != 409:
                raise
            body["metadata"]["resourceVersion"] = read(name).metadata.resource_version
            replace(name, body)
    if pod_gate != "policy" and policy:  # after the webhook's pods entry takes every pod again
        remove_admission_policy(api_client, POD_GATE_NAME)


def install_crds(api_client: Any, timeout: float = 60.0) -> None:
    """Create or update our CRDs (what the chart's ``crds/`` installs) and wait until served."""
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.quota import crd

    api: Any = client.ApiextensionsV1Api(api_client)
    body = crd.manifest()
    try:
        api.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise
        body["metadata"]["resourceVersion"] = api.read_custom_resource_definition(
            crd.CRD_NAME
        ).metadata.resource_version
        api.replace_custom_resource_definition(crd.CRD_NAME, body)
    deadline = time.monotonic() + timeout
    while True:
        conditions = api.read_custom_resource_definition(crd.CRD_NAME).status.conditions or ()
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {crd.CRD_NAME} not established within {timeout:.0f}s: {conditions}")
        time.sleep(0.2)


def _slice_published(api_client: Any, driver: str) -> bool:
    from kubernetes import client

    try:
        resource: Any = client.ResourceV1Api(api_client)
        slices = resource.list_resource_slice(
            field_selector=f"spec.nodeName={NODE_NAME},spec.driver={driver}"
        )
    except Exception:
        return False
    return bool(slices.items)


def start_driver(
    layout: Layout, pki: ClusterPki, api_client: Any, options: DriverOptions
) -> list[HostProcess]:
    """Start webhook, controller and (unless ``options.plugin`` is False) the kubelet plugin;
    returns once each is ready (in start order)."""
    kubeconfig = str(layout.admin_kubeconfig)
    driver = options.driver_name
    started: list[HostProcess] = []
    tls = pki.issue(
        "webhook", "hami-dra-webhook", hosts=("127.0.0.1", "localhost"), client=False, server=True
    )
    webhook = _hami(
        "webhook", layout, "webhook", "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
        "--port", str(WEBHOOK_PORT), "--driver-name", driver,
        "--kubeconfig", options.webhook_kubeconfig or kubeconfig,
        ready=lambda: _port_open(WEBHOOK_PORT),
    )  # fmt: skip
    started.append(webhook)
    webhook.wait_ready(30)
    register_webhooks(api_client, WEBHOOK_URL, pki.ca.cert.read_bytes(), driver, options.pod_gate)
    install_crds(api_client)
    controller_log = layout.logs / "controller.log"
    controller_log.unlink(missing_ok=True)
    controller = _hami(
        "controller", layout, "controller", "--kubeconfig", options.controller_kubeconfig or kubeconfig,
        "--driver-name", driver,
        "--metrics-bind-address", "0", *options.controller_args,
        ready=lambda: CONTROLLER_RUNNING in controller_log.read_text(errors="replace"),
    )  # fmt: skip
    started.append(controller)
    if options.plugin:
        plugin = _hami(
            "kubelet-plugin", layout, "kubelet-plugin", "--node-name", NODE_NAME, "--driver-name", driver,
            "--source", "simulated", "--profile", options.profile, "--gpus", str(options.gpus),
            "--kubeconfig", kubeconfig, "--plugin-dir", str(layout.plugin_dir(driver)),
            "--registry-dir", str(layout.plugins_registry), "--cdi-dir", str(CDI_DIR),
            "--metrics-bind-address", "0",
            ready=lambda: _slice_published(api_client, driver),
        )  # fmt: skip
        started.append(plugin)
    try:
        for process in started[1:]:  # the webhook is ready already
            process.wait_ready(60)
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    return started
