"""A per-node kubelet simulator: plugin registration, prepare/unprepare, slice wipe (the sandbox's
nodes, the demo, and the kubelet plugin's tests use it; it is a kubelet, not an API server).

It speaks to the driver only as kubelet does, over the plugin's real unix sockets, with message
classes built from a *separately compiled* copy of kubelet's protos (``KubeletProtocol``): where
kubelet's own proto files are at hand, the wire-contract tests compile those with grpcio-tools,
so a field renumbered in our ``api/kubelet`` would break them; otherwise (a plain clone, ``hami-dra
sandbox up``) it compiles our own ``api/kubelet`` protos the same way.

What it does (kubelet's registration and prepare/unprepare):
- at start-up deletes every ResourceSlice of its node (all drivers), like kubelet;
- watches its registry dir for sockets not starting with ``.``, calls GetInfo, validates the type,
  picks the first supported DRA service it knows (v1, then v1beta1), and reports the verdict with
  NotifyRegistrationStatus; a removed socket deregisters the plugin;
- for pods bound to its node (``spec.nodeName``) calls NodePrepareResources once per driver with
  the pod's claims that are reserved for the pod and allocated, records the CDI IDs, and calls
  NodeUnprepareResources when the pod ends (phase Succeeded/Failed, or deleted) and no other pod
  on the node uses the claim;
- finishes the graceful deletion of its pods: a pod with a ``deletionTimestamp`` whose claims
  are unprepared is deleted with grace period 0, as kubelet does once its containers stopped (a
  real kube-apiserver keeps the pod, Terminating, until then). Never used in production.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

LOG = logging.getLogger(__name__)

#: Proto files of kubelet's plugin APIs, relative to the root they are compiled from.
UPSTREAM_PROTOS = (
    "pkg/apis/pluginregistration/v1/api.proto",
    "pkg/apis/dra/v1/api.proto",
    "pkg/apis/dra/v1beta1/api.proto",
    "pkg/apis/dra-health/v1alpha1/api.proto",
)
OWN_PROTOS = tuple(p.removeprefix("pkg/apis/") for p in UPSTREAM_PROTOS)
DRA_SERVICES = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1",
}


class ProtocolError(Exception):
    """The kubelet protos could not be compiled or loaded."""


def compile_descriptor_set(root: Path, files: tuple[str, ...]) -> bytes:
    """Compile ``files`` under ``root`` with grpcio-tools' protoc into a serialized FileDescriptorSet."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--descriptor_set_out={out}", *files]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ProtocolError(f"protoc failed for {root}: {result.stderr.strip()}")
        return out.read_bytes()


