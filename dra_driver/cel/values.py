"""Kubernetes' ``semver`` and ``quantity`` value semantics in pure Python (no CEL runtime here).

Semver follows blang/semver ``Parse`` (strict, build metadata ignored for comparison and
equality) and Kubernetes' ``normalizeAndParse`` for ``semver(s, true)``. Quantities follow
``resource.ParseQuantity`` and are kept as exact fractions, so ``quantity("200M") ==
quantity("0.2G")`` and ``quantity("40Gi") == quantity("40960Mi")``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from dra_driver import quantity

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_NUMERIC = re.compile(r"^(0|[1-9][0-9]*)$")
_IDENT = re.compile(r"^[0-9A-Za-z-]+$")


class ValueParseError(ValueError):
    """A string is not a valid semver or quantity; the message is the one Kubernetes gives."""


@dataclass(frozen=True, slots=True)
class SemverValue:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def compare(self, other: SemverValue) -> int:
        """Semver 2.0 precedence: -1, 0 or 1."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for left, right in zip(self.pre, other.pre, strict=False):
            if left == right:
                continue
            left_num, right_num = left.isdigit(), right.isdigit()
            if left_num and right_num:
                return -1 if int(left) < int(right) else 1
            if left_num != right_num:
                return -1 if left_num else 1
            return -1 if left < right else 1
        return -1 if len(self.pre) < len(other.pre) else 1


def _number(part: str, what: str) -> int:
    if not part:
        raise ValueParseError(f"{what} number is empty")
    if not part.isdigit() or not part.isascii():
        raise ValueParseError(f"Invalid character(s) found in {what} number {part!r}")
    if len(part) > 1 and part[0] == "0":
        raise ValueParseError(f"{what} number must not contain leading zeroes {part!r}")
    return int(part)


def parse_semver(text: str) -> SemverValue:
    """blang/semver ``Parse``: ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``, no leading zeros."""
    if not text:
        raise ValueParseError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueParseError("No Major.Minor.Patch elements found")
    major = _number(parts[0], "Major")
    minor = _number(parts[1], "Minor")
    rest = parts[2]
    build = ""
    if "+" in rest:
        rest, build = rest.split("+", 1)
    pre_text = ""
    if "-" in rest:
        rest, pre_text = rest.split("-", 1)
    patch = _number(rest, "Patch")
    pre: tuple[str, ...] = ()
    if pre_text or text.split("+", 1)[0].endswith("-"):
        pre = tuple(pre_text.split("."))
        for ident in pre:
            if not ident:
                raise ValueParseError("Prerelease is empty")
            if not _IDENT.match(ident):
                raise ValueParseError(f"Invalid character(s) found in prerelease {ident!r}")
            if ident.isdigit() and len(ident) > 1 and ident[0] == "0":
                raise ValueParseError(f"Numeric PreRelease version must not contain leading zeroes {ident!r}")
    if build:
        for ident in build.split("."):
            if not ident or not _IDENT.match(ident):
                raise ValueParseError(f"Invalid character(s) found in build meta data {ident!r}")
    return SemverValue(major, minor, patch, pre)


def parse_semver_normalized(text: str) -> SemverValue:
    """Kubernetes' ``normalizeAndParse``: drop ``v``, drop leading zeros, pad to three parts."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for position, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[position] = stripped
    if len(parts) < 3:
        if any(char in parts[-1] for char in "+-"):
            raise ValueParseError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse_semver(".".join(parts))


def parse_quantity(text: str) -> Fraction:
    """``resource.ParseQuantity`` as an exact fraction; raises with Kubernetes' message."""
    try:
        return quantity.parse_quantity(text)
    except quantity.QuantityError as err:
        raise ValueParseError(str(err)) from None


def quantity_as_integer(value: Fraction) -> int:
    """``asInteger()``: an int64, or an error for fractions and overflow (Kubernetes' wording)."""
    if value.denominator != 1 or not INT64_MIN <= value.numerator <= INT64_MAX:
        raise ValueParseError("cannot convert value to integer")
    return value.numerator


# --- order-preserving keys: comparisons that stay in cel-cpp --------------------------------------
#: Decimal exponents a quantity key can hold (Kubernetes quantities are far inside this).
_EXPONENT_OFFSET = 500_000


def _decimal_digits(value: Fraction) -> tuple[str, int]:
    """``value`` (> 0, a terminating decimal) as significant digits and exponent: 0.<digits> x 10^e."""
    scale = 0
    while value.denominator != 1:
        value *= 10
        scale += 1
        if scale > 10_000:  # not a terminating decimal: no quantity parses to one
            raise ValueParseError("quantity is not a terminating decimal")
    digits = str(value.numerator)
    stripped = digits.rstrip("0")
    return stripped, len(digits) - scale


def quantity_key(value: Fraction) -> str:
    """A string whose lexicographic order is the numeric order of quantities (``Q`` first).

    Positive: ``2`` + exponent (offset, fixed width) + significant digits; zero: ``1``; negative:
    ``0`` + the complements of both, ended by ``~`` so that a longer run of digits sorts first.
    """
    if value == 0:
        return "Q1"
    digits, exponent = _decimal_digits(abs(value))
    if value > 0:
        return f"Q2{exponent + _EXPONENT_OFFSET:07d}{digits}"
    complement = "".join(str(9 - int(digit)) for digit in digits)
    return f"Q0{_EXPONENT_OFFSET - exponent:07d}{complement}~"


def semver_key(value: SemverValue) -> str:
    """A string whose lexicographic order is semver precedence (``S`` first).

    Major, minor and patch fixed-width; a release (no prerelease) ends in ``~``, above any
    prerelease, which follows as ``!`` + identifiers separated by ``!`` (below every identifier
    character, so a shorter list of equal identifiers sorts first); a numeric identifier is ``0``
    + its length (fixed width) + digits, below any alphanumeric one, ``1`` + the identifier.
    """
    core = f"S{value.major:020d}{value.minor:020d}{value.patch:020d}"
    if not value.pre:
        return core + "~"
    parts = [f"0{len(ident):04d}{ident}" if ident.isdigit() else f"1{ident}" for ident in value.pre]
    return core + "!" + "!".join(parts)
