"""The driver's node and admission parts on the real control plane, for the end-to-end suites.

``plane_node``: the real kubelet plugin (``hami-dra kubelet-plugin --source simulated``, a child
process, as the DaemonSet runs it) on a node of ``plane_harness``, registered with the kubelet
simulator (hami_dra_dev/kubelet.py), which prepares the claims of the pods kube-scheduler binds
there, reports them Running and finishes their deletion.

``plane_webhook``: the real admission webhook in-process on loopback TLS, registered by URL with
kube-apiserver as the local cluster registers it (hami_dra_dev/cluster/driver.py: the pod gate,
HAMi's translation, GpuConfig validation, the claim finalizer). Its registration is waited for
(a dry run of a class the webhook refuses) and, on exit, removed and waited for again, so the
next test on the plane meets no webhook that is gone.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dra_driver.cli import CHILD_ENTRY
from dra_driver.kube.api import DEVICE_CLASSES, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.webhook.lookup import KubeLookup
from dra_driver.webhook.server import WebhookServer, tls_context
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.cluster.controlplane import ControlPlane
from hami_dra_dev.cluster.driver import ADMISSION_NAME, register_webhooks, remove_claim_finalizer_policy
from hami_dra_dev.cluster.processes import HostProcess
from hami_dra_dev.kubelet import KubeletProtocol, KubeletSimulator
from tests import waiting
from tests.controller.harness import DRIVER, device_class
from tests.kubeletplugin.upstream import REPO_ROOT


@contextmanager
def short_directory() -> Iterator[Path]:
    """A directory of the test's own under /tmp, removed on exit: pytest's ``tmp_path`` is too
    deep for a plugin's Unix socket paths (at most 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="hd-e2e-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class PlaneNode:
    """One node's kubelet (the simulator) and the plugin it registered."""

    name: str
    root: Path
    kubelet: KubeletSimulator
    plugin: HostProcess

    @property
    def cdi_dir(self) -> Path:
        return self.root / "var/run/cdi"


@contextmanager
def plane_node(
    plane: ControlPlane, name: str, root: Path, profile: str = "t4", gpus: int = 4
) -> Iterator[PlaneNode]:
    """The kubelet simulator of node ``name`` (which wipes the node's slices first, as kubelet
    does) and our plugin registered with it; both stopped on exit."""
    registry = root / "var/lib/kubelet/plugins_registry"
    plugin_dir = root / "var/lib/kubelet/plugins" / DRIVER
    cdi = root / "var/run/cdi"
    for directory in (registry, plugin_dir, cdi):
        directory.mkdir(parents=True, exist_ok=True)
    (root / "boot_id").write_text(f"plane-{name}\n")
    args = [
        sys.executable, "-c", CHILD_ENTRY, "-v", "kubelet-plugin",
        "--node-name", name, "--driver-name", DRIVER,
        "--source", "simulated", "--profile", profile, "--gpus", str(gpus),
        "--kubeconfig", str(plane.kubeconfig_path),
        "--plugin-dir", str(plugin_dir), "--registry-dir", str(registry), "--cdi-dir", str(cdi),
        "--metrics-bind-address", "0",
        "--health-file", str(root / "plugin-healthy"), "--boot-id-file", str(root / "boot_id"),
    ]  # fmt: skip
    api_client = plane.api_client()
    kubelet = KubeletSimulator(name, registry, api_client, KubeletProtocol.own(REPO_ROOT), interval=0.05)
    kubelet.start()
    plugin: HostProcess | None = None
    try:
        plugin = HostProcess(
            f"kubelet-plugin-{name}", args, root / "logs", ready=lambda: DRIVER in kubelet.plugins
        )
        plugin.wait_ready(60)
        yield PlaneNode(name, root, kubelet, plugin)
    finally:
        if plugin is not None:
            plugin.stop()
        kubelet.stop()
        api_client.close()


#: A DeviceClass our validating webhook refuses (an unknown policy), sent as a dry run: refused
#: once the webhook is called, accepted once it no longer is.
_PROBE = device_class("webhook-probe", {"policy": "no-such-policy"})


def _webhook_called(kube: Kube) -> bool:
    try:
        kube.request("POST", DEVICE_CLASSES.path(None), _PROBE, query={"dryRun": "All"})
    except KubeError as err:
        return "no-such-policy" in err.message
    return False


@contextmanager
def plane_webhook(plane: ControlPlane, root: Path) -> Iterator[WebhookServer]:
    """Our webhook serving and registered with the plane's kube-apiserver until exit."""
    pair = make_self_signed(root / "webhook-tls", "hami-dra-webhook")
    api_client, lookup_client = plane.api_client(), plane.api_client()
    kube = Kube(api_client)
    webhook = WebhookServer(
        KubeLookup(lookup_client, DRIVER, class_ttl=0.0),
        DRIVER,
        host="127.0.0.1",
        port=0,
        ssl_context=tls_context(str(pair.cert_file), str(pair.key_file)),
    )
    webhook.start()
    try:
        register_webhooks(api_client, f"https://127.0.0.1:{webhook.port}", pair.ca_pem, DRIVER)
        waiting.wait_for(lambda: _webhook_called(kube), 30, "kube-apiserver calling the webhook")
        yield webhook
    finally:
        try:
            unregister_webhooks(kube)
            waiting.wait_for(lambda: not _webhook_called(kube), 30, "kube-apiserver done with the webhook")
        finally:
            webhook.stop()
            api_client.close()
            lookup_client.close()


def unregister_webhooks(kube: Kube) -> None:
    """Delete what ``register_webhooks`` created (what is gone already: nothing to do)."""
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        try:
            kube.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{ADMISSION_NAME}")
        except KubeError as err:
            if not err.not_found:
                raise
    remove_claim_finalizer_policy(kube.api_client)