class KubeletProtocol:
    """kubelet's message classes in a private descriptor pool (no clash with the plugin's own)."""

    def __init__(self, descriptor_set: bytes) -> None:
        self.file_set = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        self.pool = descriptor_pool.DescriptorPool()
        for file_proto in self.file_set.file:
            self.pool.Add(file_proto)

    @classmethod
    def compile(cls, root: Path, files: tuple[str, ...] = UPSTREAM_PROTOS) -> KubeletProtocol:
        return cls(compile_descriptor_set(root, files))

    @classmethod
    def own(cls, repo_root: Path) -> KubeletProtocol:
        """From this project's api/kubelet protos (fallback when upstream copies are absent)."""
        return cls.compile(repo_root / "api" / "kubelet", OWN_PROTOS)

    def message(self, full_name: str) -> Any:
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))

    def unary(self, channel: grpc.Channel, service: str, method: str) -> Any:
        """A callable for ``/<service>/<method>`` typed by the service's descriptor."""
        descriptor = self.pool.FindServiceByName(service).FindMethodByName(method)
        request = message_factory.GetMessageClass(descriptor.input_type)
        response = message_factory.GetMessageClass(descriptor.output_type)
        call = channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        return lambda timeout=10.0, **kwargs: call(request(**kwargs), timeout=timeout)

    def stream(self, channel: grpc.Channel, service: str, method: str) -> Any:
        descriptor = self.pool.FindServiceByName(service).FindMethodByName(method)
        request = message_factory.GetMessageClass(descriptor.input_type)
        response = message_factory.GetMessageClass(descriptor.output_type)
        call = channel.unary_stream(
            f"/{service}/{method}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        return lambda timeout=None, **kwargs: call(request(**kwargs), timeout=timeout)


@dataclass
class RegisteredPlugin:
    """What kubelet keeps about a registered DRA plugin."""

    driver: str
    endpoint: str
    service: str
    registration_socket: Path


class PluginClient:
    """kubelet's side of one plugin: registration socket + DRA endpoint."""

    def __init__(self, protocol: KubeletProtocol, registration_socket: Path) -> None:
        self.protocol = protocol
        self.registration_socket = registration_socket
        self._reg_channel = grpc.insecure_channel(f"unix://{registration_socket}")
        self._channel: grpc.Channel | None = None
        self.plugin: RegisteredPlugin | None = None

    def get_info(self, timeout: float = 1.0) -> Any:
        return self.protocol.unary(self._reg_channel, "pluginregistration.Registration", "GetInfo")(timeout)

    def notify(self, registered: bool, error: str = "") -> Any:
        call = self.protocol.unary(
            self._reg_channel, "pluginregistration.Registration", "NotifyRegistrationStatus"
        )
        return call(5.0, plugin_registered=registered, error=error)

    def register(
        self, known_services: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    ) -> RegisteredPlugin:
        """kubelet's registration: GetInfo, validate, choose a service, NotifyRegistrationStatus."""
        info = self.get_info()
        error = ""
        if info.type != "DRAPlugin":
            error = f"no handler registered for plugin type: {info.type}"
        chosen = next((s for s in info.supported_versions if s in known_services), "")
        if not error and not chosen:
            error = (
                f"none of services supported by the plugin ({list(info.supported_versions)}) are supported"
            )
        if error:
            self.notify(False, error)
            raise ProtocolError(error)
        endpoint = info.endpoint or str(self.registration_socket)
        self.plugin = RegisteredPlugin(info.name, endpoint, chosen, self.registration_socket)
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        self.notify(True)
        return self.plugin

    def _service(self, version: str | None) -> str:
        assert self.plugin is not None, "register() first"
        chosen = version or self.plugin.service
        if not chosen.endswith(".DRAPlugin"):
            chosen += ".DRAPlugin"
        return f"{DRA_SERVICES[chosen]}.DRAPlugin"

    def prepare(self, claims: list[dict[str, str]], version: str | None = None, timeout: float = 45.0) -> Any:
        assert self._channel is not None
        call = self.protocol.unary(self._channel, self._service(version), "NodePrepareResources")
        return call(timeout, claims=claims)

    def unprepare(
        self, claims: list[dict[str, str]], version: str | None = None, timeout: float = 45.0
    ) -> Any:
        assert self._channel is not None
        call = self.protocol.unary(self._channel, self._service(version), "NodeUnprepareResources")
        return call(timeout, claims=claims)

    def watch_health(self) -> Iterator[Any]:
        assert self._channel is not None
        result: Iterator[Any] = self.protocol.stream(
            self._channel, "v1alpha1.DRAResourceHealth", "NodeWatchResources"
        )()
        return result

    def close(self) -> None:
        self._reg_channel.close()
        if self._channel is not None:
            self._channel.close()


@dataclass
class PreparedPod:
    """Claims prepared for one pod and the CDI IDs kubelet would hand to the runtime."""

    uid: str
    claims: dict[str, dict[str, str]] = field(default_factory=dict)  # claim uid -> ref
    cdi_ids: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> CDI IDs
    drivers: dict[str, list[str]] = field(default_factory=dict)  # claim uid -> drivers that prepared it
    error: str = ""
    reported_running: bool = False


def _claim_names(pod: dict[str, Any]) -> list[str]:
    """ResourceClaim names a pod uses: direct names, or those recorded for templates."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
        if name:
            names.append(str(name))
    return names


def _pod_done(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


class KubeletSimulator:
    """One node's kubelet, reduced to what a DRA driver observes (see the module docstring)."""

    def __init__(
        self,
        node_name: str,
        registry_dir: Path,
        api_client: Any,
        protocol: KubeletProtocol,
        interval: float = 0.1,
    ) -> None:
        from kubernetes import client

        self.node_name = node_name
        self.registry_dir = registry_dir
        self.protocol = protocol
        self.interval = interval
        self._core: Any = client.CoreV1Api(api_client)
        self._resource: Any = client.ResourceV1Api(api_client)
        self.plugins: dict[str, PluginClient] = {}  # driver -> client
        self._sockets: dict[Path, str] = {}  # registration socket -> driver
        self.pods: dict[str, PreparedPod] = {}  # pod uid -> prepared state
        #: Pods gone whose claims could not be unprepared yet (plugin down, an error): retried
        #: on every sync, as kubelet retries NodeUnprepareResources until it succeeds.
        self.unprepare_pending: dict[str, PreparedPod] = {}
        self.health: dict[tuple[str, str, str], str] = {}  # (driver, pool, device) -> HEALTHY/UNHEALTHY
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Wipe the node's ResourceSlices (as kubelet does at start-up), then run the sync loop."""
        self._resource.delete_collection_resource_slice(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for plugin in self.plugins.values():
            plugin.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # keep going like kubelet; record for tests
                LOG.warning("kubelet %s: %s", self.node_name, err)
                self.errors.append(str(err))
            self._stop.wait(self.interval)

    def sync(self) -> None:
        with self._lock:
            self._sync_plugins()
            self._sync_pods()

    # -- plugins ------------------------------------------------------------------------------

    def _sync_plugins(self) -> None:
        present = {p for p in self.registry_dir.rglob("*") if not p.name.startswith(".") and p.is_socket()}
        for socket in list(self._sockets):
            if socket not in present:
                driver = self._sockets.pop(socket)
                LOG.info("kubelet %s: plugin %s deregistered", self.node_name, driver)
                self.plugins.pop(driver).close()
        for socket in sorted(present - set(self._sockets)):
            client = PluginClient(self.protocol, socket)
            try:
                plugin = client.register()
            except (grpc.RpcError, ProtocolError) as err:
                client.close()
                self.errors.append(f"registration via {socket} failed: {err}")
                continue
            self._sockets[socket] = plugin.driver
            self.plugins[plugin.driver] = client
            threading.Thread(target=self._watch_health, args=(plugin.driver, client), daemon=True).start()

    def _watch_health(self, driver: str, client: PluginClient) -> None:
        try:
            for message in client.watch_health():
                for device in message.devices:
                    key = (driver, device.device.pool_name, device.device.device_name)
                    self.health[key] = (
                        self.protocol.pool.FindEnumTypeByName("v1alpha1.HealthStatus")
                        .values_by_number[device.health]
                        .name
                    )
                if self._stop.is_set():
                    return
        except grpc.RpcError:
            return

    # -- pods ---------------------------------------------------------------------------------

    def _sync_pods(self) -> None:
        response = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        pods = {p["metadata"]["uid"]: p for p in json.loads(response.data).get("items") or []}
        for uid, pod in pods.items():
            if not _pod_done(pod) and (uid not in self.pods or self.pods[uid].error):
                self.pods[uid] = self._prepare_pod(pod)
            state = self.pods.get(uid)
            if state is not None and not state.error and not state.reported_running:
                # Retried on every sync until the API server takes it, as kubelet's status manager does.
                state.reported_running = self._mark_running(pod)
        for uid in list(self.pods):
            if uid not in pods or _pod_done(pods[uid]):
                self.unprepare_pending[uid] = self.pods.pop(uid)
        for uid, state in list(self.unprepare_pending.items()):
            if self._unprepare_pod(state):
                del self.unprepare_pending[uid]
        for uid, pod in pods.items():
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            if terminating and uid not in self.pods and uid not in self.unprepare_pending:
                self._finish_deletion(pod)

    def _prepare_pod(self, pod: dict[str, Any]) -> PreparedPod:
        meta = pod["metadata"]
        state = PreparedPod(uid=meta["uid"])
        batches: dict[str, list[dict[str, str]]] = {}
        from kubernetes.client.exceptions import ApiException

        for name in _claim_names(pod):
            try:
                response = self._resource.read_namespaced_resource_claim(
                    name, meta["namespace"], _preload_content=False
                )
            except ApiException as err:
                if err.status != 404:
                    raise
                # Like kubelet: the pod waits (and is retried) until its claim exists.
                state.error = f"pod {meta['name']}: ResourceClaim {name} not found"
                return state
            claim = json.loads(response.data)
            status = claim.get("status") or {}
            if not any(r.get("uid") == meta["uid"] for r in status.get("reservedFor") or []):
                state.error = f"pod {meta['name']} is not allowed to use ResourceClaim {name}"
                return state
            ref = {"namespace": meta["namespace"], "name": name, "uid": claim["metadata"]["uid"]}
            state.claims[ref["uid"]] = ref
            drivers = {
                r["driver"]
                for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            }
            for driver in sorted(drivers):
                batches.setdefault(driver, []).append(ref)
        for driver, claims in batches.items():
            plugin = self.plugins.get(driver)
            if plugin is None:
                state.error = f"DRA driver {driver} is not registered"
                return state
            response = plugin.prepare(claims)
            for claim_ref in claims:
                if claim_ref["uid"] not in response.claims:
                    state.error = "NodePrepareResources skipped a ResourceClaim"
                    return state
                result = response.claims[claim_ref["uid"]]
                if result.error:
                    state.error = (
                        f"NodePrepareResources failed for ResourceClaim {claim_ref['name']}: {result.error}"
                    )
                    return state
                state.drivers.setdefault(claim_ref["uid"], []).append(driver)
                ids = state.cdi_ids.setdefault(claim_ref["uid"], [])
                ids.extend(i for d in result.devices for i in d.cdi_device_ids)
        return state

    def _mark_running(self, pod: dict[str, Any]) -> bool:
        """Report the pod Running once its claims are prepared, as kubelet does after starting containers.

        Nothing runs for real; the status only lets ``kubectl get pods`` tell prepared pods apart.
        """
        meta, now = pod["metadata"], datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        containers = (pod.get("spec") or {}).get("containers") or []
        status = {
            "phase": "Running",
            "startTime": now,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for container in containers
            ],
        }
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        except ApiException as err:
            if err.status == 404:  # a pod deleted meanwhile is normal; the next sync unprepares it
                return True
            self.errors.append(f"cannot report pod {meta['name']} Running: {err.status} {err.reason}")
            return False
        return True

    def _finish_deletion(self, pod: dict[str, Any]) -> None:
        """Delete a terminating pod at once (its uid a precondition: a namesake is left alone)."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self._core.delete_namespaced_pod(
                meta["name"], meta["namespace"], body=body, _preload_content=False
            )
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or another pod of the name
                self.errors.append(f"cannot delete pod {meta['name']}: {err.status} {err.reason}")

    def _unprepare_pod(self, state: PreparedPod) -> bool:
        """Unprepare the pod's claims no other pod uses; False if any must be tried again."""
        done = True
        in_use = {uid for other in self.pods.values() for uid in other.claims}
        by_driver: dict[str, list[dict[str, str]]] = {}
        for uid, ref in state.claims.items():
            if uid in in_use:
                continue
            for driver in state.drivers.get(uid, []):
                by_driver.setdefault(driver, []).append(ref)
        for driver, claims in by_driver.items():
            plugin = self.plugins.get(driver)
            if plugin is None:
                self.errors.append(f"cannot unprepare {len(claims)} claim(s): driver {driver} not registered")
                done = False
                continue
            try:
                response = plugin.unprepare(claims)
            except grpc.RpcError as err:
                self.errors.append(f"NodeUnprepareResources for driver {driver} failed: {err.code()}")
                done = False
                continue
            for claim_ref in claims:
                error = (
                    response.claims[claim_ref["uid"]].error
                    if claim_ref["uid"] in response.claims
                    else "skipped"
                )
                if error:
                    self.errors.append(f"NodeUnprepareResources {claim_ref['name']}: {error}")
                    done = False
        return done

    def cdi_ids(self, pod_uid: str) -> list[str]:
        """CDI IDs kubelet would pass to the runtime for the pod (empty if not prepared)."""
        state = self.pods.get(pod_uid)
        return [i for ids in state.cdi_ids.values() for i in ids] if state else []
