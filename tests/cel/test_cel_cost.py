"""What one selector and one claim may cost (issue 34): a static estimate refused at compile time,
literal constructors folded into constants, and the per-claim budget."""

from __future__ import annotations

import pytest

from dra_driver.cel import CostBudget, SelectorBudgetError, SelectorError, compile_selector, evaluate
from dra_driver.cel import env as celenv
from dra_driver.cel.cost import (
    CALLBACK_WEIGHT,
    ITERATION_BUDGET,
    MAX_ESTIMATED_COST,
    estimate_cost,
)
from dra_driver.cel.folding import fold, fold_literals, native_comparisons
from dra_driver.cel.selectors import _mask_strings, device_input, selectors_match

GPU = device_input(
    "gpu.hami.io",
    {
        "name": "gpu-0",
        "attributes": {"driverVersion": {"version": "550.54.15"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "16Gi"}},
    },
)
MEMORY = 'device.capacity["gpu.hami.io"].memory'


def listed(count: int) -> str:
    return "[" + ", ".join(str(i) for i in range(count)) + "]"


#: The attack of issue 34: legal for the API server, tens of ms per device on cel-cpp.
ATTACK = (
    f'{listed(90)}.all(x, {listed(99)}.all(y, {MEMORY}.compareTo(quantity("1Gi")) >= 0'
    f' && !{MEMORY}.isLessThan(quantity("2Gi"))))'
)


def test_the_estimate_multiplies_a_comprehension_body_by_its_list_literal() -> None:
    body = "x + 1 > 0"  # 5 tokens
    assert estimate_cost(body) == 5
    small = estimate_cost(f"{listed(3)}.all(x, {body})")
    large = estimate_cost(f"{listed(30)}.all(x, {body})")
    # 27 more elements: each one body (with its "x," 7 tokens), and ", n" listed
    assert large - small == 27 * 7 + 27 * 2
    nested = estimate_cost(f"{listed(10)}.all(x, {listed(10)}.all(y, {body}))")
    assert nested >= 100 * 5


def test_an_unknown_range_counts_as_the_iteration_budget_and_callbacks_weigh_more() -> None:
    over_attribute = estimate_cost('device.attributes["d"].name.split("").all(c, c == "a")')
    assert over_attribute >= ITERATION_BUDGET * 3
    one_call = estimate_cost(f"{MEMORY}.isInteger()")
    no_call = estimate_cost(f"{MEMORY}.size()")
    assert one_call - no_call == CALLBACK_WEIGHT - 1


def test_a_selector_whose_estimate_passes_the_limit_is_a_compile_error() -> None:
    compiled = compile_selector(ATTACK)
    assert compiled.program is None
    assert compiled.error is not None and "exceeds the limit 250,000 per device" in compiled.error
    with pytest.raises(SelectorError, match=r"claim ns/c: selector #0: CEL compile error: estimated cost"):
        selectors_match("claim ns/c", [ATTACK], GPU)


def test_plain_selectors_and_small_comprehensions_stay_well_under_the_limit() -> None:
    for expression in (
        f'{MEMORY}.compareTo(quantity("8Gi")) >= 0',
        '["1.0.0", "2.0.0"].exists(v, device.attributes["gpu.hami.io"].driverVersion'
        ".isGreaterThan(semver(v)))",
        f"{listed(90)}.all(x, {listed(99)}.all(y, x + y >= 0))",
    ):
        compiled = compile_selector(expression)
        assert compiled.error is None, compiled.error
        assert 0 < compiled.estimated_cost <= MAX_ESTIMATED_COST
        assert evaluate(expression, GPU) is True


