"""Admission webhooks, called the way kube-apiserver calls them.

For every write the configured Mutating/ValidatingWebhookConfigurations are matched (rules,
``namespaceSelector``, ``objectSelector``), each matching webhook is POSTed an
``admission.k8s.io/v1 AdmissionReview`` over HTTPS trusting only the configuration's
``caBundle``, mutating webhooks' JSON patches are applied in order, and ``failurePolicy``
decides what a failing call means (``Fail``, the default, rejects the request; ``Ignore``
skips the webhook).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import ssl
import urllib.parse
import uuid
from collections.abc import Callable

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.patch import json_patch
from hami_dra_dev.sandbox.resources import ResourceType
from hami_dra_dev.sandbox.selectors import labels_match, selector_from_label_selector

log = logging.getLogger(__name__)

#: Resolves a webhook ``clientConfig.service`` (namespace, name, port) to ``host:port``: the sandbox
#: has no Services, so whoever starts a webhook in-process registers where it listens.
ServiceResolver = Callable[[str, str, int], str | None]


def _rule_matches(rule: Obj, operation: str, rt: ResourceType, subresource: str, namespaced: bool) -> bool:
    ops = rule.get("operations") or []
    if "*" not in ops and operation not in ops:
        return False
    if not any(g in ("*", rt.group) for g in rule.get("apiGroups") or []):
        return False
    if not any(v in ("*", rt.version) for v in rule.get("apiVersions") or []):
        return False
    if not any(_resource_matches(r, rt.plural, subresource) for r in rule.get("resources") or []):
        return False
    scope = rule.get("scope", "*")
    return bool(scope == "*" or (scope == "Namespaced") == namespaced)


def _resource_matches(pattern: str, plural: str, subresource: str) -> bool:
    """``pods`` / ``*`` match main resources only; ``pods/*``, ``*/status``, ``*/*`` match subresources."""
    if pattern == "*/*":
        return True
    if "/" not in pattern:
        return not subresource and pattern in ("*", plural)
    resource, _, sub = pattern.partition("/")
    return bool(subresource) and resource in ("*", plural) and sub in ("*", subresource)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to ``address`` while verifying the certificate for ``server_name``."""

    def __init__(self, address: tuple[str, int], server_name: str, context: ssl.SSLContext, timeout: float):
        super().__init__(server_name, address[1], timeout=timeout, context=context)
        self._address = address
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection(self._address, self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


class Admission:
    """Runs the webhooks stored in the sandbox for one request."""

    def __init__(
        self, list_configs: Callable[[str], list[Obj]], get_namespace: Callable[[str], Obj | None]
    ) -> None:
        self._list_configs = list_configs
        self._get_namespace = get_namespace
        self.service_resolver: ServiceResolver | None = None

    def _matching(
        self, kind: str, operation: str, rt: ResourceType, sub: str, obj: Obj, ns: str
    ) -> list[Obj]:
        out = []
        for config in self._list_configs(kind):
            for hook in config.get("webhooks") or []:
                if not any(
                    _rule_matches(r, operation, rt, sub, rt.namespaced) for r in hook.get("rules") or []
                ):
                    continue
                if not labels_match(selector_from_label_selector(hook.get("objectSelector")), obj):
                    continue
                if rt.namespaced and hook.get("namespaceSelector"):
                    nsobj = self._get_namespace(ns) or {"metadata": {}}
                    if not labels_match(selector_from_label_selector(hook["namespaceSelector"]), nsobj):
                        continue
                out.append(hook)
        return out

    def run(
        self,
        mutating: bool,
        operation: str,
        rt: ResourceType,
        sub: str,
        obj: Obj,
        old: Obj | None,
        namespace: str,
        user: str,
        dry_run: bool,
        warnings: list[str] | None = None,
    ) -> Obj:
        """Call the matching webhooks; return the (possibly patched) object or raise ApiError.

        Webhook ``warnings`` are appended to ``warnings`` (sent back as HTTP ``Warning`` headers).
        """
        kind = "mutatingwebhookconfigurations" if mutating else "validatingwebhookconfigurations"
        subject = obj if operation != "DELETE" else (old or obj)
        for hook in self._matching(kind, operation, rt, sub, subject, namespace):
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": str(uuid.uuid4()),
                    "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                    "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                    "subResource": sub or None,
                    "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                    "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                    "name": subject.get("metadata", {}).get("name", ""),
                    "namespace": namespace or None,
                    "operation": operation,
                    "userInfo": {"username": user, "groups": ["system:masters", "system:authenticated"]},
                    "object": obj if operation != "DELETE" else None,
                    "oldObject": old,
                    "dryRun": dry_run,
                    "options": None,
                },
            }
            try:
                response = self._call(hook, review)
            except ApiError:
                raise
            except Exception as err:  # network, TLS, bad JSON: failurePolicy decides
                if hook.get("failurePolicy", "Fail") == "Ignore":
                    log.warning("webhook %s failed, ignored by failurePolicy: %s", hook.get("name"), err)
                    continue
                raise ApiError(
                    500,
                    "InternalError",
                    f'Internal error occurred: failed calling webhook "{hook.get("name")}": {err}',
                ) from err
            if warnings is not None:
                warnings.extend(str(w) for w in response.get("warnings") or [])
            if not response.get("allowed"):
                result = response.get("status") or {}
                code = result.get("code") or 403
                message = result.get("message") or ""
                raise ApiError(
                    code,
                    result.get("reason") or "Forbidden",
                    f'admission webhook "{hook.get("name")}" denied the request: {message}'.rstrip(": "),
                )
            if mutating and response.get("patch"):
                if response.get("patchType", "JSONPatch") != "JSONPatch":
                    raise ApiError(
                        500,
                        "InternalError",
                        f'webhook "{hook.get("name")}" returned an unsupported patchType',
                    )
                ops = json.loads(base64.b64decode(response["patch"]))
                obj = json_patch(obj, ops)
        return obj

    def _call(self, hook: Obj, review: Obj) -> Obj:
        cfg = hook.get("clientConfig") or {}
        if cfg.get("url"):
            parts = urllib.parse.urlsplit(cfg["url"])
            if parts.scheme != "https" or not parts.hostname:
                raise OSError(f"webhook URL {cfg['url']!r} must be https://host[:port]/path")
            address = (parts.hostname, parts.port or 443)
            server_name, path = parts.hostname, parts.path or "/"
        elif cfg.get("service"):
            svc = cfg["service"]
            namespace, name, port = svc.get("namespace", ""), svc.get("name", ""), int(svc.get("port", 443))
            target = self.service_resolver(namespace, name, port) if self.service_resolver else None
            if target is None:
                raise OSError(f"service {namespace}/{name} is not registered in the sandbox")
            host, _, target_port = target.rpartition(":")
            # Connect where the resolver says, but verify the certificate for the Service's DNS
            # name, as kube-apiserver does.
            address, server_name, path = (
                (host, int(target_port)),
                f"{name}.{namespace}.svc",
                svc.get("path") or "/",
            )
        else:
            raise OSError("webhook has neither clientConfig.url nor clientConfig.service")
        context = ssl.create_default_context()
        if cfg.get("caBundle"):
            context = ssl.create_default_context(cadata=base64.b64decode(cfg["caBundle"]).decode())
        timeout = float(hook.get("timeoutSeconds") or 10)
        conn = _PinnedHTTPSConnection(address, server_name, context, timeout)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(review).encode(),
                headers={"Content-Type": "application/json", "Accept": "application/json"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"webhook answered HTTP {resp.status}")
            body = json.loads(resp.read())
        finally:
            conn.close()
        response: Obj = body.get("response") or {}
        if response.get("uid") != review["request"]["uid"]:
            raise ValueError("webhook response uid does not match the request uid")
        return response
