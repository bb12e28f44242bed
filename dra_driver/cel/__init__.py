"""CEL device selectors with Kubernetes' DRA semantics, on ``cel-expr-python``.

``env`` holds every use of the CEL library (so a change of its 0.1.x API stays local);
``values`` holds the semver/quantity semantics; ``selectors`` compiles (cached), converts device
inputs once and evaluates with the scheduler's error behaviour.
"""

from dra_driver.cel.cost import CostBudget
from dra_driver.cel.selectors import (
    CelCompileError,
    CelRuntimeError,
    DeviceInput,
    SelectorBudgetError,
    SelectorError,
    check_expression,
    compile_selector,
    device_input,
    evaluate,
    rewrite_missing_domains,
    selectors_match,
)

__all__ = [
    "CelCompileError",
    "CelRuntimeError",
    "CostBudget",
    "DeviceInput",
    "SelectorBudgetError",
    "SelectorError",
    "check_expression",
    "compile_selector",
    "device_input",
    "evaluate",
    "rewrite_missing_domains",
    "selectors_match",
]
