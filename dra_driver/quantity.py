"""Kubernetes resource quantities (``1000Mi``, ``16Gi``, ``80G``, ``1.5Gi``) as exact integers.

Memory in DRA capacities and claim requests is a quantity in bytes. We parse it ourselves
(instead of ``kubernetes.utils.parse_quantity``) to keep the engine-side code free of the client
and to produce errors that say what a valid value looks like.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MIB = 1024 * 1024
GIB = 1024 * MIB

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^\s*([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)\s*([KMGTPE]i|[kMGTPE]|)\s*$")


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity (or not a whole number of bytes)."""


def parse_bytes(value: str | int) -> int:
    """Parse a quantity into a whole number of bytes.

    Integers are taken as bytes, as Kubernetes does; fractional byte counts are rejected rather
    than silently rounded, because a rounded memory limit is a different limit.
    """
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as 1000Mi or 16Gi, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"quantity must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as 1000Mi or 16Gi, got {value!r}")
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity; use forms such as 1000Mi, 16Gi or 80G")
    number, suffix = match.groups()
    try:
        amount = Decimal(number) * (_BINARY.get(suffix) or _DECIMAL[suffix])
    except InvalidOperation as err:  # pragma: no cover - the regex already guarantees a number
        raise QuantityError(f"{value!r} is not a quantity") from err
    if amount < 0:
        raise QuantityError(f"quantity must not be negative, got {value!r}")
    if amount != amount.to_integral_value():
        raise QuantityError(f"{value!r} is not a whole number of bytes")
    return int(amount)


def format_bytes(value: int) -> str:
    """Render bytes in the largest binary unit that divides them exactly (``1000Mi``, ``80Gi``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