def test_literal_constructors_are_folded_into_constants_that_compare_like_the_functions() -> None:
    text = 'quantity("40Gi") == quantity("40960Mi") && semver("1.2.3-rc.1") != semver("v1.2", true)'
    folded = fold_literals(text, _mask_strings(text))
    assert "quantity(" not in folded and "semver(" not in folded
    assert 'kubernetes.Quantity{num: "42949672960", den: "1", qkey: "' in folded
    assert 'pre: ["rc", "1"]' in folded
    env = celenv.new_env()
    assert env.compile(folded).eval(GPU.activation()).value() is True
    checks = 'isQuantity("1Gi") && !isQuantity("1Gx") && isSemver("1.0.0") && !isSemver("1.0")'
    assert fold_literals(checks, _mask_strings(checks)) == "(true) && !(false) && (true) && !(false)"


def test_folding_leaves_invalid_literals_variables_and_string_contents_alone() -> None:
    for text in (
        'quantity("not a quantity")',  # the runtime error stays the function's own
        "quantity(name)",
        '"quantity(\\"1Gi\\")" == "x"',
        'device.attributes["d"].quantity("1")',
    ):
        assert fold_literals(text, _mask_strings(text)) == text
    with pytest.raises(Exception, match="quantities must match the regular expression"):
        evaluate('sign(quantity("not a quantity")) == 1', GPU)


def test_a_claim_budget_refuses_the_evaluation_that_would_pass_it_with_the_selectors_error() -> None:
    expression = f"{listed(90)}.all(x, {listed(99)}.all(y, x + y >= 0))"
    cost = compile_selector(expression).estimated_cost
    budget = CostBudget(limit=cost * 2)
    assert selectors_match("claim ns/c", [expression], GPU, budget)
    assert selectors_match("claim ns/c", [expression], GPU, budget)
    assert budget.spent == cost * 2 and budget.evaluations == 2
    with pytest.raises(SelectorBudgetError) as caught:
        selectors_match("claim ns/c", ["true", expression], GPU, budget)
    message = str(caught.value)
    assert message.startswith("claim ns/c: selector #0: CEL runtime error: cost budget exhausted")
    assert "use cheaper selectors or fewer alternatives" in message
    assert budget.evaluations == 2  # the evaluation that would pass the budget was not made


@pytest.mark.parametrize(
    "expression",
    [
        f'{MEMORY}.compareTo(quantity("8Gi")) >= 0',
        f'{MEMORY}.isGreaterThan(quantity("16383Mi")) && {MEMORY}.isLessThan(quantity("16385Mi"))',
        'device.attributes["gpu.hami.io"].driverVersion.isGreaterThan(semver("535.104.5"))',
        'device.attributes["gpu.hami.io"]["driverVersion"].compareTo(semver("v550.54", true)) == 1',
    ],
)
def test_comparisons_with_literals_run_in_cel_cpp_without_a_python_callback(
    expression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    compare = celenv._compare
    monkeypatch.setattr(celenv, "_compare", lambda *args: calls.append(args) or compare(*args))
    monkeypatch.setattr(celenv, "_parse_quantity_cached", lambda *_: pytest.fail("quantity() called"))
    rewritten = fold(expression, _mask_strings)
    assert "compareTo" not in rewritten and "isGreaterThan" not in rewritten and "key" in rewritten
    assert evaluate(expression, GPU) is True
    assert not calls


def test_a_comparison_of_the_wrong_type_still_fails_at_run_time() -> None:
    expression = 'device.attributes["gpu.hami.io"].driverVersion.isGreaterThan(quantity("1"))'
    assert "qkey" in native_comparisons(*_folded(expression))
    with pytest.raises(SelectorError, match="CEL runtime error"):
        selectors_match("claim ns/c", [expression], GPU)


def test_comparisons_inside_strings_or_between_two_device_values_are_left_to_the_functions() -> None:
    for text in (
        f'"{MEMORY}.compareTo(quantity(1))" == ""',
        f"{MEMORY}.compareTo({MEMORY}) == 0",
    ):
        assert native_comparisons(*_folded(text)) == fold_literals(text, _mask_strings(text))
    assert evaluate(f"{MEMORY}.compareTo({MEMORY}) == 0", GPU) is True


def _folded(text: str) -> tuple[str, str]:
    folded = fold_literals(text, _mask_strings(text))
    return folded, _mask_strings(folded)
