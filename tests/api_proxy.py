"""A TCP proxy on loopback in front of kube-apiserver, for faults a real server does not make.

``ApiFaultProxy`` sits between a client and kube-apiserver; TLS passes through untouched (the
serving certificate covers 127.0.0.1, so ``proxied_kubeconfig`` only moves the server address).
``delay`` holds every byte for a while (a request that hangs), ``cut`` closes every open
connection at once, so requests in flight are cut mid-write. The real-cluster fault suite
(tests/cluster/faults.py) and the real API server tier (tests/apiserver_fixtures.py) use it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

#: Name prefix of the proxy's threads: they come and go with the connections for as long as a
#: proxy lives, so thread-leak checks elsewhere leave them out.
PROXY_THREADS = "api-fault-proxy"


class ApiFaultProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name=PROXY_THREADS).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections |= {client, server}
            for source, target in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(source, target), daemon=True, name=f"{PROXY_THREADS}-pump"
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.delay:
                    time.sleep(self.delay)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def cut(self) -> int:
        """Close every open connection (requests in flight are cut); returns how many."""
        with self._lock:
            open_now = list(self._connections)
        for sock in open_now:
            self._close(sock)
        return len(open_now) // 2

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()
        self.cut()


def proxied_kubeconfig(admin: Path, port: int, path: Path) -> Path:
    """The admin kubeconfig with its server moved to the proxy (the serving cert covers 127.0.0.1)."""
    import yaml

    body = yaml.safe_load(admin.read_text())
    body["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(body))
    path.chmod(0o600)
    return path
