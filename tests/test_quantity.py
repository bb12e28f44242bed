"""The project's one Kubernetes quantity grammar (dra_driver.quantity)."""

from fractions import Fraction

import pytest

from dra_driver.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40Gi", Fraction(40 * 2**30)),
        ("0.2G", Fraction(200_000_000)),
        ("500m", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("-1.5Ki", Fraction(-1536)),
        (".5", Fraction(1, 2)),
        (7, Fraction(7)),
    ],
)
def test_parse_quantity_is_exact(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "quantities must match the regular expression"),
        ("Gi", "quantities must match the regular expression"),
        ("1Qi", "unable to parse quantity's suffix"),
        ("1e1001", "unable to parse quantity's suffix"),
    ],
)
def test_parse_quantity_errors_use_kubernetes_messages(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        parse_quantity(text)


def test_parse_bytes_whole_non_negative() -> None:
    assert parse_bytes("1000Mi") == 1000 * 2**20
    assert parse_bytes(" 16Gi ") == 16 * 2**30
    assert parse_bytes("1e9") == 10**9
    with pytest.raises(QuantityError, match="not a whole number of bytes"):
        parse_bytes("1500m")
    with pytest.raises(QuantityError, match="must not be negative"):
        parse_bytes("-1Mi")
    with pytest.raises(QuantityError, match="is not a quantity; use forms such as 1000Mi"):
        parse_bytes("lots")
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_bytes(True)  # type: ignore[arg-type]


def test_format_bytes_round_trips() -> None:
    for value in (1000 * 2**20, 80 * 2**30, 1536, 1):
        assert parse_bytes(format_bytes(value)) == value
