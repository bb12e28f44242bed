"""The two ways the driver runs on the real cluster, behind one interface for the end-to-end tests.

* ``HostDriver``: webhook, controller and kubelet plugin as host processes, exactly what
  ``hami-dra cluster up`` starts (dev/hami_dra_dev/cluster/driver.py), with the admin kubeconfig.
* ``ChartDriver``: ``helm install`` of charts/hami-dra with charts/hami-dra/values-local.yaml and
  the image ``make image`` built, so the pods run with the chart's own service accounts, RBAC,
  security contexts, probes, hostPath mounts, webhook Service and certificate.

Both leave the cluster as they found it: pods, claims, templates and classes the tests made are
deleted while the driver still runs (its controller removes its finalizers, its plugin
unprepares), then the driver goes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dra_driver.controller import FINALIZER
from hami_dra_dev.cluster.driver import POD_GATE_NAME, remove_admission_policy, remove_claim_finalizer_policy
from hami_dra_dev.cluster.images import driver_image_archive
from hami_dra_dev.cluster.layout import NODE_NAME, Layout
from hami_dra_dev.demo import manifests
from tests.chart.helpers import CHART
from tests.waiting import wait_for

if TYPE_CHECKING:
    from hami_dra_dev.cluster.processes import HostProcess
    from tests.cluster.conftest import RealCluster

DRIVER = manifests.DRIVER
RELEASE = "hami-dra"
CHART_NAMESPACE = "hami-system"
VALUES_LOCAL = CHART / "values-local.yaml"
LEASE = "hami-dra-controller"
COMPONENT_LABEL = "app.kubernetes.io/component"


class DriverUnderTest(Protocol):
    kind: str
    #: True when the driver installs the seed's recipe DeviceClasses itself (the chart does).
    provides_recipe_classes: bool

    def log(self, component: str) -> str: ...

    def stop(self) -> None: ...


def slice_published(cluster: RealCluster) -> bool:
    slices = cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
    return any(s["spec"].get("nodeName") == NODE_NAME for s in slices)


def reset_workloads(cluster: RealCluster) -> None:
    """Delete what the tests created, while the driver still runs, and wait for the claims to go."""
    cluster.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true", "--timeout=90s")
    wait_for(lambda: not cluster.get("resourceclaims", "-A")["items"], 90, "every claim deleted")
    cluster.kubectl("delete", "resourceclaimtemplates", "--all", "-n", "default", "--wait=true")


class HostDriver:
    kind = "host"
    provides_recipe_classes = False
    #: The fault suite's API proxy in front of the controller (tests/cluster/faults.py), if any.
    proxy: Any = None

    def __init__(self, cluster: RealCluster, controller_kubeconfig: str | None = None) -> None:
        from hami_dra_dev.cluster.driver import DriverOptions, start_driver
        from hami_dra_dev.cluster.pki import ClusterPki

        self.cluster = cluster
        layout = Layout(cluster.state_dir)
        self.pki = ClusterPki(layout.pki)
        options = DriverOptions(controller_kubeconfig=controller_kubeconfig)
        self.processes: list[HostProcess] = start_driver(layout, self.pki, cluster.api_client, options)

    def set_pod_gate(self, mode: str) -> None:
        """Register our admission again with the pod gate ``mode`` (webhook or policy), as
        ``cluster up`` would with ``DriverOptions.pod_gate``."""
        from hami_dra_dev.cluster.driver import WEBHOOK_URL, register_webhooks

        register_webhooks(self.cluster.api_client, WEBHOOK_URL, self.pki.ca.cert.read_bytes(), DRIVER, mode)

    def kill(self, component: str) -> None:
        """SIGKILL one of the driver's processes and start it again, as its supervisor would."""
        process = next(p for p in self.processes if p.name == component)
        process.process.kill()
        process.process.wait(10)
        process.restart()

    def log(self, component: str) -> str:
        return self.cluster.log(component)

    def stop(self) -> None:
        reset_workloads(self.cluster)
        for process in reversed(self.processes):
            process.stop()
        cluster = self.cluster
        cluster.kubectl("delete", "deviceclasses", "--all", "--wait=true")
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "hami-dra",
                        "--ignore-not-found", "--wait=true")  # fmt: skip
        remove_claim_finalizer_policy(cluster.api_client)
        remove_admission_policy(cluster.api_client, POD_GATE_NAME)
        cluster.kubectl(
            "delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}", "--wait=true"
        )


