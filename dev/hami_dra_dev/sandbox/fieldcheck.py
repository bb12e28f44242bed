"""Field-level checks shared by the validation rules: name formats, quantities, an error collector.

The regular expressions and limits are apimachinery's (``validation.IsDNS1123Label`` and friends),
so a name the sandbox accepts is one a real API server accepts.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from dra_driver import quantity
from dra_driver.kube.api import Obj
from dra_driver.quantity import QuantityError
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.errors import FieldError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes quantity as an exact number, or None when it is not a valid quantity."""
    try:
        return quantity.parse_quantity(value)
    except QuantityError:
        return None


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


def one_of(
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
