"""API errors rendered exactly as Kubernetes renders them (``kind: Status``).

Clients branch on ``code`` and ``reason`` (client-go's ``IsConflict``, the Python client's
``ApiException.status``), and humans read ``message``; both must look like a real API server's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hami_dra_dev.sandbox.resources import ResourceType


@dataclass(frozen=True)
class FieldError:
    """One validation failure at a field path (apimachinery ``field.Error``)."""

    type: str  # FieldValueInvalid, FieldValueRequired, FieldValueForbidden, ...
    field: str
    detail: str = ""
    value: Any = None
    has_value: bool = False

    @property
    def message(self) -> str:
        prefix = {
            "FieldValueInvalid": "Invalid value",
            "FieldValueRequired": "Required value",
            "FieldValueForbidden": "Forbidden",
            "FieldValueNotSupported": "Unsupported value",
            "FieldValueDuplicate": "Duplicate value",
            "FieldValueTooMany": "Too many",
            "FieldValueTooLong": "Too long",
        }.get(self.type, self.type)
        text = prefix
        if self.has_value:
            text += f": {json.dumps(self.value, sort_keys=True)}"
        if self.detail:
            text += f": {self.detail}"
        return text


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, detail, value, True)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, detail)


def not_supported(path: str, value: Any, allowed: list[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(a) for a in allowed)
    return FieldError("FieldValueNotSupported", path, detail, value, True)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", path, "", value, True)


def too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError("FieldValueTooMany", path, f"must have at most {limit} items", actual, True)


def too_long(path: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", path, f"may not be more than {limit} bytes")


class ApiError(Exception):
    """An error response; ``status()`` is the ``metav1.Status`` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    return {"name": name, "group": rt.group, "kind": rt.plural}


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified_resource} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{rt.qualified_resource} "{name}" already exists', _details(rt, name)
    )


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {rt.qualified_resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(rt, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid_object(rt: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid with causes, worded like ``apierrors.NewInvalid``."""
    if len(errors) == 1:
        summary = f"{errors[0].field}: {errors[0].message}"
    else:
        summary = "[" + ", ".join(f"{e.field}: {e.message}" for e in errors) + "]"
    causes = [{"reason": e.type, "message": e.message, "field": e.field} for e in errors]
    details = {"name": name, "group": rt.group, "kind": rt.kind, "causes": causes}
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")


def not_served(group: str, version: str, plural: str | None) -> ApiError:
    """404 for a resource a real API server has but the sandbox does not: say so, and what to use."""
    from hami_dra_dev.sandbox.resources import RESOURCE_TYPES

    gv = f"{group}/{version}" if group else version
    what = f"{plural} ({gv})" if plural else f"the API group version {gv}"
    served = ", ".join(sorted(r.key for r in RESOURCE_TYPES))
    return ApiError(
        404,
        "NotFound",
        f"the server could not find the requested resource: the sandbox API server does not serve {what}; "
        f"it serves only what the driver uses ({served}); for a real API server run 'hami-dra cluster up'",
    )
