"""What one selector may cost: a static estimate checked at compile time, and the literals folded.

kube-scheduler stops a selector at a runtime cost of 1,000,000 cel-go units (cel-go counts them while
it evaluates). cel-cpp, through ``cel-expr-python``, counts nothing and cannot be interrupted; only
its iteration budget (10,000 comprehension steps per evaluation) bounds it, and the Kubernetes
functions (``quantity``, ``semver`` and their members) are Python callbacks at several µs each.
So one legal selector such as ``[0..89].all(x, [0..98].all(y, <quantity comparisons>))`` took
tens of ms per device, and a tenant's few claims held the single planner for minutes (issue 34).

Two things keep one evaluation cheap here:

* ``estimate_cost``: an upper bound from the text, refused at compile time above
  ``MAX_ESTIMATED_COST`` (reported as the claim's CEL compile error, like any selector error).
  Every token costs 1, every Kubernetes function call ``CALLBACK_WEIGHT`` (a Python round trip costs
  about that many cel-cpp steps); a comprehension multiplies its body by its range: the number of
  elements of a list literal, else the iteration budget. An expression the API server accepted
  may be refused here when it iterates over more than a few thousand steps of work;
  docs/policies.md says so.
* ``fold_literals``: ``quantity("40Gi")``, ``semver("1.2.3")``, ``isQuantity(..)`` and
  ``isSemver(..)`` of a string literal become message or bool literals, built once at compile time,
  so the common ``x.compareTo(quantity("40Gi"))`` makes one callback, not two.

The per-claim budget over all devices is the Matcher's (``dra_driver/controller/eligibility.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from dra_driver.cel.values import ValueParseError, parse_quantity, parse_semver, parse_semver_normalized

#: cel-cpp's comprehension iteration budget per evaluation (measured: 9,999 steps pass, 10,000 fail).
ITERATION_BUDGET = 10_000
#: What one Kubernetes function call weighs against one token: a Python callback with its proto
#: conversions costs about 25 µs (measured, 990 calls in 29 ms), cel-cpp about 0.1 µs per token.
CALLBACK_WEIGHT = 250
#: The most one evaluation (one selector, one device) may cost: about 25 ms of the planner's CPU
#: (kube-scheduler allows 1,000,000 of cel-go's units, which run in a fraction of that time).
MAX_ESTIMATED_COST = 250_000

_MACRO = re.compile(
    r"\.\s*(?:all|exists_one|exists|map|filter|transformList|transformMapEntry|transformMap)\s*\("
)
_CALLBACK = re.compile(
    r"(?<![\w.])(?:quantity|isQuantity|semver|isSemver|sign)\s*\("
    r"|\.\s*(?:isGreaterThan|isLessThan|compareTo|major|minor|patch|isInteger|asInteger"
    r"|asApproximateFloat|add|sub)\s*\("
)
_TOKEN = re.compile(r"\w+|[^\s\w]")
_OPEN, _CLOSE = "([{", ")]}"


def _matching(text: str, start: int, step: int) -> int:
    """The index of the bracket matching the one at ``start`` (searching by ``step``), or -1."""
    depth = 0
    position = start
    while 0 <= position < len(text):
        char = text[position]
        if char in _OPEN:
            depth += step
        elif char in _CLOSE:
            depth -= step
        if depth == 0:
            return position
        position += step
    return -1


def _range_size(text: str, dot: int) -> int:
    """Iterations of the comprehension whose ``.macro(`` starts at ``dot``: a list literal's size."""
    end = len(text[:dot].rstrip()) - 1
    if end < 0 or text[end] != "]":
        return ITERATION_BUDGET
    start = _matching(text, end, -1)
    before = text[:start].rstrip() if start >= 0 else ""
    if start < 0 or (before and (before[-1].isalnum() or before[-1] in "_])?")):
        return ITERATION_BUDGET  # an index (m[k]), not a literal: the range is not known here
    inner = text[start + 1 : end]
    if not inner.strip():
        return 0
    elements, depth = 1, 0
    for char in inner:
        depth += (char in _OPEN) - (char in _CLOSE)
        elements += char == "," and depth == 0
    return min(ITERATION_BUDGET, elements - (inner.rstrip().endswith(",")))


def _flat_cost(text: str) -> int:
    return len(_TOKEN.findall(text)) + (CALLBACK_WEIGHT - 1) * len(_CALLBACK.findall(text))


def _span_cost(text: str, start: int, end: int) -> int:
    cost, position = 0, start
    while True:
        macro = _MACRO.search(text, position, end)
        if macro is None:
            return cost + _flat_cost(text[position:end])
        close = _matching(text, macro.end() - 1, 1)
        if close < 0 or close > end:
            return cost + ITERATION_BUDGET * _flat_cost(text[position:end])  # unbalanced: assume the worst
        cost += _flat_cost(text[position : macro.end()])
        cost += max(1, _range_size(text, macro.start())) * _span_cost(text, macro.end(), close)
        position = close


def estimate_cost(masked: str) -> int:
    """An upper bound of one evaluation's work, from the text with string literals blanked."""
    return _span_cost(masked, 0, len(masked))


# --- literal folding -----------------------------------------------------------------------------
_FOLDABLE = re.compile(r"(?<![\w.])(quantity|isQuantity|semver|isSemver)\s*\(\s*$")
_AFTER = re.compile(r"\s*(?:,\s*(true|false)\s*)?\)")
_PLAIN_LITERAL = re.compile(r'"([^"\\\n]*)"|\'([^\'\\\n]*)\'')


def _quantity_literal(value: str) -> str:
    amount = parse_quantity(value)
    return f'kubernetes.Quantity{{num: "{amount.numerator}", den: "{amount.denominator}"}}'


def _semver_literal(value: str, normalize: bool) -> str:
    parsed = parse_semver_normalized(value) if normalize else parse_semver(value)
    pre = ", ".join(f'"{ident}"' for ident in parsed.pre)
    fields = f"major: {parsed.major}, minor: {parsed.minor}, patch: {parsed.patch}, pre: [{pre}]"
    return f"kubernetes.Semver{{{fields}}}"


def _valid(parse: Callable[[str], object], value: str) -> str:
    try:
        parse(value)
    except ValueParseError:
        return "false"
    return "true"


def fold_literals(text: str, masked: str) -> str:
    """``quantity("1Gi")`` -> ``kubernetes.Quantity{...}`` etc.; ``masked`` is ``text`` with string
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
    for begin, stop, replacement in reversed(edits):
        text = text[:begin] + replacement + text[stop:]
    return text


# --- the per-claim budget ------------------------------------------------------------------------
#: What one claim's selectors may cost in one plan, over every device and alternative they are
#: evaluated on: about one second of the planner's CPU by the estimate's calibration. A claim with
#: a plain selector over 40,000 devices spends under 1,000,000.
CLAIM_COST_BUDGET = 10_000_000


class BudgetExhausted(RuntimeError):
    """A claim's selectors cost more than their budget; the message says how to fix it."""


class CostBudget:
    """The cost one claim's selectors may still spend; each evaluation is charged its estimate
    before it runs, so the evaluation that would pass the budget is never made."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = CLAIM_COST_BUDGET if limit is None else limit
        self.spent = 0
        self.evaluations = 0

    def spend(self, units: int) -> None:
        if self.spent + units > self.limit:
            raise BudgetExhausted(
                f"cost budget exhausted: the claim's selectors would cost more than {self.limit:,} "
                f"(estimated) over the devices they are evaluated on ({self.spent:,} spent in "
                f"{self.evaluations:,} evaluations); use cheaper selectors or fewer alternatives"
            )
        self.spent += units
        self.evaluations += 1
