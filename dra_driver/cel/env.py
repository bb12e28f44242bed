"""Kubernetes' DRA CEL environment on ``cel-expr-python`` (cel-cpp): the only module importing it.

Wiring, as measured against Kubernetes' own CEL environment for DRA (tests/cel/):

* variables ``device.driver``, ``device.attributes`` (``map(string, map(string, dyn))``),
  ``device.capacity`` (``map(string, map(string, kubernetes.Quantity))``),
  ``device.allowMultipleAllocations``, declared as qualified names so the checker types them;
* ``kubernetes.Semver`` and ``kubernetes.Quantity`` are protobuf messages built at run time, kept
  canonical (reduced fraction, no build metadata, an order-preserving key) so message equality is
  Kubernetes' value equality; their functions carry Kubernetes' exact names and are Python
  callbacks, except where ``folding.py`` rewrote a call on a literal into cel-cpp's own operators;
* ``cel.bind`` (ext bindings), the string extension and optionals, as in the apiserver's env;
* an unknown domain reads as an empty map: ``device.attributes[K]`` is rewritten to
  ``device.attributes[?K].orValue({})`` after the original text has been checked, so errors
  still point at what the user wrote while ``has(...)`` on a missing domain is false.

cel-cpp runs the overload by argument *kind*, so the Semver and Quantity overloads of one member
name (``isGreaterThan``, ``isLessThan``, ``compareTo``) share one implementation that dispatches
on the message type and fails with "no such overload" on a mix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from cel_expr_python import cel  # type: ignore[import-untyped,unused-ignore]
from cel_expr_python.ext import (  # type: ignore[import-untyped,unused-ignore]
    ext_bindings,
    ext_optional,
    ext_strings,
)
from google.protobuf import (  # type: ignore[import-untyped,unused-ignore]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from dra_driver.cel.values import (
    SemverValue,
    ValueParseError,
    parse_quantity,
    parse_semver,
    parse_semver_normalized,
    quantity_as_integer,
    quantity_key,
    semver_key,
)

_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


def _build_pool() -> tuple[descriptor_pool.DescriptorPool, type[Any], type[Any]]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="hami_dra/kubernetes_cel.proto", package="kubernetes", syntax="proto3"
    )
    semver = proto.message_type.add(name="Semver")
    for number, name in enumerate(("major", "minor", "patch"), start=1):
        semver.field.add(name=name, number=number, type=_INT64, label=_OPTIONAL)
    semver.field.add(name="pre", number=4, type=_STRING, label=_REPEATED)
    # Order-preserving keys (values.semver_key / quantity_key): comparisons with a literal are
    # rewritten to compare these strings in cel-cpp, without a Python callback (folding.py).
    semver.field.add(name="skey", number=5, type=_STRING, label=_OPTIONAL)
    quantity = proto.message_type.add(name="Quantity")
    quantity.field.add(name="num", number=1, type=_STRING, label=_OPTIONAL)
    quantity.field.add(name="den", number=2, type=_STRING, label=_OPTIONAL)
    quantity.field.add(name="qkey", number=3, type=_STRING, label=_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    semver_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Semver"))
    quantity_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Quantity"))
    return pool, semver_class, quantity_class


POOL, SemverMessage, QuantityMessage = _build_pool()
SEMVER = cel.Type("kubernetes.Semver")
QUANTITY = cel.Type("kubernetes.Quantity")


def semver_message(value: SemverValue) -> Any:
    return SemverMessage(
        major=value.major, minor=value.minor, patch=value.patch, pre=list(value.pre), skey=semver_key(value)
    )


def _semver_value(message: Any) -> SemverValue:
    return SemverValue(message.major, message.minor, message.patch, tuple(message.pre))


def quantity_message(value: Fraction) -> Any:
    return QuantityMessage(num=str(value.numerator), den=str(value.denominator), qkey=quantity_key(value))


@lru_cache(maxsize=4096)
def _fraction(num: str, den: str) -> Fraction:
    return Fraction(int(num), int(den or "1"))


def _quantity_value(message: Any) -> Fraction:
    return _fraction(message.num or "0", message.den or "1")


class _NoSuchOverload(TypeError):
    pass


def _kind(value: Any) -> str:
    if isinstance(value, SemverMessage):
        return "semver"
    if isinstance(value, QuantityMessage):
        return "quantity"
    return type(value).__name__


def _compare(left: Any, right: Any, name: str) -> int:
    kinds = (_kind(left), _kind(right))
    if kinds == ("semver", "semver"):
        return _semver_value(left).compare(_semver_value(right))
    if kinds == ("quantity", "quantity"):
        a, b = _quantity_value(left), _quantity_value(right)
        return (a > b) - (a < b)
    raise _NoSuchOverload(f"no such overload: {name}({kinds[0]}, {kinds[1]})")


@lru_cache(maxsize=1024)
def _parse_semver_cached(text: str, normalize: bool) -> Any:
    return semver_message(parse_semver_normalized(text) if normalize else parse_semver(text))


@lru_cache(maxsize=1024)
def _parse_quantity_cached(text: str) -> Any:
    return quantity_message(parse_quantity(text))


def _is_valid(parse: Callable[[], Any]) -> bool:
    try:
        parse()
    except ValueParseError:
        return False
    return True


def _sign(message: Any) -> int:
    value = _quantity_value(message)
    return (value > 0) - (value < 0)


def _as_integer(message: Any) -> int:
    return quantity_as_integer(_quantity_value(message))


def _is_integer(message: Any) -> bool:
    return _is_valid(lambda: _as_integer(message))


def _as_float(message: Any) -> float:
    return float(_quantity_value(message))


def _add(left: Any, right: Any) -> Any:
    return _quantity_plus(left, right, 1)


def _sub(left: Any, right: Any) -> Any:
    return _quantity_plus(left, right, -1)


def _is_quantity(text: str) -> bool:
    return _is_valid(lambda: parse_quantity(text))


def _quantity_plus(left: Any, right: Any, sign: int) -> Any:
    other = Fraction(right) if isinstance(right, int) else _quantity_value(right)
    return quantity_message(_quantity_value(left) + sign * other)


def _functions() -> list[Any]:
    o, f, t, q = cel.Overload, cel.FunctionDecl, cel.Type, QUANTITY
    b, i, s, d = t.BOOL, t.INT, t.STRING, t.DOUBLE
    compare: dict[str, Callable[[Any, Any], Any]] = {
        "isGreaterThan": lambda a, c: _compare(a, c, "isGreaterThan") > 0,
        "isLessThan": lambda a, c: _compare(a, c, "isLessThan") < 0,
        "compareTo": lambda a, c: _compare(a, c, "compareTo"),
    }
    decls = [
        f(
            "semver",
            [
                o("string_to_semver", SEMVER, [s], impl=lambda v: _parse_semver_cached(v, False)),
                o("string_bool_to_semver", SEMVER, [s, b], impl=_parse_semver_cached),
            ],
        ),
        f(
            "isSemver",
            [
                o("is_semver_string", b, [s], impl=lambda v: _is_valid(lambda: parse_semver(v))),
                o(
                    "is_semver_string_bool",
                    b,
                    [s, b],
                    impl=lambda v, n: _is_valid(lambda: parse_semver_normalized(v) if n else parse_semver(v)),
                ),
            ],
        ),
        f("major", [o("semver_major", i, [SEMVER], is_member=True, impl=lambda v: v.major)]),
        f("minor", [o("semver_minor", i, [SEMVER], is_member=True, impl=lambda v: v.minor)]),
        f("patch", [o("semver_patch", i, [SEMVER], is_member=True, impl=lambda v: v.patch)]),
        f("quantity", [o("string_to_quantity", q, [s], impl=_parse_quantity_cached)]),
        f("isQuantity", [o("is_quantity_string", b, [s], impl=_is_quantity)]),
        f("sign", [o("quantity_sign", i, [q], impl=_sign)]),
        f("isInteger", [o("quantity_is_integer", b, [q], is_member=True, impl=_is_integer)]),
        f("asInteger", [o("quantity_get_int", i, [q], is_member=True, impl=_as_integer)]),
        f("asApproximateFloat", [o("quantity_get_float", d, [q], is_member=True, impl=_as_float)]),
        f(
            "add",
            [
                o("quantity_add", q, [q, q], is_member=True, impl=_add),
                o("quantity_add_int", q, [q, i], is_member=True, impl=_add),
            ],
        ),
        f(
            "sub",
            [
                o("quantity_sub", q, [q, q], is_member=True, impl=_sub),
                o("quantity_sub_int", q, [q, i], is_member=True, impl=_sub),
            ],
        ),
    ]
    return_types = {"isGreaterThan": b, "isLessThan": b, "compareTo": i}
    for name, impl in compare.items():
        snake = re.sub(r"([A-Z])", r"_\1", name).lower()
        decls.append(
            f(
                name,
                [
                    # One implementation for both: cel-cpp dispatches by kind (both are messages).
                    o(f"semver_{snake}", return_types[name], [SEMVER, SEMVER], is_member=True, impl=impl),
                    o(f"quantity_{snake}", return_types[name], [q, q], is_member=True),
                ],
            )
        )
    return decls


VARIABLES: Mapping[str, Any] = {
    "device.driver": cel.Type.STRING,
    "device.attributes": cel.Type.Map(cel.Type.STRING, cel.Type.Map(cel.Type.STRING, cel.Type.DYN)),
    "device.capacity": cel.Type.Map(cel.Type.STRING, cel.Type.Map(cel.Type.STRING, QUANTITY)),
    "device.allowMultipleAllocations": cel.Type.BOOL,
}


def new_env() -> Any:
    """A fresh DRA environment (one per process is enough; see ``selectors.default_env``)."""
    return cel.NewEnv(
        POOL,
        variables=dict(VARIABLES),
        extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings(), ext_optional.ExtOptional()],
        functions=_functions(),
    )


# Types re-exported for the selectors module (keeps every cel_expr_python name in this file).
TYPE_BOOL = cel.Type.BOOL
TYPE_DYN = cel.Type.DYN
TYPE_ERROR = cel.Type.ERROR
