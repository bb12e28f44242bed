"""Test harness: a cluster with GPU slices, DeviceClasses, and our controller running.

The cluster is the real control plane with kube-controller-manager and kube-scheduler
(``plane_harness``, tests/apiserver_fixtures.py ``controller_plane``: Node objects kept Ready as a
kubelet keeps them; tests/controller/plane_driver.py adds a kubelet, our plugin and our webhook
where a test needs them). A test owns the plane while it runs and leaves it empty
(``reset_plane``), so each uses the plain names (``default``, ``node-1``, the classes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from dra_driver.config import ControllerDefaults
from dra_driver.contract import SCHEDULER_FENCE
from dra_driver.controller.controller import Controller
from dra_driver.devices.simulated import profile_gpus
from dra_driver.kube.api import (
    DEVICE_CLASSES,
    GPU_QUOTAS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_QUOTAS,
    RESOURCE_SLICES,
    Kube,
)
from dra_driver.kube.api import EVENTS as EVENTS_RESOURCE
from dra_driver.kube.errors import KubeError
from dra_driver.resource.slice_builder import build_resource_slices
from hami_dra_dev.cluster.controlplane import ControlPlane
from hami_dra_dev.cluster.fakenodes import FakeNodes, FakeNodeSpec
from tests import waiting
from tests.apiserver_fixtures import NOT_READY_TAINT
from tests.client_faults import ClientFaults

DRIVER = "gpu.hami.io"
NS = "default"
GATE = "gpu.hami.io/allocation"
MIB = 1024 * 1024
CFG = {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig"}


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    return waiting.wait_for(check, timeout, what)


def device_class(
    name: str, config: dict[str, Any] | None = None, selectors: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selectors": [
            {"cel": {"expression": expr}} for expr in (selectors or [f'device.driver == "{DRIVER}"'])
        ]
    }
    if config is not None:
        spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": {**CFG, **config}}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def request(
    name: str = "gpu",
    klass: str = DRIVER,
    memory: str | None = None,
    cores: int | None = None,
    count: int | None = None,
    selectors: list[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": klass}
    capacity = {}
    if memory is not None:
        capacity["memory"] = memory
    if cores is not None:
        capacity["cores"] = str(cores)
    if capacity:
        body["capacity"] = {"requests": capacity}
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": expr}} for expr in selectors]
    return {"name": name, "exactly": body}


def exactly(name: str, klass: str = DRIVER, **body: Any) -> dict[str, Any]:
    """A request of ``klass`` with any ``exactly`` fields (``allocationMode``, ``adminAccess``, raw
    ``capacity`` and ``selectors``, ...), as written."""
    return {"name": name, "exactly": {"deviceClassName": klass, **body}}


def claim(name: str, *requests: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests) or [request()]}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": {**CFG, **config}}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": devices},
    }


def pod(
    name: str, claims: dict[str, str], *, gated: bool = True, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """``claims`` maps pod claim names to ``claim:<name>`` or ``template:<name>``."""
    entries = []
    for entry, ref in claims.items():
        kind, _, target = ref.partition(":")
        key = "resourceClaimName" if kind == "claim" else "resourceClaimTemplateName"
        entries.append({"name": entry, key: target})
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"claims": [{"name": entry} for entry in claims]},
            }
        ],
        "resourceClaims": entries,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Server(Protocol):
    """What the harness needs of a cluster's API server (a ``ControlPlane``)."""

    @property
    def kubeconfig_path(self) -> Any: ...

    def api_client(self) -> Any: ...


