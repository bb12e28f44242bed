"""The REST protocol on top of :class:`~hami_dra_dev.sandbox.api.Api`: routing, auth, lists, watches.

URL layout as kube-apiserver's: ``/api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]`` and
``/apis/<group>/<version>/...``; ``?watch=true`` streams ``{"type", "object"}`` lines over chunked
HTTP/1.1. Responses are JSON (clients that prefer protobuf also accept JSON).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import queue
import select
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox import discovery, protobuf, tables
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.api import Api, WriteOptions, decode_continue, encode_continue
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.faults import Faults
from hami_dra_dev.sandbox.resources import ResourceType, groups, lookup
from hami_dra_dev.sandbox.selectors import make_filter
from hami_dra_dev.sandbox.store import Event, TooOld

log = logging.getLogger(__name__)
#: A held request (``Faults.inject(hold=...)``) is applied after this long even if never released.
HOLD_LIMIT_SECONDS = 120.0
PUBLIC = ("/version", "/healthz", "/livez", "/readyz")


class SandboxHTTPServer(ThreadingHTTPServer):
    """Carries the shared state the per-request handlers need."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        api: Api,
        token: str,
        faults: Faults,
        kube_version: str,
        bookmark_interval: float,
        tls: ssl.SSLContext,
    ) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        # The TLS handshake happens on the handler thread's first read, never in the accept loop.
        self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.api = api
        self.token = token
        self.faults = faults
        self.kube_version = kube_version
        self.bookmark_interval = bookmark_interval
        self.stopping = False
        self.request_count = 0
        self._connections: set[Any] = set()
        self._conn_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Drop every open client connection (keep-alive and watches), as a stopping server does."""
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls
    server: SandboxHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ----------------------------------------------------------------------------------- plumbing

    def _send_json(
        self,
        code: int,
        body: Obj,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", "sandbox")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        for warning in self._warnings:
            self.send_header("Warning", '299 - "' + warning.replace('"', "'") + '"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw: bytes) -> Any:
        if not raw:
            return None
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() == protobuf.CONTENT_TYPE:
            return protobuf.decode(raw)
        try:
            return json.loads(raw)
        except ValueError:
            pass
        ctype = (self.headers.get("Content-Type") or "").split(";")[0]
        if "yaml" in ctype:
            import yaml

            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as err:
                raise e.bad_request(f"error decoding YAML: {err}") from err
        raise e.bad_request("the body of the request could not be decoded as JSON")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self.server.request_count += 1
        self._warnings: list[str] = []
        url = urllib.parse.urlsplit(self.path)
        if len(url.path) > 1 and url.path.endswith("/"):  # /version/ is /version
            url = url._replace(path=url.path.rstrip("/"))
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        raw = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
        try:
            given = (self.headers.get("Authorization") or "").encode()
            if url.path not in PUBLIC and not hmac.compare_digest(
                given, f"Bearer {self.server.token}".encode()
            ):
                raise e.unauthorized()
            delay, error, fault = self.server.faults.match(method, url.path)
            if fault is not None and fault.hold is not None:
                fault.hold.wait(HOLD_LIMIT_SECONDS)
            if delay:
                time.sleep(delay)
            try:
                if error is not None:
                    raise error
                self._route(method, url.path, query, raw)
            finally:
                if fault is not None:
                    fault.released.set()
        except ApiError as err:
            self._send_json(err.code, err.status(), headers=err.headers)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as err:  # a server bug must still answer like a server
            log.exception("sandbox API server error on %s %s", method, self.path)
            self._send_json(500, e.internal(str(err)).status())

    # ----------------------------------------------------------------------------------- routing

    def _route(self, method: str, path: str, query: dict[str, str], raw: bytes) -> None:
        accept = self.headers.get("Accept") or ""
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if path == "/version":
            return self._send_json(200, discovery.version_info(self.server.kube_version))
        if parts == ["openapi", "v2"]:
            if "protobuf" in accept:
                data = discovery.openapi_v2_protobuf(self.server.kube_version)
                self.send_response(200)
                self.send_header("Content-Type", discovery.OPENAPI_V2_PROTOBUF)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            return self._send_json(200, discovery.openapi_v2(self.server.kube_version))
        if parts[:2] == ["openapi", "v3"]:
            doc = (
                discovery.openapi_v3_root()
                if len(parts) == 2
                else discovery.openapi_v3_lookup("/".join(parts[2:]))
            )
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send_json(200, doc)
        if parts in (["api"], ["apis"]):
            version = discovery.negotiate_aggregated(accept)
            if version:
                ctype = discovery.AGGREGATED_V2 if version == "v2" else discovery.AGGREGATED_V2BETA1
                return self._send_json(200, discovery.aggregated(parts == ["api"], version), ctype)
            if parts == ["api"]:
                return self._send_json(200, discovery.api_versions(f"127.0.0.1:{self.server.server_port}"))
            return self._send_json(200, discovery.api_group_list())
        if parts == ["api", "v1"]:
            return self._send_json(200, discovery.resource_list("", "v1"))
        if len(parts) == 2 and parts[0] == "apis":
            group = discovery.api_group(parts[1])
            if group is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send_json(200, group)
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in groups().get(parts[1], []):
            return self._send_json(200, discovery.resource_list(parts[1], parts[2]))
        if parts[:1] == ["api"] and len(parts) >= 3 and parts[1] == "v1":
            return self._resource(method, "", "v1", parts[2:], query, raw)
        if parts[:1] == ["apis"] and len(parts) >= 4:
            return self._resource(method, parts[1], parts[2], parts[3:], query, raw)
        if parts[:1] == ["apis"] and len(parts) == 3:
            raise e.not_served(parts[1], parts[2], None)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _resource(
        self, method: str, group: str, version: str, rest: list[str], query: dict[str, str], raw: bytes
    ) -> None:
        watch = query.get("watch") in ("true", "1")
        if rest[:1] == ["watch"]:
            watch, rest = True, rest[1:]
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = lookup(group, version, rest[2])
            if (candidate is not None and candidate.namespaced) or (not group and rest[2] == "bindings"):
                ns, rest = rest[1], rest[2:]
            elif candidate is None and rest[2] not in ("status", "finalize"):
                raise e.not_served(group, version, rest[2])
        rt = lookup(group, version, rest[0]) if rest else None
        if rest == ["bindings"] and ns and method == "POST" and (group, version) == ("", "v1"):
            body = self._json_body(raw) or {}
            pod = (body.get("metadata") or {}).get("name", "")
            return self._send_json(201, self.server.api.bind(ns, pod, body))
        if rt is None and rest:
            raise e.not_served(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if rt.namespaced and name and not ns:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and not ns and method != "GET":  # the all-namespaces path only lists and watches
            raise e.method_not_allowed()
        opts = WriteOptions(dry_run=query.get("dryRun") == "All", warnings=self._warnings)
        api = self.server.api
        if method == "GET" and watch:
            return self._watch(rt, ns, name, query)
        if method == "GET" and not name:
            return self._list(rt, ns, query)
        if method == "GET":
            if sub and sub != "status":
                raise e.method_not_allowed()
            return self._send_json(200, api.get(rt, ns, name))
        if method == "POST":
            if rt.key == "pods" and sub == "binding":
                return self._send_json(201, api.bind(ns, name, self._json_body(raw), opts))
            if rt.key == "pods" and sub == "eviction":
                return self._send_json(201, api.evict(ns, name, self._json_body(raw), opts))
            if name:
                raise e.method_not_allowed()
            return self._send_json(201, api.create(rt, ns, self._json_body(raw), opts))
        if method == "PUT" and name:
            return self._send_json(200, api.update(rt, ns, name, self._json_body(raw), sub, opts))
        if method == "PATCH" and name:
            ctype = self.headers.get("Content-Type") or ""
            if ctype.startswith("application/apply-patch"):
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "server-side apply is not supported by the sandbox; use client-side kubectl apply",
                )
            return self._send_json(200, api.patch(rt, ns, name, ctype, raw, sub, opts))
        if method == "DELETE":
            options = self._json_body(raw) or {}
            if not isinstance(options, dict):
                raise e.bad_request("DeleteOptions must be a JSON object")
            for param in ("propagationPolicy", "gracePeriodSeconds"):
                if param in query:
                    options[param] = query[param]
            if name:
                result, deleted = api.delete(rt, ns, name, options, opts)
                return self._send_json(200 if deleted else 202, result)
            items, _ = api.list_objects(rt, ns, query.get("labelSelector"), query.get("fieldSelector"))
            for item in items:
                try:
                    api.delete(
                        rt, item["metadata"].get("namespace", ""), item["metadata"]["name"], options, opts
                    )
                except ApiError as err:
                    if err.code != 404:
                        raise
            return self._send_json(
                200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            )
        raise e.method_not_allowed()

    # ----------------------------------------------------------------------------------- list

    def _list(self, rt: ResourceType, ns: str, query: dict[str, str]) -> None:
        items, rv = self.server.api.list_objects(
            rt, ns, query.get("labelSelector"), query.get("fieldSelector")
        )
        start = decode_continue(query.get("continue"))
        if start is not None:
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
        limit = int(query.get("limit") or 0)
        token = None
        remaining = 0
        if limit > 0 and len(items) > limit:
            remaining = len(items) - limit
            items = items[:limit]
            token = encode_continue(items[-1])
        accept = self.headers.get("Accept") or ""
        if tables.wants_table(accept):
            return self._send_json(
                200,
                tables.table(rt, items, str(rv), query.get("includeObject", "Metadata"), token),
                "application/json;as=Table;v=v1;g=meta.k8s.io",
            )
        meta: Obj = {"resourceVersion": str(rv)}
        if token:
            meta.update({"continue": token, "remainingItemCount": remaining})
        self._send_json(
            200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}
        )

    # ----------------------------------------------------------------------------------- watch

    def _watch(self, rt: ResourceType, ns: str, name: str, query: dict[str, str]) -> None:
        api = self.server.api
        field_selector = query.get("fieldSelector") or ""
        if name:
            field_selector = ",".join(filter(None, [field_selector, f"metadata.name={name}"]))
        predicate = make_filter(query.get("labelSelector"), field_selector, rt)
        rv_param = query.get("resourceVersion") or ""
        send_initial = query.get("sendInitialEvents") == "true" or rv_param in ("", "0")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = float(query.get("timeoutSeconds") or 1800)
        as_table = tables.wants_table(self.headers.get("Accept") or "")
        initial: list[Obj] = []
        try:
            with api.store.lock:
                if send_initial:
                    initial, current = api.list_objects(rt, ns, query.get("labelSelector"), field_selector)
                    watcher, backlog = api.watch(rt, ns, current)
                else:
                    try:
                        since = int(rv_param)
                    except ValueError as err:
                        raise e.bad_request(f"invalid resource version: {rv_param}") from err
                    watcher, backlog = api.watch(rt, ns, since)
        except TooOld as err:
            self._start_stream()
            self._write_event({"type": "ERROR", "object": e.gone(str(err)).status()})
            self._end_stream()
            return
        self._start_stream()
        try:
            for obj in initial:
                self._write_event({"type": "ADDED", "object": self._render(rt, obj, as_table)})
            if query.get("sendInitialEvents") == "true" and bookmarks:
                self._write_event(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": rt.kind,
                            "apiVersion": rt.api_version,
                            "metadata": {
                                "resourceVersion": str(api.store.rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )
            for ev in backlog:
                self._send_event(rt, ev, predicate, as_table)
            deadline = time.monotonic() + timeout
            interval = self.server.bookmark_interval
            while not self.server.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = watcher.queue.get(timeout=min(left, interval))
                except queue.Empty:  # idle: has the client gone? else time for a bookmark
                    if self._client_gone():
                        break
                    if bookmarks:
                        with api.store.lock:
                            if watcher.queue.empty():
                                rv = str(api.store.rv)
                            else:
                                continue
                        self._write_event(
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": rt.kind,
                                    "apiVersion": rt.api_version,
                                    "metadata": {"resourceVersion": rv},
                                },
                            }
                        )
                    continue
                if item is None:
                    break
                self._send_event(rt, item, predicate, as_table)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            api.store.unwatch(watcher)

    def _client_gone(self) -> bool:
        """During a watch the client sends nothing, so a readable socket means it closed (EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _render(self, rt: ResourceType, obj: Obj, as_table: bool) -> Obj:
        return tables.table(rt, [obj], obj["metadata"]["resourceVersion"]) if as_table else obj

    def _send_event(self, rt: ResourceType, ev: Event, predicate: Any, as_table: bool) -> None:
        api = self.server.api
        obj = api.present(rt, ev.obj)
        now_match = predicate(obj)
        old_match = ev.old is not None and predicate(api.present(rt, ev.old))
        kind = ev.type
        if ev.type == "MODIFIED":
            if now_match and not old_match:
                kind = "ADDED"
            elif old_match and not now_match:
                kind = "DELETED"
            elif not now_match:
                return
        elif ev.type == "DELETED":
            if not (now_match or old_match):
                return
        elif not now_match:
            return
        self._write_event({"type": kind, "object": self._render(rt, obj, as_table)})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _write_event(self, event: Obj) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
