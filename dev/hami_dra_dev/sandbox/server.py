"""``SandboxServer``: the in-process API server you start in a test fixture or behind ``sandbox up``.

    with SandboxServer.start() as server:
        client = server.api_client()                      # kubernetes.client.ApiClient
        subprocess.run(["kubectl", "--kubeconfig", str(server.kubeconfig_path), "get", "nodes"])
        server.faults.inject("/resourceclaims", status=500, count=1)

It serves HTTPS (self-signed, CA in the kubeconfig) on 127.0.0.1 on a free port, requires the
bearer token written into the generated kubeconfig, and starts in a few milliseconds (schemas load
lazily on first use).
"""

from __future__ import annotations

import base64
import secrets
import ssl
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from hami_dra_dev.certs import server_cert
from hami_dra_dev.sandbox.api import Api
from hami_dra_dev.sandbox.faults import Faults
from hami_dra_dev.sandbox.http import SandboxHTTPServer

DEFAULT_KUBE_VERSION = "1.36"


def supported_versions() -> list[str]:
    """Kubernetes minor versions (>= 1.34, resource.k8s.io/v1) with bundled strict schemas."""
    from kubernetes_validate import utils as kv_utils

    out = []
    for version in kv_utils.all_versions():
        major, minor = (int(x) for x in version.split(".")[:2])
        if (major, minor) >= (1, 34) and f"{major}.{minor}" not in out:
            out.append(f"{major}.{minor}")
    return out


class SandboxServer:
    """A running sandbox API server; use :meth:`start` (context manager) and :meth:`stop`.

    Options: ``kube_version`` ("1.34" ... "1.37"): what ``/version`` reports and which strict
    schemas validate objects; ``history_window``: watch events kept (older resourceVersions get
    410 Gone); ``bookmark_interval``: seconds between BOOKMARK events on idle watches that ask for
    them; ``state_dir``: where the kubeconfig goes (a temp dir removed on stop by default).
    """

    def __init__(
        self,
        *,
        kube_version: str = DEFAULT_KUBE_VERSION,
        history_window: int = 10000,
        bookmark_interval: float = 1.0,
        state_dir: Path | None = None,
    ) -> None:
        if kube_version not in supported_versions():
            choices = ", ".join(supported_versions())
            raise ValueError(f"unsupported Kubernetes version {kube_version!r}: use one of {choices}")
        self.kube_version = kube_version
        self.api = Api(kube_version=kube_version, history_window=history_window)
        self.token = secrets.token_urlsafe(24)
        self.faults = Faults(self.api.store.close_watches)
        self.tls = server_cert()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        self._http = SandboxHTTPServer(
            self.api, self.token, self.faults, kube_version, bookmark_interval, context
        )
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        if state_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="hami-dra-sandbox-")
            state_dir = Path(self._own_dir.name)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = state_dir.resolve()
        self.kubeconfig_path = self.state_dir / "kubeconfig"
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            name="sandbox-apiserver",
            daemon=True,
            kwargs={"poll_interval": 0.02},
        )
        self._started = False

    @classmethod
    def start(cls, **kwargs: Any) -> SandboxServer:
        """Create, write the kubeconfig and start serving (see :class:`SandboxServer` for options)."""
        server = cls(**kwargs)
        server._write_kubeconfig()
        server._thread.start()
        server._started = True
        return server

    @property
    def port(self) -> int:
        return int(self._http.server_port)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def request_count(self) -> int:
        return self._http.request_count

    def kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandbox",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.tls.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "sandbox-admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "sandbox",
                    "context": {"cluster": "sandbox", "user": "sandbox-admin", "namespace": "default"},
                }
            ],
            "current-context": "sandbox",
            "preferences": {},
        }

    def _write_kubeconfig(self) -> None:
        self.kubeconfig_path.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from the generated kubeconfig."""
        from kubernetes import config

        new_client: Any = config.new_client_from_config
        return new_client(config_file=str(self.kubeconfig_path))

    def compact(self) -> None:
        """Forget the watch history: every resourceVersion older than now gets 410 Gone."""
        self.api.store.compact()

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._http.stopping = True
        self.api.close()
        self._http.shutdown()
        self._http.server_close()
        self._http.close_connections()
        self._thread.join(timeout=5)
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def __enter__(self) -> SandboxServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
