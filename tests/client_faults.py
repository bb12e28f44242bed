"""Faults injected on a client's own requests, where a real kube-apiserver makes none on demand.

The next ``count`` requests that match a path (``re.search``) and, optionally, a method fail with
``status``, wait ``delay`` seconds, or are held until ``hold`` is set and then sent as they were (a
request that hung on its way and lands late, judged by the real server); ``hits`` counts the
matches, so a test can also check how often a path was asked for. Two places to attach:

- ``attach(kube)``: a ``Kube`` (our controller's client); a failed request raises the
  ``KubeError`` the client raises for an API error.
- ``attach_client(api_client)``: a ``kubernetes.client.ApiClient`` (the kubelet plugin's, the
  kubelet simulator's); a failed request is answered with an HTTP response of that status and a
  ``Status`` body, as kube-apiserver answers, so every caller (``Kube``, the generated APIs) reads
  it as it reads the server's own errors.

Only the clients attached are touched: a test's own client stays clean unless it attaches it.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

from dra_driver.kube.api import Kube
from dra_driver.kube.errors import KubeError
from hami_dra_dev.faults import REASONS, Fault, FaultRules


class ClientFaults(FaultRules):
    """The active faults of the clients attached (the rules are the sandbox server's,
    ``hami_dra_dev/faults.py``)."""

    @staticmethod
    def _wait(fault: Fault) -> None:
        if fault.delay:
            time.sleep(fault.delay)
        if fault.hold is not None:
            fault.hold.wait()

    def attach(self, kube: Kube) -> Kube:
        """``kube`` with every request of it passing through these faults."""
        sent = kube._call

        def call(method: str, path: str, **kwargs: Any) -> Any:
            fault = self.take(method, path)
            if fault is None:
                return sent(method, path, **kwargs)
            self._wait(fault)
            try:
                if fault.status is not None:
                    raise KubeError(fault.status, f"injected by the test: {method} {path}")
                return sent(method, path, **kwargs)
            finally:
                fault.released.set()

        kube._call = call  # type: ignore[method-assign]
        return kube

    def attach_client(self, api_client: Any) -> Any:
        """``api_client`` (a ``kubernetes.client.ApiClient``) with every request of it passing
        through these faults; matched on the URL's path, as a server sees it. Attached to its
        connection pool, which every caller goes through (the generated APIs, ``Kube``)."""
        pool = api_client.rest_client.pool_manager
        sent = pool.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            fault = self.take(method, urlsplit(url).path)
            if fault is None:
                return sent(method, url, *args, **kwargs)
            self._wait(fault)
            try:
                if fault.status is not None:
                    return status_response(fault.status, f"injected by the test: {method} {url}")
                return sent(method, url, *args, **kwargs)
            finally:
                fault.released.set()

        pool.request = request
        return api_client


def status_response(code: int, message: str) -> Any:
    """The response kube-apiserver gives for an error: ``code`` and a ``Status`` object (with
    ``Retry-After`` on a 429, as the server's rate limiting sends it)."""
    from urllib3.response import HTTPResponse

    reason = REASONS.get(code, "InternalError")
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    headers = {"Content-Type": "application/json"}
    if code == 429:
        status["details"] = {"retryAfterSeconds": 1}
        headers["Retry-After"] = "1"
    body = json.dumps(status).encode()
    return HTTPResponse(body=body, status=code, headers=headers, reason=reason)
