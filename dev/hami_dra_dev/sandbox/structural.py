"""Validation of custom resources against their CRD's structural schema, as kube-apiserver does it.

The subset our CRDs use (``dra_driver/quota/crd.py``): types, ``properties``/``required``,
``minProperties``, ``items``/``maxItems``, string lengths and ``pattern``, ``minimum``,
``x-kubernetes-int-or-string`` (an integer or a string; a pattern applies to strings only and
a minimum to numbers only, as in the real server) and set-typed lists. A field the
schema does not declare is an unknown field (kubectl's strict field validation, the sandbox's
only mode); everything else is a 422 with the field path and the real server's wording.
"""

from __future__ import annotations

import re
from typing import Any

from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.errors import FieldError

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = _TYPES.get(kind)
    return expected is None or isinstance(value, expected)


def _go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else ("object" if isinstance(value, dict) else "null")


def validate(
    schema: dict[str, Any], value: Any, path: str, unknown: list[str], errors: list[FieldError]
) -> None:
    """Collect ``unknown`` field paths and field ``errors`` of ``value`` at ``path``."""
    label = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        if not _type_ok("integer", value) and not isinstance(value, str):
            errors.append(
                e.invalid(
                    label, value, f'{label} in body must be of type integer or string: "{_go_type(value)}"'
                )
            )
            return
    elif "type" in schema and not _type_ok(schema["type"], value):
        errors.append(
            e.invalid(label, value, f'{label} in body must be of type {schema["type"]}: "{_go_type(value)}"')
        )
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        for name in schema.get("required") or ():
            if name not in value:
                errors.append(e.required(f"{path}.{name}" if path else name))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errors.append(
                e.invalid(
                    label,
                    len(value),
                    f"{label} in body should have at least {schema['minProperties']} properties",
                )
            )
        for name, item in value.items():
            child = f"{path}.{name}" if path else name
            if properties is not None and name in properties:
                validate(properties[name], item, child, unknown, errors)
            elif isinstance(schema.get("additionalProperties"), dict):
                validate(schema["additionalProperties"], item, child, unknown, errors)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                unknown.append(child)
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(e.too_many(label, len(value), schema["maxItems"]))
        if schema.get("x-kubernetes-list-type") == "set":
            seen: list[Any] = []
            for index, item in enumerate(value):
                if item in seen:
                    errors.append(e.duplicate(f"{label}[{index}]", item))
                seen.append(item)
        for index, item in enumerate(value):
            validate(schema.get("items") or {}, item, f"{label}[{index}]", unknown, errors)
    elif isinstance(value, str):
        pattern = schema.get("pattern")
        if pattern and re.search(pattern, value) is None:
            errors.append(e.invalid(label, value, f"{label} in body should match '{pattern}'"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(e.too_long(label, schema["maxLength"]))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                e.invalid(
                    label, value, f"{label} in body should be at least {schema['minLength']} chars long"
                )
            )
    elif _type_ok("number", value):
        minimum = schema.get("minimum")
        if minimum is not None and value < minimum:
            errors.append(
                e.invalid(label, value, f"{label} in body should be greater than or equal to {minimum}")
            )
