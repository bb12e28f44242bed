"""One REST request to the API server, straight on the ``kubernetes`` client's connection pool.

Every call of ours builds its own path and JSON body and reads the answer as JSON, so the
generated client's layers above urllib3 add nothing but CPU: ``ApiClient.param_serialize``
sanitizes headers and parameters through its model serializer, and ``RESTClientObject.request``
matches the content type with regular expressions and encodes the body again. Against a canned
answer they cost 40-47 µs of CPU per request and this module 20 (a loop of ``Kube.update``); in a
profile of the controller on the real control plane (issue 35: 100 nodes, a burst of 1,000 pods,
py-spy sampling the thread holding the GIL) they were about a quarter of its time in API writes.
A prepare's latency did not move measurably (docs/performance.md, section 3).

What the client still decides is kept, by reading it from the client at each request: the
connection pool with its TLS, client certificates, proxy and retry settings (``pool_manager``),
the host, the ``User-Agent`` and any default headers, and the credentials: the bearer token is
read through ``Configuration.auth_settings()`` on every request, which runs the kubeconfig's or
the service account's refresh hook, so a rotated token is used as soon as the client would use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

#: The credentials the client may hold for the API server (its ``auth_settings()`` key).
_BEARER = "BearerToken"


class RestTransport:
    """Requests through ``api_client``'s urllib3 pool, with its host, headers and credentials."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        """The request's headers: the client's defaults, its cookie, the credentials now current."""
        client = self.api_client
        headers: dict[str, str] = dict(client.default_headers)
        if client.cookie:
            headers["Cookie"] = client.cookie
        headers["Accept"] = accept
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = client.configuration.auth_settings().get(_BEARER)
        if auth and auth.get("value"):
            headers[auth["key"]] = auth["value"]
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float,
        stream: bool = False,
    ) -> Any:
        """The urllib3 response, its body not read yet (``stream``) or read into ``.data``.

        Raises what urllib3 raises for a failed connection (``urllib3.exceptions.HTTPError``,
        ``OSError``); an HTTP error status is a response like any other.
        """
        import urllib3

        headers = self.headers(accept, content_type if body is not None else None)
        url = self.api_client.configuration.host + path
        if query:
            url += "?" + urlencode(query)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        return self.api_client.rest_client.pool_manager.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout),
            preload_content=not stream,
        )
