"""Kubernetes' quantity/semver calls on literals, rewritten so cel-cpp evaluates them itself.

Every Kubernetes function is a Python callback from cel-cpp (``env.py``), about 25 µs with its
proto conversions: ``[0..89].all(x, [0..98].all(y, m.compareTo(quantity("1Gi")) >= 0))`` made
17,820 of them per device (issue 34). After the original text has been type-checked:

* ``quantity("40Gi")``, ``semver("1.2.3")`` (and ``semver(s, true)``), ``isQuantity("..")`` and
  ``isSemver("..")`` of a string literal become message or bool literals, parsed once here;
* ``<device attribute or capacity>.compareTo(<literal>)``, ``.isGreaterThan(..)`` and
  ``.isLessThan(..)`` become comparisons of the value's order-preserving key (``qkey``/``skey``,
  ``values.quantity_key``/``semver_key``) with the literal's: string comparisons in cel-cpp. A value
  of the other type has no such field, so a mix still fails at run time, as the overload would.

Anything else (a literal that does not parse, comparisons of two device values, ``add``, ``sign``,
...) is left to the callbacks, which ``cost.estimate_cost`` weighs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from dra_driver.cel.values import (
    ValueParseError,
    parse_quantity,
    parse_semver,
    parse_semver_normalized,
    quantity_key,
    semver_key,
)

_FOLDABLE = re.compile(r"(?<![\w.])(quantity|isQuantity|semver|isSemver)\s*\(\s*$")
_AFTER = re.compile(r"\s*(?:,\s*(true|false)\s*)?\)")
_PLAIN_LITERAL = re.compile(r'"([^"\\\n]*)"|\'([^\'\\\n]*)\'')
_NAME = r'(?:\.\s*[A-Za-z_]\w*|\[\s*"[^"\\\n]*"\s*\])'
_COMPARISON = re.compile(
    r'(?<![\w.])(device\s*\.\s*(?:capacity|attributes)\s*\[\s*"[^"\\\n]*"\s*\]\s*' + _NAME + r")"
    r"\s*\.\s*(compareTo|isGreaterThan|isLessThan)\s*\(\s*"
    r'\(kubernetes\.(Quantity|Semver)\{[^{}"]*(?:"[^"\\\n]*"[^{}"]*)*\}\)\s*\)'
)
_KEY = re.compile(r'[qs]key: "([^"]*)"')


def _quantity_literal(value: str) -> str:
    amount = parse_quantity(value)
    key = quantity_key(amount)
    return f'kubernetes.Quantity{{num: "{amount.numerator}", den: "{amount.denominator}", qkey: "{key}"}}'


def _semver_literal(value: str, normalize: bool) -> str:
    parsed = parse_semver_normalized(value) if normalize else parse_semver(value)
    pre = ", ".join(f'"{ident}"' for ident in parsed.pre)
    fields = f"major: {parsed.major}, minor: {parsed.minor}, patch: {parsed.patch}, pre: [{pre}]"
    return f'kubernetes.Semver{{{fields}, skey: "{semver_key(parsed)}"}}'


def _valid(parse: Callable[[str], object], value: str) -> str:
    try:
        parse(value)
    except ValueParseError:
        return "false"
    return "true"


def fold_literals(text: str, masked: str) -> str:
    """``quantity("1Gi")`` -> ``(kubernetes.Quantity{...})`` etc.; ``masked`` is ``text`` with string
    literals blanked (same length). A literal that does not parse is left for the runtime error."""
    edits: list[tuple[int, int, str]] = []
    for literal in _PLAIN_LITERAL.finditer(text):
        start, end = literal.span()
        if masked[start] not in "\"'" or masked[start + 1 : end].strip():
            continue  # inside another literal, or not a literal of its own
        call = _FOLDABLE.search(masked, 0, start)
        after = _AFTER.match(masked, end)
        if call is None or after is None:
            continue
        value = literal.group(1) if literal.group(1) is not None else literal.group(2)
        name, flag = call.group(1), after.group(1)
        if flag is not None and name in ("quantity", "isQuantity"):
            continue  # not an overload: the checker already refused it
        normalize = flag == "true"
        try:
            if name == "quantity":
                replacement = _quantity_literal(value)
            elif name == "semver":
                replacement = _semver_literal(value, normalize)
            elif name == "isQuantity":
                replacement = _valid(parse_quantity, value)
            else:
                replacement = _valid(parse_semver_normalized if normalize else parse_semver, value)
        except ValueParseError:
            continue
        edits.append((call.start(), after.end(), f"({replacement})"))
    return _apply(text, edits)


def native_comparisons(text: str, masked: str) -> str:
    """``<device value>.isGreaterThan((kubernetes.Quantity{.. qkey: "K"}))`` -> ``(<value>.qkey > "K")``
    (after ``fold_literals``; ``masked`` is ``text`` with string literals blanked)."""
    edits: list[tuple[int, int, str]] = []
    for match in _COMPARISON.finditer(text):
        if masked[match.start()] != "d":
            continue  # inside a string literal
        key = _KEY.search(match.group(0), match.end(1) - match.start())
        if key is None:
            continue
        value, method = match.group(1), match.group(2)
        field = f"{value}.{'qkey' if match.group(3) == 'Quantity' else 'skey'}"
        literal = f'"{key.group(1)}"'
        if method == "isGreaterThan":
            replacement = f"({field} > {literal})"
        elif method == "isLessThan":
            replacement = f"({field} < {literal})"
        else:
            replacement = f"({field} < {literal} ? -1 : ({field} > {literal} ? 1 : 0))"
        edits.append((match.start(), match.end(), replacement))
    return _apply(text, edits)


def fold(text: str, mask: Callable[[str], str]) -> str:
    """Both rewrites; ``mask`` blanks string literals (``selectors._mask_strings``)."""
    folded = fold_literals(text, mask(text))
    return native_comparisons(folded, mask(folded))


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for begin, stop, replacement in reversed(edits):
        text = text[:begin] + replacement + text[stop:]
    return text
