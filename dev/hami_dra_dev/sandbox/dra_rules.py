"""The ``resource.k8s.io/v1`` rules of ``pkg/apis/resource/validation`` that a schema cannot express.

Exactly-one-of fields, name formats, uniqueness, limits (resource.k8s.io/v1 validation), references
between requests, immutable fields, and the status rules: ``status.allocation`` is immutable once
set (it may only be cleared), ``reservedFor`` needs an allocation, allocation results must name
requests of the claim, ``status.devices`` must name allocated devices.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.fieldcheck import DNS_SUBDOMAIN, SEMVER, Errors, one_of, parse_quantity


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
        which = one_of(errs, rp, req, ("exactly", "firstAvailable"))
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
        which = one_of(errs, cp, con, ("matchAttribute", "distinctAttribute"))
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
        which = one_of(errs, ap, attr, ("int", "bool", "string", "version"))
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
        one_of(errs, path, dev, node_fields)
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
    which = one_of(errs, "spec", spec, ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"))
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
