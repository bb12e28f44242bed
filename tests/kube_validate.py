"""Shared test helper: validate Kubernetes objects strictly, as the API server would.

Usage from any test; put ``tests/`` on ``sys.path`` first, e.g. in ``tests/<area>/conftest.py``::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

then::

    from kube_validate import assert_valid, resource_slice_problems, KUBERNETES_VERSIONS
    assert_valid(obj)                          # strict schemas of 1.34 and 1.37 + ResourceSlice rules
    assert_valid(obj, versions=("1.36",))

Two layers, because neither alone is enough:

1. ``kubernetes-validate`` in strict mode (unknown fields rejected) against the exact schema
   directory of each Kubernetes version; a version the installed package does not ship fails the
   test instead of silently falling back to an older schema (the package's own behaviour).
2. The JSON schemas only describe field types: ``resource.k8s.io/v1`` ResourceSlice validation
   rules from ``pkg/apis/resource/validation`` (device count, name formats, qualified attribute
   names, exactly-one attribute value, semver, 64-character strings, 32 attributes+capacities,
   capacity request policies, taint effects) are re-implemented in :func:`resource_slice_problems`.

``kubernetes_validate`` is imported only by the functions of layer 1, so that layer 2 also runs
where that package is not installed (``hack/gpu_check.py`` on a bare GPU machine).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

#: The Kubernetes versions this project supports at both ends.
KUBERNETES_VERSIONS: tuple[str, ...] = ("1.34", "1.37")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]|)$")
_SUFFIX = {
    "": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
    "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
    "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


def schema_version(version: str) -> str:
    """The installed schema version for ``major.minor``; fails if the package lacks it."""
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions

    available = [v for v in all_versions() if v.rsplit(".", 1)[0] == version or v == version]
    if not available:
        raise AssertionError(
            f"kubernetes-validate {kubernetes_validate.__version__} ships no schema for Kubernetes {version} "
            f"(has {', '.join(all_versions())}); upgrade kubernetes-validate"
        )
    return available[-1]


def validate_strict(obj: Mapping[str, Any], versions: Iterable[str] = KUBERNETES_VERSIONS) -> None:
    """Strict schema validation for every version; raises AssertionError naming version and path."""
    import kubernetes_validate

    for version in versions:
        exact = schema_version(version)
        try:
            kubernetes_validate.validate(dict(obj), exact, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(part) for part in err.path)
            raise AssertionError(
                f"{_name(obj)} invalid for Kubernetes {version}: {path}: {err.message}"
            ) from None
        except kubernetes_validate.SchemaNotFoundError as err:
            raise AssertionError(f"{_name(obj)}: {err.message}") from None


def _strict_json_schema(schema: Any) -> Any:
    """An OpenAPI structural schema as a JSON Schema that also refuses undeclared fields."""
    if isinstance(schema, list):
        return [_strict_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict_json_schema(value) for key, value in schema.items() if not key.startswith("x-")}
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def validate_custom(obj: Mapping[str, Any]) -> None:
    """Our custom resources against their CRD's ``openAPIV3Schema`` (read by ``jsonschema``)."""
    import jsonschema

    from dra_driver.quota import crd

    schema = _strict_json_schema(crd.schema())
    schema["properties"]["metadata"] = {"type": "object"}
    try:
        jsonschema.validate(dict(obj), schema)
    except jsonschema.ValidationError as err:
        path = ".".join(str(part) for part in err.absolute_path)
        raise AssertionError(f"{_name(obj)} invalid for its CRD: {path}: {err.message}") from None


def assert_valid(obj: Mapping[str, Any], versions: Iterable[str] = KUBERNETES_VERSIONS) -> None:
    """Schema validation plus the API server rules we re-implement for the object's kind."""
    if obj.get("apiVersion") == "gpu.hami.io/v1alpha1" and obj.get("kind") == "GpuQuota":
        validate_custom(obj)
        return
    validate_strict(obj, versions)
    if obj.get("kind") == "ResourceSlice" and obj.get("apiVersion") == "resource.k8s.io/v1":
        problems = resource_slice_problems(obj)
        if problems:
            raise AssertionError(
                f"{_name(obj)} would be rejected by the API server:\n  " + "\n  ".join(problems)
            )


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (string or number) as a Decimal; raises ValueError if malformed."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = match.groups()
    if suffix and suffix[0] in "eE":
        return Decimal(number + suffix)
    return Decimal(number) * Decimal(_SUFFIX[suffix])


