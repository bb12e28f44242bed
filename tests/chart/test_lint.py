"""helm lint --strict must pass with the defaults and with every option turned on."""

from __future__ import annotations

import pytest

from tests.chart.helpers import ALL_ON, CHART, run_helm


@pytest.mark.parametrize("values_args", [[], ["-f", str(ALL_ON)]], ids=["defaults", "all-options"])
def test_lint_strict(helm: str, values_args: list[str]) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), *values_args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out
