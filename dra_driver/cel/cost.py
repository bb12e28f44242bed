"""What one selector may cost: a static estimate checked at compile time, and each claim's budget.

kube-scheduler stops a selector at a runtime cost of 1,000,000 cel-go units (cel-go counts them while
it evaluates). cel-cpp, through ``cel-expr-python``, counts nothing and cannot be interrupted; only
its iteration budget (10,000 comprehension steps per evaluation) bounds it, and the Kubernetes
functions (``quantity``, ``semver`` and their members) are Python callbacks at several µs each.
So one legal selector such as ``[0..89].all(x, [0..98].all(y, <quantity comparisons>))`` took
tens of ms per device, and a tenant's few claims held the single planner for minutes (issue 34).

So one evaluation is bounded here by ``estimate_cost``, an upper bound from the text, refused at
compile time above ``MAX_ESTIMATED_COST`` (the claim's CEL compile error, like any selector
error). Every token costs 1, every Kubernetes function call left to Python ``CALLBACK_WEIGHT``
(a Python round trip costs about that many cel-cpp steps); a comprehension multiplies its body by
its range: the number of elements of a list literal, else the iteration budget. An expression the
API server accepted may be refused here when it iterates over more than a few thousand steps of
work (docs/policies.md). ``folding.py`` first takes the common calls out of Python (literal
constructors become constants, comparisons with them string comparisons).

``CostBudget`` bounds one claim over every device and alternative: the Matcher
(``dra_driver/controller/eligibility.py``) charges it each evaluation's estimate.
"""

from __future__ import annotations

import re

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
