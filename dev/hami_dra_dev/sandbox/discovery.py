"""Discovery documents: legacy (``/api``, ``/apis``, ``/apis/<g>/<v>``), aggregated (apidiscovery v2 /
v2beta1, which current kubectl asks for first), ``/version`` and a minimal ``/openapi/v3``.

The OpenAPI v3 documents only carry what clients look up in them: for every resource a PATCH
operation tagged with its group/version/kind that accepts the ``fieldValidation`` query
parameter, so ``kubectl apply`` leaves validation to this server (which is strict) instead of
downloading schemas.
"""

from __future__ import annotations

import hashlib
import json

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox.resources import RESOURCE_TYPES, ResourceType, groups, in_group_version

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


def subresources(rt: ResourceType) -> list[str]:
    subs = ["status"] if rt.has_status else []
    if rt.key == "pods":
        subs.append("binding")
    return subs


def resource_list(group: str, version: str) -> Obj:
    """``APIResourceList`` for ``/api/v1`` or ``/apis/<group>/<version>``."""
    out = []
    for rt in in_group_version(group, version):
        entry: Obj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
            "storageVersionHash": hashlib.sha256(rt.storage_key.encode()).hexdigest()[:12],
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        out.append(entry)
        for sub in subresources(rt):
            verbs = ["get", "patch", "update"] if sub == "status" else ["create"]
            kind = "Binding" if sub == "binding" else rt.kind
            out.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}".lstrip("/"),
        "resources": out,
    }


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(name: str, versions: list[str]) -> Obj:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list() -> Obj:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(g, vs) for g, vs in groups().items()],
    }


def api_group(name: str) -> Obj | None:
    versions = groups().get(name)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _aggregated_resource(rt: ResourceType) -> Obj:
    entry: Obj = {
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    subs = []
    for sub in subresources(rt):
        kind = "Binding" if sub == "binding" else rt.kind
        subs.append(
            {
                "subresource": sub,
                "responseKind": {"group": rt.group, "version": rt.version, "kind": kind},
                "verbs": ["get", "patch", "update"] if sub == "status" else ["create"],
            }
        )
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(legacy: bool, version: str) -> Obj:
    """``APIGroupDiscoveryList`` for ``/api`` (legacy=True) or ``/apis``; ``version`` is v2 or v2beta1."""
    items = []
    names = [""] if legacy else list(groups())
    for name in names:
        versions = ["v1"] if legacy else groups()[name]
        items.append(
            {
                "metadata": {"name": name, "creationTimestamp": None},
                "versions": [
                    {
                        "version": v,
                        "freshness": "Current",
                        "resources": [_aggregated_resource(rt) for rt in in_group_version(name, v)],
                    }
                    for v in versions
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def negotiate_aggregated(accept: str) -> str | None:
    """Which aggregated discovery version the client accepts (None = legacy documents)."""
    for part in accept.replace(" ", "").split(","):
        if "g=apidiscovery.k8s.io" in part and "as=APIGroupDiscoveryList" in part:
            if "v=v2;" in part + ";":
                return "v2"
            if "v=v2beta1" in part:
                return "v2beta1"
    return None


def version_info(kube_version: str) -> Obj:
    major, minor = kube_version.split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{major}.{minor}.0-sandbox",
        "gitCommit": "sandbox",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "python",
        "compiler": "python",
        "platform": "linux/amd64",
    }


def _gv_paths() -> dict[str, tuple[str, str]]:
    out = {"api/v1": ("", "v1")}
    for g, versions in groups().items():
        for v in versions:
            out[f"apis/{g}/{v}"] = (g, v)
    return out


def openapi_v3_gv(group: str, version: str) -> Obj:
    paths: Obj = {}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in RESOURCE_TYPES:
        if rt.group != group or rt.version != version:
            continue
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[f"{base}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "requestBody": {
                    "content": {
                        "application/json-patch+json": {"schema": {"type": "object"}},
                        "application/merge-patch+json": {"schema": {"type": "object"}},
                    }
                },
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes sandbox", "version": "v1"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi_v3_root() -> Obj:
    out = {}
    for path, (g, v) in _gv_paths().items():
        digest = (
            hashlib.sha256(json.dumps(openapi_v3_gv(g, v), sort_keys=True).encode()).hexdigest()[:16].upper()
        )
        out[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": out}


def openapi_v3_lookup(path: str) -> Obj | None:
    gv = _gv_paths().get(path.strip("/"))
    return openapi_v3_gv(*gv) if gv else None


#: What kube-apiserver answers /openapi/v2 with when asked for protobuf (kubectl's client validation).
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


def openapi_v2(kube_version: str) -> Obj:
    """An OpenAPI v2 document without definitions.

    kubectl validates a ``kind: List`` (and any object whose server-side field validation it cannot
    confirm) against /openapi/v2 and skips kinds it finds no definition for; the sandbox validates
    every object itself, strictly, so an empty document gives the same outcome as a real one.
    """
    return {
        "swagger": "2.0",
        "info": {"title": "hami-dra sandbox", "version": f"v{kube_version}"},
        "paths": {},
    }


def openapi_v2_protobuf(kube_version: str) -> bytes:
    """:func:`openapi_v2` in gnostic's protobuf encoding.

    Document.swagger is field 1, Document.info field 2 (Info.title 1, Info.version 2).
    """

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    info = field(1, b"hami-dra sandbox") + field(2, f"v{kube_version}".encode())
    return field(1, b"2.0") + field(2, info)