class ChartDriver:
    kind = "chart"
    provides_recipe_classes = True

    def __init__(self, cluster: RealCluster, helm: str) -> None:
        self.cluster = cluster
        self.helm = helm
        self.installed = False
        self._import_image()
        self.install()

    # --- helm ------------------------------------------------------------------------------------
    def run_helm(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [self.helm, "--kubeconfig", str(self.cluster.kubeconfig), *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}\n{self.diagnosis()}")
        return result.stdout

    def values_args(self) -> list[str]:
        """values-local.yaml is the whole install; only a non-default state dir needs one more value."""
        args = ["-f", str(VALUES_LOCAL)]
        kubelet_root = Layout(self.cluster.state_dir).kubelet_root
        if str(kubelet_root) not in VALUES_LOCAL.read_text():
            args += ["--set", f"kubeletPlugin.kubeletRootDir={kubelet_root}"]
        return args

    def chart_source(self) -> list[str]:
        """The chart helm installs: the checkout's; a released one names its registry and version."""
        return [str(CHART)]

    def install(self) -> None:
        self.run_helm("install", RELEASE, *self.chart_source(), "-n", CHART_NAMESPACE, "--create-namespace",
                      *self.values_args(), "--wait", "--timeout", "240s")  # fmt: skip
        self.installed = True
        wait_for(lambda: slice_published(self.cluster), 60, "the chart's kubelet plugin publishing its slice")
        wait_for(self.leader, 60, "a controller replica holding the lease")

    def upgrade(self, *set_values: str, wait: bool = True) -> None:
        """``helm upgrade`` with ``--set`` of each value; ``wait=False`` where a pod of the release
        is meant never to become ready (an image that cannot be pulled), which ``--wait`` awaits."""
        sets = [arg for value in set_values for arg in ("--set", value)]
        waiting = ["--wait", "--timeout", "240s"] if wait else []
        self.run_helm("upgrade", RELEASE, *self.chart_source(), "-n", CHART_NAMESPACE, *self.values_args(),
                      *sets, *waiting)  # fmt: skip

    def set_pod_gate(self, mode: str) -> None:
        """``helm upgrade`` with ``webhook.podGate`` (webhook, auto or policy)."""
        self.upgrade(f"webhook.podGate={mode}")

    def uninstall(self) -> None:
        if self.installed:
            self.run_helm("uninstall", RELEASE, "-n", CHART_NAMESPACE, "--wait", "--timeout", "120s")
            self.installed = False

    def _import_image(self) -> None:
        archive = driver_image_archive()
        if not archive.is_file():
            raise AssertionError(f"no driver image at {archive}: run `make image` (make test does)")
        socket = self.cluster.state_dir / "containerd" / "containerd.sock"
        subprocess.run(
            [str(self.cluster.toolchain.path("ctr")), "--address", str(socket), "-n", "k8s.io",
             "images", "import", str(archive)],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip

    # --- what the tests look at ------------------------------------------------------------------
    def pods(self, component: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.get(
            "pods", "-n", CHART_NAMESPACE, "-l", f"{COMPONENT_LABEL}={component}"
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def leader(self) -> str | None:
        """The pod name of the lease holder (identities are ``<pod name>_<random>``)."""
        out = self.cluster.kubectl(
            "get", "lease", LEASE, "-n", CHART_NAMESPACE, "--ignore-not-found", "-o", "json"
        )
        lease = json.loads(out) if out.strip() else {}
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        names = {p["metadata"]["name"] for p in self.pods("controller")}
        pod = holder.rsplit("_", 1)[0]
        return pod if pod in names else None

    def log(self, component: str) -> str:
        """Every current pod's log of the component (both controller replicas, the plugin pod)."""
        return "\n".join(
            self.cluster.kubectl("logs", "-n", CHART_NAMESPACE, p["metadata"]["name"], "--tail=-1")
            for p in self.pods(component)
        )

    def diagnosis(self) -> str:
        """What a failed install looks like from outside: pod states and recent events."""
        try:
            pods = self.cluster.kubectl("get", "pods", "-n", CHART_NAMESPACE, "-o", "wide", check=False)
            events = self.cluster.kubectl("get", "events", "-n", CHART_NAMESPACE, "--sort-by=.lastTimestamp",
                                          check=False)  # fmt: skip
        except Exception as err:  # the diagnosis must never hide the original failure
            return f"(no diagnosis: {err})"
        return f"pods:\n{pods}\nevents:\n{events[-4000:]}"

    def stop(self) -> None:
        if self.installed:
            reset_workloads(self.cluster)
            self.uninstall()
        self.cluster.kubectl("delete", "namespace", CHART_NAMESPACE, "--ignore-not-found", "--wait=true")


def claims_with_our_finalizer(cluster: RealCluster) -> list[str]:
    claims = cluster.get("resourceclaims", "-A")["items"]
    return [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in claims
        if FINALIZER in (c["metadata"].get("finalizers") or [])
    ]


def checkpoint(cluster: RealCluster) -> dict[str, Any]:
    path: Path = Layout(cluster.state_dir).plugin_dir(DRIVER) / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text()).get("claims") or {}
    return claims
