"""CEL selectors against Kubernetes' DRA semantics (the cases of reference/cel-for-dra.md)."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest

from dra_driver.cel import (
    CelCompileError,
    CelRuntimeError,
    SelectorError,
    check_expression,
    compile_selector,
    device_input,
    evaluate,
    rewrite_missing_domains,
    selectors_match,
)
from dra_driver.cel.values import (
    ValueParseError,
    parse_quantity,
    parse_semver,
    parse_semver_normalized,
)

DRIVER = "gpu.hami.io"
ERROR = "ERROR"

GPU0 = device_input(
    DRIVER,
    {
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "driverVersion": {"version": "550.54.15"},
            "index": {"int": 0},
            "mig": {"bool": False},
            "resource.kubernetes.io/numaNode": {"int": 0},
        },
        "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
        "allowMultipleAllocations": True,
    },
)
GPU1 = device_input(
    DRIVER,
    {
        "name": "gpu-1",
        "attributes": {
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "driverVersion": {"version": "535.104.5"},
            "index": {"int": 1},
            "mig": {"bool": True},
            "resource.kubernetes.io/numaNode": {"int": 1},
        },
        "capacity": {"memory": {"value": "40960Mi"}, "cores": {"value": "100"}},
    },
)
ACC0 = device_input(
    "accel.example.com",
    {"name": "acc-0", "attributes": {"model": {"string": "X1"}}, "capacity": {"mem": {"value": "8Gi"}}},
)

D = 'device.attributes["gpu.hami.io"]'
C = 'device.capacity["gpu.hami.io"]'
R = 'device.attributes["resource.kubernetes.io"]'

# (expression, gpu-0, gpu-1, acc-0): expected results worked out from Kubernetes semantics.
CASES: list[tuple[str, Any, Any, Any]] = [
    ('device.driver == "gpu.hami.io"', True, True, False),
    (f"{D}.index == 1", False, True, ERROR),
    (f'{D}.productName.startsWith("NVIDIA H100")', True, False, ERROR),
    (f'{D}.driverVersion.isGreaterThan(semver("540.0.0"))', True, False, ERROR),
    (f'{C}.memory.compareTo(quantity("40Gi")) > 0', True, False, ERROR),
    (f'"mig" in {D} && !{D}.mig', True, False, False),
    (f"{R}.numaNode == 0", True, False, ERROR),
    (f'{D}.productName.endsWith("40GB") || {D}.productName.contains("H100")', True, True, ERROR),
    (f'{D}.productName.matches("^NVIDIA (A|H)100")', True, True, ERROR),
    (
        f"{D}.driverVersion.major() == 535 && {D}.driverVersion.minor() == 104"
        f" && {D}.driverVersion.patch() == 5",
        False,
        True,
        ERROR,
    ),
    (
        f'{D}.driverVersion.compareTo(semver("v535.104", true)) >= 0'
        f' && {D}.driverVersion.isLessThan(semver("600.0.0"))',
        True,
        True,
        ERROR,
    ),
    (
        f'{C}.memory.isGreaterThan(quantity("50Gi")) && {C}.memory.asInteger() > 0'
        f" && {C}.memory.asApproximateFloat() > 1.0",
        True,
        False,
        ERROR,
    ),
    (
        f'{C}.memory.add(quantity("1Gi")).sub(1).compareTo(quantity("41Gi")) < 0'
        f' && sign({C}.cores) == 1 && isQuantity("1Gi") && isSemver("1.2.3")',
        False,
        True,
        ERROR,
    ),
    (f'"gpu.hami.io" in device.attributes && {D}.index >= 0', True, True, False),
    (f"has({R}.numaNode)", True, True, False),
    (
        f'cel.bind(gpu, {D}, gpu.index == 0 && gpu.productName.lowerAscii().contains("h100"))',
        True,
        False,
        ERROR,
    ),
    (f'{C}.memory == quantity("81920Mi") && quantity("200M") == quantity("0.2G")', True, False, ERROR),
    (f"{D}.?nonexistent.orValue(7) == 7 && {D}[?'index'].hasValue()", True, True, False),
    (f'{D}.productName.split(" ").size() >= 2 && {D}.productName.indexOf("A100") > 0', False, True, ERROR),
]


@pytest.mark.parametrize(("expression", "gpu0", "gpu1", "acc0"), CASES)
def test_expression_agrees_with_kubernetes(expression: str, gpu0: Any, gpu1: Any, acc0: Any) -> None:
    for device, expected in ((GPU0, gpu0), (GPU1, gpu1), (ACC0, acc0)):
        if expected == ERROR:
            with pytest.raises(CelRuntimeError):
                evaluate(expression, device)
        else:
            assert evaluate(expression, device) is expected, (expression, device.name)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f'{D}.productName.startsWith("x") &&', "Syntax error"),
        ("semver(550)", "found no matching overload for 'semver' applied to '(int)'"),
        ("device.driver", "must evaluate to bool"),
        (f"{C}.memory.major() == 1", "found no matching overload for 'major'"),
        (f'{D}.productName.startswith("x")', "undeclared reference to 'startswith'"),
        ("x" * 10241, "expression too long"),
    ],
)
def test_compile_errors(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_expression(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f"{D}.nonexistent == 1", "no such key: nonexistent"),
        (f'{D}.index.startsWith("1")', "No matching overloads"),
        (f"{D}.productName > 5", "No matching overloads"),
        ('semver("550.0") == semver("550.0.0")', "No Major.Minor.Patch elements found"),
        (f"{D}.index", "CEL result of type INT could not be converted to bool"),
        (f"{D}.driverVersion.isGreaterThan({C}.memory)", "no such overload"),
        ('quantity("1.5").asInteger() == 1', "cannot convert value to integer"),
    ],
)
def test_runtime_errors(expression: str, message: str) -> None:
    with pytest.raises(CelRuntimeError, match=message):
        evaluate(expression, GPU0)


def test_selectors_match_uses_scheduler_message_form() -> None:
    assert selectors_match("class gpu", ['device.driver == "gpu.hami.io"'], GPU0)
    assert not selectors_match("class gpu", ['device.driver == "gpu.hami.io"', f"{D}.index == 1"], GPU0)
    with pytest.raises(SelectorError) as err:
        selectors_match("class gpu", ['device.driver == "gpu.hami.io"', f"{D}.nope"], GPU0)
    assert str(err.value) == "class gpu: selector #1: CEL runtime error: no such key: nope"
    with pytest.raises(SelectorError, match=r"^claim ns/c: selector #0: CEL compile error: "):
        selectors_match("claim ns/c", ["semver(1)"], GPU0)


def test_invalid_version_attribute_errors_every_selector_on_that_device() -> None:
    bad = device_input(DRIVER, {"name": "gpu-9", "attributes": {"driverVersion": {"version": "535.104.05"}}})
    with pytest.raises(CelRuntimeError, match="leading zeroes"):
        evaluate("device.driver == 'gpu.hami.io'", bad)
    assert evaluate('!isSemver("535.104.05")', GPU0)


def test_rewrite_leaves_strings_and_membership_alone() -> None:
    assert (
        rewrite_missing_domains('device.attributes["a.io"].x') == 'device.attributes[?"a.io"].orValue({}).x'
    )
    assert rewrite_missing_domains('"x" in device.attributes') == '"x" in device.attributes'
    assert (
        rewrite_missing_domains("device.attributes[?'a'].orValue({})")
        == "device.attributes[?'a'].orValue({})"
    )
    text = '"device.attributes[\\"q\\"]" == device.driver'
    assert rewrite_missing_domains(text) == text
    nested = "device.capacity[['a','b'][0]].m"
    assert rewrite_missing_domains(nested) == "device.capacity[?['a','b'][0]].orValue({}).m"


def test_compiled_programs_are_cached() -> None:
    expression = f"{D}.index == 0"
    assert compile_selector(expression) is compile_selector(expression)


def test_semver_precedence_and_parsing() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ]
    values = [parse_semver(text) for text in ordered]
    for left, right in itertools.pairwise(values):
        assert left.compare(right) == -1 and right.compare(left) == 1
    assert parse_semver("1.2.3+build.5").compare(parse_semver("1.2.3")) == 0
    assert parse_semver_normalized("v01.2") == parse_semver("1.2.0")
    for bad in ("1.2", "01.2.3", "1.2.3-01", "1.2.x", ""):
        with pytest.raises(ValueParseError):
            parse_semver(bad)


def test_quantity_parsing_is_exact() -> None:
    assert parse_quantity("40Gi") == parse_quantity("40960Mi") == 40 * 2**30
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity("100m") == Fraction(1, 10)
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("-2") == -2
    for bad in ("", "1Q", "Gi", "1.2.3"):
        with pytest.raises(ValueParseError):
            parse_quantity(bad)
