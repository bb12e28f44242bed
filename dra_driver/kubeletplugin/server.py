"""The two gRPC servers of the plugin and their unix sockets.

- ``<plugin-dir>/dra.sock`` serves DRAPlugin v1 + v1beta1 and DRAResourceHealth v1alpha1;
- ``<registry-dir>/<driver>-reg.sock`` serves only the registration service.

The registration socket is bound last: kubelet's plugin watcher reacts to its appearance by
calling GetInfo and then dialling the DRA endpoint, which must already be up. Sockets are created
with mode 0600 (umask while binding, then chmod), stale sockets from a crashed run are replaced,
and both are removed on clean shutdown (removing the registration socket deregisters the plugin).
"""

from __future__ import annotations

import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

LOG = logging.getLogger(__name__)

#: Unix socket paths are limited to 107 bytes (sun_path) on Linux.
MAX_SOCKET_PATH = 107


class SocketError(Exception):
    """A socket cannot be created where asked; the message says what to change."""


def registration_socket_path(registry_dir: Path, driver_name: str) -> Path:
    return registry_dir / f"{driver_name}-reg.sock"


def _remove_stale(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise SocketError(f"{path} is a directory; remove it so the plugin can create its socket there")
    LOG.info("replacing stale socket %s", path)
    path.unlink()


def serve_unix(path: Path, handlers: list[grpc.GenericRpcHandler], max_workers: int = 16) -> grpc.Server:
    """Start a gRPC server on a fresh unix socket at ``path`` (mode 0600)."""
    if len(str(path).encode()) > MAX_SOCKET_PATH:
        raise SocketError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; use a shorter directory"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=path.name),
        handlers=handlers,
        options=[("grpc.so_reuseport", 0)],
    )
    old_umask = os.umask(0o177)
    try:
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise SocketError(f"cannot listen on {path}")
        server.start()
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return server


class PluginServers:
    """Lifecycle of the DRA and the registration servers."""

    def __init__(
        self,
        plugin_dir: Path,
        registry_dir: Path,
        driver_name: str,
        dra_handlers: list[grpc.GenericRpcHandler],
        registration_handler: grpc.GenericRpcHandler,
    ) -> None:
        self.dra_socket = plugin_dir / "dra.sock"
        self.registration_socket = registration_socket_path(registry_dir, driver_name)
        self._dra_handlers = dra_handlers
        self._registration_handler = registration_handler
        self._servers: list[tuple[grpc.Server, Path]] = []
        self.plugin_dir = plugin_dir

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.plugin_dir, 0o700)
        self._servers.append((serve_unix(self.dra_socket, self._dra_handlers), self.dra_socket))
        self._servers.append(
            (serve_unix(self.registration_socket, [self._registration_handler], 4), self.registration_socket)
        )
        LOG.info("serving DRA on %s, registration on %s", self.dra_socket, self.registration_socket)

    def stop(self, grace: float = 2.0) -> None:
        """Deregister first (remove the registration socket), then drain and remove the DRA socket."""
        for server, path in reversed(self._servers):
            path.unlink(missing_ok=True)
            server.stop(grace).wait(grace + 1)
        self._servers.clear()
