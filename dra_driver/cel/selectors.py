"""Device selectors evaluated the way kube-scheduler evaluates them.

* ``compile_selector`` caches compiled programs per expression text (like the scheduler's
  ``celCache.GetOrCompile``); a compile error is cached too. Literal ``quantity("..")``/``semver``
  calls are folded into constants, and an expression whose estimated cost per device passes
  kube-scheduler's 1,000,000 is refused (``cost.py``: cel-cpp cannot be stopped mid-evaluation).
* ``DeviceInput`` converts one ResourceSlice device once (attributes grouped by domain, versions
  to Semver, capacities to Quantity); the controller rebuilds inputs only when a slice changes.
* ``selectors_match`` returns True/False, or raises ``SelectorError`` with the scheduler's message
  form (``class X: selector #0: CEL runtime error: ...``): an error or a non-bool result aborts
  the claim's allocation, it is never a silent "no match".
"""

from __future__ import annotations

import atexit
import ctypes
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel import env as celenv
from dra_driver.cel.cost import (
    CALLBACK_WEIGHT,
    ITERATION_BUDGET,
    MAX_ESTIMATED_COST,
    BudgetExhausted,
    CostBudget,
    estimate_cost,
)
from dra_driver.cel.folding import fold
from dra_driver.cel.values import ValueParseError, parse_quantity, parse_semver

#: kube-scheduler's limit on one expression's length (``CELSelectorExpressionMaxLength``).
MAX_EXPRESSION_LENGTH = 10 * 1024


class CelCompileError(ValueError):
    """The expression does not compile or does not evaluate to bool."""


class CelRuntimeError(RuntimeError):
    """Evaluating the expression failed for one device (or its result was not a bool)."""


class CelBudgetError(CelRuntimeError):
    """The claim's cost budget would be exhausted by this evaluation (it was not made)."""


class SelectorError(RuntimeError):
    """A selector failed; the message is kube-scheduler's (``class X: selector #i: CEL ... error: ...``)."""


class SelectorBudgetError(SelectorError):
    """A claim's selectors exhausted its cost budget: refused until the claim changes."""


_STRING_LITERAL = re.compile(
    r"""[rR]?[bB]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')""",
    re.DOTALL,
)
_DOMAIN_INDEX = re.compile(r"device\s*\.\s*(?:attributes|capacity)\s*\[")


def _mask_strings(text: str) -> str:
    """The text with string literal contents blanked, so brackets and names inside them are ignored."""
    return _STRING_LITERAL.sub(lambda match: match.group(0)[0] + " " * (len(match.group(0)) - 1), text)


def rewrite_missing_domains(text: str) -> str:
    """``device.attributes[K]`` -> ``device.attributes[?K].orValue({})`` (and ``capacity``).

    Kubernetes maps an unknown domain to an empty map; cel-cpp raises "no such key". Indexes that
    already use ``[?`` are left alone, and so is ``K in device.attributes``.
    """
    masked = _mask_strings(text)
    edits: list[tuple[int, int, str]] = []
    for match in _DOMAIN_INDEX.finditer(masked):
        start = match.end()
        if masked[start:].lstrip().startswith("?"):
            continue
        depth, position = 1, start
        while position < len(masked) and depth:
            depth += {"[": 1, "]": -1}.get(masked[position], 0)
            position += 1
        if depth:
            return text  # unbalanced: leave it to the checker, which already accepted the original
        key = text[start : position - 1]
        edits.append((start - 1, position, f"[?{key}].orValue({{}})"))
    for begin, end, replacement in reversed(edits):
        text = text[:begin] + replacement + text[end:]
    return text


@dataclass(frozen=True, slots=True)
class CompiledSelector:
    expression: str
    program: Any = None
    error: str | None = None
    #: ``cost.estimate_cost`` of the compiled text: an upper bound of one evaluation's work.
    estimated_cost: int = 0


def _too_costly(estimated: int) -> str:
    return (
        f"estimated cost {estimated:,} exceeds the limit {MAX_ESTIMATED_COST:,} per device "
        f"(a comprehension multiplies its body's work by its range, up to {ITERATION_BUDGET:,} steps, "
        f"and each quantity/semver function weighs {CALLBACK_WEIGHT}): iterate over less, or "
        "compare fewer quantities per step"
    )


#: Compiled selectors by expression text. Tenants write the texts (claim selectors), so the cache
#: is bounded: the oldest entry goes when it is full (DeviceClass selectors are few and hot, and
#: come back on their next use).
MAX_CACHED_SELECTORS = 4096
_cache: dict[str, CompiledSelector] = {}
_lock = threading.Lock()
_env: Any = None


@atexit.register
def _keep_programs_past_teardown() -> None:
    """Never destroy the environment and the cached programs at interpreter exit.

    cel-expr-python crashes (SIGSEGV) when the final garbage collection frees an environment and
    its programs in an arbitrary order, after every test or the daemon's work is done; a process
    that exits frees its memory anyway, so one extra reference on each keeps them alive to the end.
    """
    with _lock:
        for kept in (_env, _cache):
            if kept is not None:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))


def default_env() -> Any:
    global _env
    with _lock:
        if _env is None:
            _env = celenv.new_env()
        return _env


def _clean(message: str) -> str:
    message = re.sub(r"^[A-Z_]+: ", "", message.strip())
    message = message.replace("ERROR: <input>:", "<input>:")
    message = re.sub(r'Key not found in map : "([^"]*)"', r"no such key: \1", message)
    return re.sub(r"\s*\[[A-Z_]+\]$", "", message)