class Harness:
    """Owns the cluster objects of one test; ``start_controller`` runs our controller against it.

    ``fence``: DeviceClasses get the chart's scheduler fence (``SCHEDULER_FENCE``), as they must
    where a real kube-scheduler runs: it never allocates a claim of ours (first fit) itself."""

    def __init__(self, server: Server, cluster: Any, *, fence: bool = False) -> None:
        self.server = server
        self.cluster = cluster
        self.fence = fence
        self.api_client = server.api_client()
        self.kube = Kube(self.api_client)
        self.controllers: list[Controller] = []
        self.client_faults = ClientFaults()

    def publish(self, node: str, profile: str = "t4", gpus: int = 4, **kwargs: Any) -> None:
        for obj in build_resource_slices(
            profile_gpus(profile, node_name=node, gpus=gpus), node_name=node, driver_name=DRIVER, **kwargs
        ):
            self.kube.create(RESOURCE_SLICES, None, obj)

    def create_class(self, obj: dict[str, Any]) -> None:
        if self.fence:
            obj = {**obj, "spec": {**obj["spec"], "selectors": [*obj["spec"]["selectors"], _FENCE]}}
        self.kube.create(DEVICE_CLASSES, None, obj)

    def create_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(RESOURCE_CLAIMS, NS, obj)

    def create_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(PODS, NS, obj)

    def create_template(self, name: str, *requests: dict[str, Any]) -> dict[str, Any]:
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": list(requests)}}},
        }
        path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates"
        result: dict[str, Any] = self.kube.request("POST", path, template)
        return result

    def delete_pod(self, name: str) -> None:
        """Delete a pod as it goes once its kubelet confirmed its containers stopped: at once (a
        bound pod on the real plane, where no kubelet runs, would otherwise stay Terminating)."""
        self.kube.request("DELETE", PODS.path(NS, name), {"gracePeriodSeconds": 0})

    def get_claim(self, name: str) -> dict[str, Any]:
        return self.kube.get(RESOURCE_CLAIMS, NS, name)

    def get_pod(self, name: str) -> dict[str, Any]:
        return self.kube.get(PODS, NS, name)

    @property
    def faults(self) -> ClientFaults:
        """Where a test injects API faults: on our controllers' own clients (a real server makes
        none on demand)."""
        return self.client_faults

    def start_controller(self, *, kube: Kube | None = None, **kwargs: Any) -> Controller:
        """Our controller on its own client (``kube``: one given), through ``client_faults``."""
        defaults = kwargs.pop("defaults", ControllerDefaults())
        kube = self.client_faults.attach(kube or Kube(self.server.api_client()))
        controller = Controller(kube, DRIVER, defaults, **kwargs)
        controller.start()
        self.controllers.append(controller)
        return controller

    def stop(self) -> None:
        for controller in self.controllers:
            controller.stop()
        self.api_client.close()

    def pod_claim(self, pod_name: str, entry: str = "gpu") -> dict[str, Any]:
        """The claim a pod entry resolves to (template claims: via resourceClaimStatuses)."""
        pod_obj = self.get_pod(pod_name)
        for ref in pod_obj["spec"].get("resourceClaims") or ():
            if ref["name"] == entry and ref.get("resourceClaimName"):
                return self.get_claim(ref["resourceClaimName"])
        for status in (pod_obj.get("status") or {}).get("resourceClaimStatuses") or ():
            if status["name"] == entry:
                return self.get_claim(status["resourceClaimName"])
        raise AssertionError(f"pod {pod_name} has no claim {entry}")

    def devices_of(self, claim_name: str) -> list[str]:
        allocation = (self.get_claim(claim_name).get("status") or {}).get("allocation") or {}
        return [f"{r['pool']}/{r['device']}" for r in allocation.get("devices", {}).get("results", [])]

    def allocated(self, claim_name: str) -> bool:
        return bool((self.get_claim(claim_name).get("status") or {}).get("allocation"))

    def bound_node(self, pod_name: str) -> str | None:
        return self.get_pod(pod_name)["spec"].get("nodeName")

    def events(self, pod_name: str) -> list[str]:
        items = (
            self.kube.list(EVENTS_RESOURCE, field_selector=f"involvedObject.name={pod_name}").get("items")
            or []
        )
        return [item.get("message", "") for item in items]


_FENCE = {"cel": {"expression": SCHEDULER_FENCE}}


