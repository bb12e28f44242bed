"""Validation the way kube-apiserver does it: schema first, then the hand-written rules.

Schema: every object is checked against the strict OpenAPI schema of the Kubernetes version the
sandbox reports (``kubernetes-validate``'s bundled schemas; validators are built once per kind
because loading them costs far more than validating). Unknown fields are a 400 "strict decoding
error" and schema violations a 422 with field paths.

Rules: object metadata (names, labels), and the ``resource.k8s.io/v1`` rules from
``pkg/apis/resource/validation`` that a schema cannot express: exactly-one-of fields, name
formats, uniqueness, limits, references between requests, immutability, and the status rules
(allocation immutable once set, ``reservedFor`` only with an allocation).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from fractions import Fraction
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import referencing
from kubernetes_validate import utils as kv_utils

from dra_driver.sandbox import errors as e
from dra_driver.sandbox.errors import ApiError, FieldError
from dra_driver.sandbox.pod_rules import validate_pod, validate_pod_update
from dra_driver.sandbox.resources import ResourceType

Obj = dict[str, Any]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_SUFFIX: dict[str, int | Fraction] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes quantity as an exact number, or None when it is not a valid quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    m = QUANTITY.match(value)
    if not m:
        return None
    suffix = m.group(2) or ""
    number = Fraction(m.group(1))
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


# --------------------------------------------------------------------------------------------- schema


class SchemaValidator:
    """Strict schema validation against one Kubernetes version, with validators cached per kind."""

    def __init__(self, kube_version: str) -> None:
        self.kube_version = kube_version
        versions = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= kube_version]
        self._schema_version = versions[-1] if versions else kv_utils.latest_version()
        self._dir = f"kubernetes-json-schema/v{self._schema_version}-local-strict"
        self._lock = threading.Lock()
        self._registry: referencing.Registry[Any] | None = None
        self._validators: dict[tuple[str, str], Any] = {}

    def _validator(self, rt: ResourceType) -> Any:
        key = (rt.api_version, rt.kind)
        with self._lock:
            if key in self._validators:
                return self._validators[key]
            api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", rt.api_version)
            try:
                schema = kv_utils.schema_contents(
                    f"{self._dir}/{rt.kind.lower()}-{api}.json", self.kube_version
                )
            except FileNotFoundError:
                self._validators[key] = None
                return None
            if self._registry is None:
                defs = kv_utils.schema_contents(f"{self._dir}/_definitions.json", self.kube_version)
                self._registry = referencing.Resource.from_contents(defs) @ referencing.Registry()
            registry = referencing.Resource.from_contents(schema) @ self._registry
            validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
            self._validators[key] = validator
            return validator

    def check(self, rt: ResourceType, obj: Obj) -> None:
        validator = self._validator(rt)
        if validator is None:
            return
        name = obj.get("metadata", {}).get("name", "")
        unknown: list[str] = []
        field_errors: list[FieldError] = []
        for err in sorted(validator.iter_errors(obj), key=lambda x: list(map(str, x.absolute_path))):
            path = _path(err.absolute_path)
            if err.validator == "additionalProperties":
                for extra in re.findall(r"'([^']+)'", err.message.split("(")[-1]):
                    unknown.append(f"{path}.{extra}" if path else extra)
            elif err.validator == "required":
                missing = re.findall(r"'([^']+)' is a required property", err.message)
                field_errors.append(
                    e.required(f"{path}.{missing[0]}" if missing and path else path or "<root>")
                )
            else:
                field_errors.append(e.invalid(path or "<root>", err.instance, err.message))
        if unknown:
            raise e.bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown)
            )
        if field_errors:
            raise e.invalid_object(rt, name, field_errors)


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --------------------------------------------------------------------------------------------- helpers


class Errors(list[FieldError]):
    """Collects field errors; small helpers keep the rules below one line each."""

    def dns_label(self, path: str, value: Any) -> None:
        if not isinstance(value, str) or len(value) > 63 or not DNS_LABEL.match(value):
            self.append(
                e.invalid(
                    path,
                    value,
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-', and must start and end with an alphanumeric character",
                )
            )

    def dns_subdomain(self, path: str, value: Any, limit: int = 253) -> None:
        if not isinstance(value, str) or len(value) > limit or not DNS_SUBDOMAIN.match(value):
            self.append(
                e.invalid(
                    path,
                    value,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric character",
                )
            )

    def qualified_name(self, path: str, value: Any, fully: bool = False) -> None:
        ok = isinstance(value, str)
        if ok:
            domain, _, ident = value.rpartition("/")
            if fully and not domain:
                self.append(
                    e.required(
                        path, "a fully qualified name must be a domain and a name separated by a slash"
                    )
                )
                return
            ok = bool(C_IDENTIFIER.match(ident)) and len(ident) <= 32
            if domain:
                ok = ok and len(domain) <= 63 and bool(DNS_SUBDOMAIN.match(domain))
        if not ok:
            self.append(
                e.invalid(
                    path,
                    value,
                    "must be a C identifier (at most 32 characters) optionally prefixed "
                    "by a DNS subdomain (at most 63 characters) and a slash",
                )
            )

    def unique(self, path: str, values: list[Any]) -> None:
        seen: set[str] = set()
        for i, v in enumerate(values):
            key = json.dumps(v, sort_keys=True)
            if key in seen:
                self.append(e.duplicate(f"{path}[{i}]", v))
            seen.add(key)

    def max_items(self, path: str, values: list[Any] | None, limit: int) -> None:
        if values and len(values) > limit:
            self.append(e.too_many(path, len(values), limit))


def _one_of(
    errs: Errors, path: str, obj: Obj, keys: tuple[str, ...], *, allow_none: bool = False
) -> str | None:
    present = [k for k in keys if obj.get(k) is not None]
    if len(present) > 1:
        errs.append(
            e.forbidden(
                path, f"exactly one of `{'`, `'.join(keys)}` is required, but multiple fields are set"
            )
        )
    elif not present and not allow_none:
        errs.append(e.required(path, f"exactly one of `{'`, `'.join(keys)}` is required"))
    return present[0] if len(present) == 1 else None


# --------------------------------------------------------------------------------------------- metadata


def validate_metadata(rt: ResourceType, obj: Obj, errs: Errors) -> None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        errs.append(e.required("metadata.name", "name or generateName is required"))
    elif rt.plural in ("namespaces",):
        errs.dns_label("metadata.name", name)
    else:
        errs.dns_subdomain("metadata.name", name)
    if rt.namespaced and not meta.get("namespace"):
        errs.append(e.required("metadata.namespace"))
    for kind in ("labels", "annotations"):
        for key, value in (meta.get(kind) or {}).items():
            prefix, _, short = key.rpartition("/")
            if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or not (
                len(short) <= 63 and LABEL_NAME.match(short)
            ):
                errs.append(
                    e.invalid(
                        f"metadata.{kind}",
                        key,
                        "name part must consist of alphanumeric characters, "
                        "'-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
            if kind == "labels" and value and (len(value) > 63 or not LABEL_NAME.match(value)):
                errs.append(
                    e.invalid(
                        "metadata.labels",
                        value,
                        "a valid label must be an empty string or consist "
                        "of alphanumeric characters, '-', '_' or '.'",
                    )
                )
    errs.unique("metadata.finalizers", meta.get("finalizers") or [])
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(f):
                errs.append(e.required(f"metadata.ownerReferences[{i}].{f}"))
    if sum(1 for r in meta.get("ownerReferences") or [] if r.get("controller")) > 1:
        errs.append(
            e.invalid(
                "metadata.ownerReferences",
                meta["ownerReferences"],
                "Only one reference can have Controller set to true",
            )
        )


# ------------------------------------------------------------------------------------- resource.k8s.io


def _selectors(errs: Errors, path: str, selectors: list[Obj] | None) -> None:
    errs.max_items(path, selectors, 32)
    for i, sel in enumerate(selectors or []):
        cel = (sel.get("cel") or {}).get("expression")
        if not cel:
            errs.append(e.required(f"{path}[{i}].cel.expression"))
        elif len(cel) > 10 * 1024:
            errs.append(
                e.FieldError(
                    "FieldValueTooLong", f"{path}[{i}].cel.expression", "must have at most 10240 bytes"
                )
            )


def _opaque(errs: Errors, path: str, opaque: Obj | None) -> None:
    if opaque is None:
        errs.append(e.required(path))
        return
    errs.dns_subdomain(f"{path}.driver", opaque.get("driver"), 63)
    params = opaque.get("parameters")
    if params is None:
        errs.append(e.required(f"{path}.parameters"))
    elif not isinstance(params, dict):
        errs.append(e.invalid(f"{path}.parameters", params, "parameters must be a valid JSON object"))
    elif len(json.dumps(params)) > 10 * 1024:
        errs.append(e.FieldError("FieldValueTooLong", f"{path}.parameters", "must have at most 10240 bytes"))


def _device_request_fields(errs: Errors, path: str, req: Obj, *, sub: bool) -> None:
    errs.dns_subdomain(f"{path}.deviceClassName", req.get("deviceClassName"))
    _selectors(errs, f"{path}.selectors", req.get("selectors"))
    mode = req.get("allocationMode", "ExactCount")
    if mode == "ExactCount":
        if req.get("count", 1) <= 0:
            errs.append(e.invalid(f"{path}.count", req.get("count"), "must be greater than zero"))
    elif mode == "All":
        if req.get("count") is not None:
            errs.append(
                e.invalid(f"{path}.count", req["count"], "must not be specified when allocationMode is 'All'")
            )
    else:
        errs.append(e.not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"]))
    errs.max_items(f"{path}.tolerations", req.get("tolerations"), 16)
    for key, qty in ((req.get("capacity") or {}).get("requests") or {}).items():
        errs.qualified_name(f"{path}.capacity.requests[{key}]", key)
        if parse_quantity(qty) is None:
            errs.append(e.invalid(f"{path}.capacity.requests[{key}]", qty, "must be a quantity"))


def validate_claim_spec(errs: Errors, path: str, spec: Obj) -> None:
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or []
    errs.max_items(f"{path}.devices.requests", requests, 32)
    names: dict[str, set[str]] = {}
    for i, req in enumerate(requests):
        rp = f"{path}.devices.requests[{i}]"
        errs.dns_label(f"{rp}.name", req.get("name"))
        if req.get("name") in names:
            errs.append(e.duplicate(f"{rp}.name", req.get("name")))
        subs: set[str] = set()
        which = _one_of(errs, rp, req, ("exactly", "firstAvailable"))
        if which == "exactly":
            _device_request_fields(errs, f"{rp}.exactly", req["exactly"], sub=False)
        elif which == "firstAvailable":
            errs.max_items(f"{rp}.firstAvailable", req["firstAvailable"], 8)
            for j, sub in enumerate(req["firstAvailable"]):
                sp = f"{rp}.firstAvailable[{j}]"
                errs.dns_label(f"{sp}.name", sub.get("name"))
                if sub.get("name") in subs:
                    errs.append(e.duplicate(f"{sp}.name", sub.get("name")))
                subs.add(sub.get("name", ""))
                _device_request_fields(errs, sp, sub, sub=True)
        names[req.get("name", "")] = subs

    def check_refs(p: str, refs: list[str] | None) -> None:
        for k, ref in enumerate(refs or []):
            base, _, subname = ref.partition("/")
            if base not in names or (subname and subname not in names[base]):
                errs.append(
                    e.invalid(
                        f"{p}[{k}]",
                        ref,
                        "must be the name of a request in the claim or the name of "
                        "a request and a subrequest separated by '/'",
                    )
                )
        errs.unique(p, list(refs or []))

    errs.max_items(f"{path}.devices.constraints", devices.get("constraints"), 32)
    for i, con in enumerate(devices.get("constraints") or []):
        cp = f"{path}.devices.constraints[{i}]"
        check_refs(f"{cp}.requests", con.get("requests"))
        which = _one_of(errs, cp, con, ("matchAttribute", "distinctAttribute"))
        if which:
            errs.qualified_name(f"{cp}.{which}", con[which], fully=True)
    errs.max_items(f"{path}.devices.config", devices.get("config"), 32)
    for i, cfg in enumerate(devices.get("config") or []):
        check_refs(f"{path}.devices.config[{i}].requests", cfg.get("requests"))
        _opaque(errs, f"{path}.devices.config[{i}].opaque", cfg.get("opaque"))


def _device(errs: Errors, path: str, dev: Obj, per_device_nodes: bool) -> None:
    errs.dns_label(f"{path}.name", dev.get("name"))
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    if len(attrs) + len(caps) > 32:
        errs.append(e.too_many(f"{path}.attributes", len(attrs) + len(caps), 32))
    for key, attr in attrs.items():
        ap = f"{path}.attributes[{key}]"
        errs.qualified_name(ap, key)
        which = _one_of(errs, ap, attr, ("int", "bool", "string", "version"))
        if which in ("string", "version") and len(attr[which]) > 64:
            errs.append(e.FieldError("FieldValueTooLong", f"{ap}.{which}", "may not be more than 64 bytes"))
        if which == "version" and not SEMVER.match(attr["version"]):
            errs.append(
                e.invalid(
                    f"{ap}.version", attr["version"], "must be a string compatible with semver.org spec 2.0.0"
                )
            )
    multi = dev.get("allowMultipleAllocations") is True
    for key, cap in caps.items():
        cp = f"{path}.capacity[{key}]"
        errs.qualified_name(cp, key)
        value = parse_quantity(cap.get("value"))
        if value is None:
            errs.append(e.required(f"{cp}.value"))
            continue
        policy = cap.get("requestPolicy")
        if policy is None:
            continue
        if not multi:
            errs.append(
                e.forbidden(f"{cp}.requestPolicy", "allowed only when allowMultipleAllocations is true")
            )
            continue
        if policy.get("validValues") is not None and policy.get("validRange") is not None:
            errs.append(
                e.forbidden(
                    f"{cp}.requestPolicy",
                    "exactly one policy can be specified, cannot specify "
                    "`validValues` and `validRange` at the same time",
                )
            )
        default = parse_quantity(policy["default"]) if "default" in policy else None
        if default is not None and default > value:
            errs.append(
                e.invalid(
                    f"{cp}.requestPolicy.default",
                    policy["default"],
                    "must be less than or equal to capacity value",
                )
            )
        if (vv := policy.get("validValues")) is not None:
            nums = [parse_quantity(v) for v in vv]
            errs.max_items(f"{cp}.requestPolicy.validValues", vv, 10)
            if any(n is None for n in nums) or nums != sorted(set(n for n in nums if n is not None)):
                errs.append(
                    e.invalid(
                        f"{cp}.requestPolicy.validValues",
                        vv,
                        "values must be sorted in ascending order and unique",
                    )
                )
            elif default is not None and default not in nums:
                errs.append(
                    e.invalid(
                        f"{cp}.requestPolicy.default",
                        policy["default"],
                        "default value must be one of the validValues",
                    )
                )
        if (vr := policy.get("validRange")) is not None:
            lo = parse_quantity(vr.get("min"))
            hi = parse_quantity(vr["max"]) if "max" in vr else None
            step = parse_quantity(vr["step"]) if "step" in vr else None
            if lo is None:
                errs.append(e.required(f"{cp}.requestPolicy.validRange.min"))
            elif lo > value:
                errs.append(
                    e.invalid(
                        f"{cp}.requestPolicy.validRange.min",
                        vr["min"],
                        "min must be less than or equal to capacity value",
                    )
                )
            if hi is not None and (hi > value or (lo is not None and hi < lo)):
                errs.append(
                    e.invalid(
                        f"{cp}.requestPolicy.validRange.max",
                        vr["max"],
                        "max must be between min and capacity value",
                    )
                )
            if step is not None and step <= 0:
                errs.append(
                    e.invalid(f"{cp}.requestPolicy.validRange.step", vr["step"], "step must be positive")
                )
            if default is not None and lo is not None and (default < lo or (hi is not None and default > hi)):
                errs.append(
                    e.invalid(
                        f"{cp}.requestPolicy.default",
                        policy["default"],
                        "default value must be within the validRange",
                    )
                )
    taints = dev.get("taints") or []
    errs.max_items(f"{path}.taints", taints, 16)
    for i, taint in enumerate(taints):
        if taint.get("effect") not in ("NoSchedule", "NoExecute", "None"):
            errs.append(
                e.not_supported(
                    f"{path}.taints[{i}].effect", taint.get("effect"), ["NoExecute", "NoSchedule", "None"]
                )
            )
    node_fields = ("nodeName", "nodeSelector", "allNodes")
    if per_device_nodes:
        _one_of(errs, path, dev, node_fields)
    else:
        for f in node_fields:
            if dev.get(f) is not None:
                errs.append(e.forbidden(f"{path}.{f}", "only allowed when perDeviceNodeSelection is true"))


def validate_slice(errs: Errors, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    errs.dns_subdomain("spec.driver", spec.get("driver"), 63)
    pool = spec.get("pool") or {}
    pool_name = pool.get("name")
    if not pool_name:
        errs.append(e.required("spec.pool.name"))
    elif len(pool_name) > 253 or not all(DNS_SUBDOMAIN.match(p) for p in pool_name.split("/")):
        errs.append(
            e.invalid("spec.pool.name", pool_name, "must be one or more DNS sub-domains separated by slashes")
        )
    if pool.get("generation", 0) < 0:
        errs.append(
            e.invalid("spec.pool.generation", pool.get("generation"), "must be greater than or equal to 0")
        )
    if pool.get("resourceSliceCount", 0) <= 0:
        errs.append(
            e.invalid(
                "spec.pool.resourceSliceCount", pool.get("resourceSliceCount"), "must be greater than zero"
            )
        )
    which = _one_of(errs, "spec", spec, ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"))
    if which == "nodeName":
        errs.dns_subdomain("spec.nodeName", spec["nodeName"])
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(flag) is False:
            errs.append(e.invalid(f"spec.{flag}", False, "must be either unset or set to true"))
    if which == "nodeSelector" and len(spec["nodeSelector"].get("nodeSelectorTerms") or []) != 1:
        errs.append(
            e.invalid(
                "spec.nodeSelector.nodeSelectorTerms",
                spec["nodeSelector"].get("nodeSelectorTerms"),
                "must have exactly one node selector term",
            )
        )
    devices = spec.get("devices") or []
    heavy = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    errs.max_items("spec.devices", devices, 64 if heavy else 128)
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        _device(errs, f"spec.devices[{i}]", dev, spec.get("perDeviceNodeSelection") is True)
        if dev.get("name") in seen:
            errs.append(e.duplicate(f"spec.devices[{i}].name", dev.get("name")))
        seen.add(dev.get("name", ""))
    if spec.get("sharedCounters") and devices:
        errs.append(e.forbidden("spec", "only one of devices and sharedCounters can be set"))


def validate_slice_update(errs: Errors, new: Obj, old: Obj) -> None:
    for path in (("driver",), ("pool", "name"), ("nodeName",)):
        a, b = _dig(new["spec"], path), _dig(old["spec"], path)
        if a != b:
            errs.append(e.invalid("spec." + ".".join(path), a, "field is immutable"))


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


def validate_claim_status(errs: Errors, new: Obj, old: Obj | None) -> None:
    status = new.get("status") or {}
    old_status = (old or {}).get("status") or {}
    alloc = status.get("allocation")
    reserved = status.get("reservedFor") or []
    if reserved and alloc is None:
        errs.append(e.forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
    errs.max_items("status.reservedFor", reserved, 256)
    errs.unique("status.reservedFor", [r.get("uid") for r in reserved])
    for i, ref in enumerate(reserved):
        if not ref.get("resource"):
            errs.append(e.required(f"status.reservedFor[{i}].resource"))
        if not ref.get("name"):
            errs.append(e.required(f"status.reservedFor[{i}].name"))
        if not ref.get("uid"):
            errs.append(e.required(f"status.reservedFor[{i}].uid"))
    if old is not None and new.get("metadata", {}).get("deletionTimestamp"):
        old_uids = {r.get("uid") for r in old_status.get("reservedFor") or []}
        if any(r.get("uid") not in old_uids for r in reserved):
            errs.append(
                e.forbidden(
                    "status.reservedFor",
                    "new entries may not be added while `deallocationRequested` "
                    "or `deletionTimestamp` are set",
                )
            )
    old_alloc = old_status.get("allocation")
    if old_alloc is not None and alloc is not None:
        if alloc != old_alloc:
            errs.append(e.invalid("status.allocation", alloc, "field is immutable"))
    elif alloc is not None:
        _allocation(errs, alloc, new.get("spec") or {})
    results = ((alloc or {}).get("devices") or {}).get("results") or []
    keys = {(r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")) for r in results}
    for i, dev in enumerate(status.get("devices") or []):
        key = (dev.get("driver"), dev.get("pool"), dev.get("device"), dev.get("shareID"))
        if key not in keys:
            errs.append(
                e.invalid(
                    f"status.devices[{i}]", dev.get("device"), "must be an allocated device in the claim"
                )
            )


def _allocation(errs: Errors, alloc: Obj, spec: Obj) -> None:
    names: dict[str, set[str]] = {}
    for req in (spec.get("devices") or {}).get("requests") or []:
        names[req.get("name", "")] = {s.get("name", "") for s in req.get("firstAvailable") or []}
    devices = alloc.get("devices") or {}
    results = devices.get("results") or []
    errs.max_items("status.allocation.devices.results", results, 32)
    for i, res in enumerate(results):
        rp = f"status.allocation.devices.results[{i}]"
        base, _, sub = (res.get("request") or "").partition("/")
        if base not in names or (sub and sub not in names[base]) or (not sub and names.get(base)):
            errs.append(
                e.invalid(
                    f"{rp}.request",
                    res.get("request"),
                    "must be the name of a request in the claim "
                    "or the name of a request and a subrequest separated by '/'",
                )
            )
        errs.dns_subdomain(f"{rp}.driver", res.get("driver"), 63)
        pool = res.get("pool") or ""
        if not pool or len(pool) > 253 or not all(DNS_SUBDOMAIN.match(p) for p in pool.split("/")):
            errs.append(
                e.invalid(f"{rp}.pool", pool, "must be one or more DNS sub-domains separated by slashes")
            )
        errs.dns_label(f"{rp}.device", res.get("device"))
        if (share := res.get("shareID")) is not None:
            try:
                uuid.UUID(share)
            except (ValueError, TypeError, AttributeError):
                errs.append(e.invalid(f"{rp}.shareID", share, "must be a valid UUID"))
        for key, qty in (res.get("consumedCapacity") or {}).items():
            errs.qualified_name(f"{rp}.consumedCapacity[{key}]", key)
            if parse_quantity(qty) is None:
                errs.append(e.invalid(f"{rp}.consumedCapacity[{key}]", qty, "must be a quantity"))
    configs = devices.get("config") or []
    errs.max_items("status.allocation.devices.config", configs, 64)
    for i, cfg in enumerate(configs):
        cp = f"status.allocation.devices.config[{i}]"
        if cfg.get("source") not in ("FromClass", "FromClaim"):
            errs.append(e.not_supported(f"{cp}.source", cfg.get("source"), ["FromClaim", "FromClass"]))
        _opaque(errs, f"{cp}.opaque", cfg.get("opaque"))
    if (sel := alloc.get("nodeSelector")) is not None and not sel.get("nodeSelectorTerms"):
        errs.append(e.required("status.allocation.nodeSelector.nodeSelectorTerms"))


def validate_device_class(errs: Errors, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    _selectors(errs, "spec.selectors", spec.get("selectors"))
    errs.max_items("spec.config", spec.get("config"), 32)
    for i, cfg in enumerate(spec.get("config") or []):
        _opaque(errs, f"spec.config[{i}].opaque", cfg.get("opaque"))


# --------------------------------------------------------------------------------------------- entry points


class Validator:
    """All validation for one sandbox (one Kubernetes version)."""

    def __init__(self, kube_version: str) -> None:
        self.schema = SchemaValidator(kube_version)

    def validate(self, rt: ResourceType, obj: Obj, old: Obj | None, *, status_only: bool = False) -> None:
        """Raise ApiError (400/422) when ``obj`` (replacing ``old``, if any) is not acceptable."""
        self.schema.check(rt, obj)
        errs = Errors()
        validate_metadata(rt, obj, errs)
        if old is not None:
            new_fin = set(obj["metadata"].get("finalizers") or [])
            old_fin = set(old["metadata"].get("finalizers") or [])
            if old["metadata"].get("deletionTimestamp") and new_fin - old_fin:
                errs.append(
                    e.forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being "
                        "deleted, found new finalizers " + json.dumps(sorted(new_fin - old_fin)),
                    )
                )
            if rt.immutable_spec and obj.get("spec") != old.get("spec"):
                errs.append(e.invalid("spec", obj.get("spec"), "field is immutable"))
        key = rt.key
        if key == "resourceslices.resource.k8s.io":
            validate_slice(errs, obj)
            if old is not None:
                validate_slice_update(errs, obj, old)
        elif key == "resourceclaims.resource.k8s.io":
            if old is None or not status_only:
                validate_claim_spec(errs, "spec", obj.get("spec") or {})
            validate_claim_status(errs, obj, old)
        elif key == "resourceclaimtemplates.resource.k8s.io":
            validate_claim_spec(errs, "spec.spec", (obj.get("spec") or {}).get("spec") or {})
        elif key == "deviceclasses.resource.k8s.io":
            validate_device_class(errs, obj)
        elif key == "pods" and not status_only:
            validate_pod(obj, errs)
            if old is not None:
                validate_pod_update(obj, old, errs)
        if errs:
            raise e.invalid_object(rt, obj.get("metadata", {}).get("name", ""), list(errs))


__all__ = ["ApiError", "Validator", "parse_quantity"]