def compile_selector(expression: str) -> CompiledSelector:
    """Compile (cached): type-check the original text, then compile the missing-domain rewrite."""
    cached = _cache.get(expression)
    if cached is not None:
        return cached
    env = default_env()
    result: CompiledSelector
    if len(expression) > MAX_EXPRESSION_LENGTH:
        result = CompiledSelector(
            expression, error=f"expression too long ({len(expression)} > {MAX_EXPRESSION_LENGTH})"
        )
    else:
        try:
            checked = env.compile(expression)
            if checked.return_type() not in (celenv.TYPE_BOOL, celenv.TYPE_DYN):
                result = CompiledSelector(
                    expression, error=f"must evaluate to bool, not {checked.return_type().name()}"
                )
            else:
                rewritten = rewrite_missing_domains(fold(expression, _mask_strings))
                estimated = estimate_cost(_mask_strings(rewritten))
                if estimated > MAX_ESTIMATED_COST:
                    result = CompiledSelector(expression, error=_too_costly(estimated))
                else:
                    program = checked if rewritten == expression else env.compile(rewritten)
                    result = CompiledSelector(expression, program=program, estimated_cost=estimated)
        except Exception as err:  # cel-cpp raises RuntimeError; anything else is the same refusal
            result = CompiledSelector(expression, error=_clean(str(err)))
    with _lock:
        while len(_cache) >= MAX_CACHED_SELECTORS:
            del _cache[next(iter(_cache))]
        _cache.setdefault(expression, result)
    return result


def check_expression(expression: str) -> None:
    """Raise ``CelCompileError`` if the expression would be rejected (webhook-style validation)."""
    compiled = compile_selector(expression)
    if compiled.error is not None:
        raise CelCompileError(compiled.error)


@dataclass(slots=True)
class DeviceInput:
    """One device's CEL input, converted once; ``error`` is set when an attribute cannot be converted."""

    driver: str
    name: str
    data: Mapping[str, Any]
    error: str | None = None
    _activation: Any = field(default=None, repr=False)

    def activation(self) -> Any:
        if self._activation is None:
            self._activation = default_env().Activation(dict(self.data))
        return self._activation


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


def device_input(driver: str, device: Mapping[str, Any]) -> DeviceInput:
    """Convert a ResourceSlice ``spec.devices[]`` entry (v1 shape) into a CEL input."""
    attributes: dict[str, dict[str, Any]] = {}
    capacity: dict[str, dict[str, Any]] = {}
    error: str | None = None
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = _split(name, driver)
        converted: Any
        if "version" in value:
            try:
                converted = celenv.semver_message(parse_semver(value["version"]))
            except ValueParseError as err:
                error = f"parse semantic version of attribute {name}: {err}"
                continue
        elif "int" in value:
            converted = int(value["int"])
        elif "bool" in value:
            converted = bool(value["bool"])
        elif "string" in value:
            converted = str(value["string"])
        else:
            continue  # list types (1.36 alpha) and unknown shapes are not selectable here
        attributes.setdefault(domain, {})[ident] = converted
    for name, value in (device.get("capacity") or {}).items():
        domain, ident = _split(name, driver)
        try:
            amount = parse_quantity(str(value.get("value", "0")))
        except ValueParseError as err:
            error = f"parse capacity {name}: {err}"
            continue
        capacity.setdefault(domain, {})[ident] = celenv.quantity_message(amount)
    data = {
        "device.driver": driver,
        "device.attributes": attributes,
        "device.capacity": capacity,
        "device.allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
    return DeviceInput(driver=driver, name=str(device.get("name", "")), data=data, error=error)


def evaluate(expression: str, device: DeviceInput, budget: CostBudget | None = None) -> bool:
    """Evaluate one selector; raises ``CelCompileError`` or ``CelRuntimeError`` (also when
    ``budget``, charged the expression's estimated cost first, is exhausted)."""
    compiled = compile_selector(expression)
    if compiled.error is not None:
        raise CelCompileError(compiled.error)
    if device.error is not None:
        raise CelRuntimeError(device.error)
    if budget is not None:
        try:
            budget.spend(max(1, compiled.estimated_cost))
        except BudgetExhausted as err:
            raise CelBudgetError(str(err)) from None
    try:
        value = compiled.program.eval(device.activation())
    except Exception as err:  # e.g. cel-cpp's "Iteration budget exceeded" on a costly selector
        raise CelRuntimeError(_clean(str(err))) from None
    kind = value.type()
    if kind == celenv.TYPE_ERROR:
        raise CelRuntimeError(_clean(str(value.value())))
    if kind != celenv.TYPE_BOOL:
        raise CelRuntimeError(f"CEL result of type {kind.name()} could not be converted to bool")
    return bool(value.value())


def selectors_match(
    subject: str, expressions: Sequence[str], device: DeviceInput, budget: CostBudget | None = None
) -> bool:
    """All selectors of ``subject`` (``"class gpu.hami.io"``, ``"claim ns/name"``) match ``device``;
    a claim's evaluations are charged to its ``budget``."""
    for position, expression in enumerate(expressions):
        try:
            if not evaluate(expression, device, budget):
                return False
        except CelCompileError as err:
            raise SelectorError(f"{subject}: selector #{position}: CEL compile error: {err}") from None
        except CelBudgetError as err:
            raise SelectorBudgetError(f"{subject}: selector #{position}: CEL runtime error: {err}") from None
        except CelRuntimeError as err:
            raise SelectorError(f"{subject}: selector #{position}: CEL runtime error: {err}") from None
    return True
