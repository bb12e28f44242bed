"""A per-node kubelet simulator for the sandbox: plugin registration, prepare/unprepare, slice wipe.

It speaks to the driver only as kubelet does, over the plugin's real unix sockets, with message
classes built from a *separately compiled* copy of kubelet's protos (``KubeletProtocol``): the
tests compile the upstream protos in ``../shared/reference/upstream`` with grpcio-tools, so a
field renumbered in our ``api/`` would break them. Without upstream protos (e.g. ``hami-dra sandbox
up`` outside this repo's workspace) it falls back to our own protos, compiled the same way.

What it does (kubelet behaviour it copies, see dra-interfaces.md (a), (b)):
- at start-up deletes every ResourceSlice of its node (all drivers), like kubelet;
- watches its registry dir for sockets not starting with ``.``, calls GetInfo, validates the type,
  picks the first supported DRA service it knows (v1, then v1beta1), and reports the verdict with
  NotifyRegistrationStatus; a removed socket deregisters the plugin;
- for pods bound to its node (``spec.nodeName``) calls NodePrepareResources once per driver with
  the pod's claims that are reserved for the pod and allocated, records the CDI IDs, and calls
  NodeUnprepareResources when the pod ends (phase Succeeded/Failed, or deleted) and no other pod
  on the node uses the claim. Never used in production.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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
    error: str = ""