class PlaneNodes:
    """Node objects kept Ready on the real plane (``FakeNodes``, no slices: each test publishes its
    own): ``add_node`` for one that joins later."""

    def __init__(self, api_client: Any) -> None:
        self._api_client = api_client
        self._kube = Kube(api_client)
        self._fleets: list[FakeNodes] = []

    def add_node(self, *names: str) -> None:
        fleet = FakeNodes(self._api_client, FakeNodeSpec(count=len(names)), names=names, publish=False)
        self._fleets.append(fleet)
        fleet.create()
        for name in names:  # as the node lifecycle controller does once it sees them Ready
            node = self._kube.get(NODES, None, name)
            taints = [t for t in node["spec"].get("taints") or () if t["key"] != NOT_READY_TAINT]
            self._kube.patch(NODES, None, name, [{"op": "replace", "path": "/spec/taints", "value": taints}])

    def stop(self) -> None:
        for fleet in self._fleets:
            fleet.delete()


@contextmanager
def plane_harness(plane: ControlPlane, nodes: Sequence[str] = ("node-1",)) -> Iterator[Harness]:
    """``nodes`` kept Ready on the real plane and a harness on it; on exit the controllers stop
    and the plane is emptied."""
    api_client = plane.api_client()
    fleet = PlaneNodes(api_client)
    harness: Harness | None = None
    try:
        fleet.add_node(*nodes)
        harness = Harness(plane, fleet, fence=True)
        yield harness
    finally:
        if harness is not None:
            harness.stop()
        fleet.stop()
        reset_plane(Kube(api_client))
        api_client.close()


def reset_plane(kube: Kube) -> None:
    """Remove what a test made (its pods, claims, templates, events, leases, quotas, classes, slices) so
    the next test starts on an empty plane. Pods go at once (no kubelet confirms their end) and
    claims lose their finalizers first (the controller that would release them has stopped)."""
    namespace = f"/api/v1/namespaces/{NS}"
    kube.request("DELETE", f"{namespace}/pods", {"gracePeriodSeconds": 0})
    for claim in kube.list(RESOURCE_CLAIMS).get("items") or ():
        if claim["metadata"].get("finalizers"):
            _drop_finalizers(kube, claim["metadata"]["name"])
    kube.request("DELETE", RESOURCE_CLAIMS.path(NS))
    kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates")
    kube.request("DELETE", f"{namespace}/events")
    kube.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases")  # leader election
    kube.request("DELETE", RESOURCE_QUOTAS.path(NS))
    try:
        kube.request("DELETE", GPU_QUOTAS.path(NS))
    except KubeError as err:
        if not err.not_found:  # the CRD is not installed
            raise
    kube.request("DELETE", DEVICE_CLASSES.path(None))
    kube.request("DELETE", RESOURCE_SLICES.path(None))
    waiting.wait_for(
        lambda: not kube.list(PODS).get("items") and not kube.list(RESOURCE_CLAIMS).get("items"),
        timeout=30,
        what="the plane emptied of the test's pods and claims",
    )


def _drop_finalizers(kube: Kube, name: str) -> None:
    """Remove every finalizer of claim ``name``, re-read after a conflict (kube-controller-manager
    may be updating its reservations). An Update sends the opaque config back re-encoded by the
    Python client, a PATCH has kube-apiserver re-encode it compactly: a config written with other
    whitespace than the one used fails "spec: field is immutable". So an Update (right for a claim
    the Python client created), and where it is refused so (422) a JSON patch (right for one
    kube-controller-manager made from a template)."""
    for _ in range(10):
        try:
            claim = kube.get(RESOURCE_CLAIMS, NS, name)
            claim["metadata"]["finalizers"] = []
            try:
                kube.update(RESOURCE_CLAIMS, claim)
            except KubeError as err:
                if err.status != 422:
                    raise
                version = claim["metadata"]["resourceVersion"]
                kube.patch(RESOURCE_CLAIMS, NS, name, [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "replace", "path": "/metadata/finalizers", "value": []},
                ])  # fmt: skip
            return
        except KubeError as err:
            if err.not_found:
                return
            if not err.conflict and err.status != 422:
                raise
    raise AssertionError(f"claim {NS}/{name}: finalizers not removed in 10 tries")