def resource_slice_problems(obj: Mapping[str, Any]) -> list[str]:
    """The API server's ResourceSlice rules (validation.go) that JSON schemas cannot express."""
    problems: list[str] = []
    spec = obj.get("spec") or {}
    if not _is_dns_subdomain(spec.get("driver", ""), 63):
        problems.append(f"spec.driver {spec.get('driver')!r}: not a DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    pool_name = pool.get("name", "")
    if (
        not pool_name
        or len(pool_name) > 253
        or not all(_is_dns_subdomain(p, 253) for p in pool_name.split("/"))
    ):
        problems.append(f"spec.pool.name {pool_name!r}: invalid")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        problems.append("spec.pool.resourceSliceCount: must be greater than zero")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        problems.append("spec.pool.generation: must be >= 0")
    selectors = [
        key for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(key)
    ]
    if len(selectors) != 1:
        problems.append(
            f"spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection (got {selectors})"
        )
    devices = spec.get("devices") or []
    limit = 64 if any(d.get("taints") or d.get("consumesCounters") for d in devices) else 128
    if len(devices) > limit:
        problems.append(f"spec.devices: {len(devices)} devices, at most {limit} allowed")
    names: set[str] = set()
    for position, device in enumerate(devices):
        where = f"spec.devices[{position}]"
        name = device.get("name", "")
        if not _DNS_LABEL.match(name) or len(name) > 63:
            problems.append(f"{where}.name {name!r}: not a DNS label")
        if name in names:
            problems.append(f"{where}.name {name!r}: duplicate")
        names.add(name)
        problems.extend(_device_problems(device, where))
    return problems


def _device_problems(device: Mapping[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > 32:
        problems.append(f"{where}: {len(attributes) + len(capacity)} attributes+capacities, at most 32")
    for key, value in attributes.items():
        problems.extend(_qualified_name_problems(key, f"{where}.attributes"))
        set_fields = [field for field in ("int", "bool", "string", "version") if value.get(field) is not None]
        if len(set_fields) != 1:
            problems.append(
                f"{where}.attributes[{key}]: exactly one value must be specified, got {set_fields}"
            )
            continue
        # Go's len(): UTF-8 bytes, not characters.
        if "string" in set_fields and len(value["string"].encode()) > 64:
            problems.append(f"{where}.attributes[{key}].string: longer than 64 bytes")
        if "version" in set_fields and (not _SEMVER.match(value["version"]) or len(value["version"]) > 64):
            problems.append(f"{where}.attributes[{key}].version {value['version']!r}: not semver 2.0.0")
        if "int" in set_fields and (isinstance(value["int"], bool) or not isinstance(value["int"], int)):
            problems.append(f"{where}.attributes[{key}].int: not an integer")
    multi = device.get("allowMultipleAllocations") is True
    for key, entry in capacity.items():
        problems.extend(_qualified_name_problems(key, f"{where}.capacity"))
        try:
            value = parse_quantity(entry["value"])
        except (KeyError, ValueError) as err:
            problems.append(f"{where}.capacity[{key}].value: {err}")
            continue
        policy = entry.get("requestPolicy")
        if policy is None:
            continue
        if not multi:
            problems.append(f"{where}.capacity[{key}].requestPolicy: allowMultipleAllocations must be true")
            continue
        problems.extend(_policy_problems(value, policy, f"{where}.capacity[{key}].requestPolicy"))
    for position, taint in enumerate(device.get("taints") or []):
        if not _is_label_key(taint.get("key", "")):
            problems.append(f"{where}.taints[{position}].key {taint.get('key')!r}: not a label key")
        if taint.get("effect") not in ("NoSchedule", "NoExecute", "None"):
            problems.append(f"{where}.taints[{position}].effect {taint.get('effect')!r}: unsupported")
    if len(device.get("taints") or []) > 4:
        problems.append(f"{where}.taints: more than 4 (the 1.34 limit)")
    return problems


def _policy_problems(value: Decimal, policy: Mapping[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    valid_values = policy.get("validValues")
    valid_range = policy.get("validRange")
    if valid_values and valid_range:
        return [f"{where}: validValues and validRange are mutually exclusive"]
    if not (valid_values or valid_range):
        return problems
    if policy.get("default") is None:
        return [f"{where}.default: required with validValues/validRange"]
    default = parse_quantity(policy["default"])
    if valid_values:
        options = [parse_quantity(v) for v in valid_values]
        if options != sorted(options) or len(options) > 10 or any(o > value for o in options):
            problems.append(f"{where}.validValues: must be ascending, at most 10 and <= capacity")
        if default not in options:
            problems.append(f"{where}.default: not one of validValues")
        return problems
    low = parse_quantity(valid_range["min"])
    high = parse_quantity(valid_range["max"]) if valid_range.get("max") is not None else None
    step = parse_quantity(valid_range["step"]) if valid_range.get("step") is not None else None
    if low > value:
        problems.append(f"{where}.validRange.min: larger than capacity value")
    if default < low:
        problems.append(f"{where}.default: less than min")
    if high is not None:
        if low > high:
            problems.append(f"{where}.validRange.max: less than min")
        if high > value:
            problems.append(f"{where}.validRange.max: larger than capacity value")
        if default > high:
            problems.append(f"{where}.default: more than max")
    if step is not None:
        if step <= 0:
            problems.append(f"{where}.validRange.step: must be greater than zero")
        else:
            if low + step > value:
                problems.append(f"{where}.validRange.step: one step from min exceeds the capacity value")
            if (default - low) % step:
                problems.append(f"{where}.default: not min + n*step")
            if high is not None and (high - low) % step:
                problems.append(f"{where}.validRange.max: not min + n*step")
    return problems


def _qualified_name_problems(name: str, where: str) -> list[str]:
    parts = name.split("/")
    if len(parts) == 1:
        ok = bool(_C_IDENTIFIER.match(name)) and len(name) <= 32
    elif len(parts) == 2:
        ok = _is_dns_subdomain(parts[0], 63) and bool(_C_IDENTIFIER.match(parts[1])) and len(parts[1]) <= 32
    else:
        ok = False
    return [] if ok else [f"{where}[{name}]: not a qualified name (C identifier <= 32, optional domain/)"]


def _is_dns_subdomain(value: str, limit: int) -> bool:
    return bool(value) and len(value) <= limit and all(_DNS_LABEL.match(label) for label in value.split("."))


def _is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and not _is_dns_subdomain(prefix, 253):
        return False
    return bool(name) and len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{metadata.get('name') or metadata.get('generateName') or '?'}"
