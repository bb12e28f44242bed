"""Kubernetes resource quantities (``1000Mi``, ``16Gi``, ``0.2G``, ``500m``, ``1e9``) as exact numbers.

One grammar for the whole project: ``resource.ParseQuantity``'s, kept as exact fractions so that
``200M == 0.2G`` and ``40Gi == 40960Mi``. The CEL ``quantity`` library, the sandbox's validation and
byte counts (DRA memory capacities and requests) all parse through :func:`parse_quantity`;
:func:`parse_bytes` adds the whole-number-of-bytes rule and messages that say what a valid value
looks like. Amounts read from API objects written by others (a claim's ``consumedCapacity``, a
device's capacity) go through :func:`optional_quantity` and its whole-number roundings
:func:`ceil_quantity` / :func:`floor_quantity`, which say "absent or not a quantity" with None.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

MIB = 1024 * 1024
GIB = 1024 * MIB

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$")
#: Larger exponents are refused rather than computed: ``1e999999`` would take seconds to expand.
_MAX_EXPONENT = 1000


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity (or not a whole number of bytes)."""


def parse_quantity(value: str | int) -> Fraction:
    """``resource.ParseQuantity`` as an exact fraction; errors carry Kubernetes' messages."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise QuantityError(f"expected a quantity, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    return _parse_text(value)


@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """The text grammar, cached: slices and claims repeat a few spellings (``80Gi``, ``100``, ``1``)
    tens of thousands of times, and a Fraction is immutable, so one parse serves them all."""
    match = _QUANTITY.match(value)
    if not value or match is None:
        raise QuantityError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number, suffix = match.groups()
    amount = Fraction(int(number)) if number.isdigit() else Fraction(number)
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount * _DECIMAL[suffix]
    exponent = _EXPONENT.match(suffix)
    if exponent is not None and abs(int(exponent.group(1))) <= _MAX_EXPONENT:
        return amount * Fraction(10) ** int(exponent.group(1))
    raise QuantityError("unable to parse quantity's suffix")


def optional_quantity(value: object) -> Fraction | None:
    """A quantity read from an object someone else wrote: None when absent or not a quantity.

    Other values are read as their text, as Kubernetes reads a JSON number where a quantity goes.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        return parse_quantity(value if isinstance(value, int) else str(value))
    except QuantityError:
        return None


def ceil_quantity(value: object) -> int | None:
    """:func:`optional_quantity` rounded up to a whole number (``500m`` -> 1, ``1.5Ki`` -> 1536)."""
    amount = optional_quantity(value)
    return None if amount is None else math.ceil(amount)


def floor_quantity(value: object) -> int | None:
    """:func:`optional_quantity` rounded down to a whole number (``1500m`` -> 1)."""
    amount = optional_quantity(value)
    return None if amount is None else math.floor(amount)


def parse_bytes(value: str | int) -> int:
    """Parse a quantity into a whole number of bytes.

    Integers are taken as bytes, as Kubernetes does; fractional byte counts are rejected rather
    than silently rounded, because a rounded memory limit is a different limit.
    """
    try:
        amount = parse_quantity(value.strip() if isinstance(value, str) else value)
    except QuantityError:
        raise QuantityError(f"{value!r} is not a quantity; use forms such as 1000Mi, 16Gi or 80G") from None
    if amount < 0:
        raise QuantityError(f"quantity must not be negative, got {value!r}")
    if amount.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number of bytes")
    return amount.numerator


def format_bytes(value: int) -> str:
    """Render bytes in the largest binary unit that divides them exactly (``1000Mi``, ``80Gi``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
