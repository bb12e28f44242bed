"""The chart README documents every key of values.yaml (the values table must not drift)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.chart.helpers import CHART

#: Free-form Kubernetes fields, documented as one key (their sub-keys are Kubernetes' own).
OPAQUE = ("resources", "updateStrategy", "config", "tolerations", "nodeSelector", "affinity")


def _paths(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict) or not node or prefix.rsplit(".", 1)[-1] in OPAQUE:
        return [prefix]
    paths: list[str] = []
    for key, value in node.items():
        paths += _paths(value, f"{prefix}.{key}" if prefix else key)
    return paths


def _documented(path: str, key_cells: list[str]) -> bool:
    parent, _, leaf = path.rpartition(".")
    for cell in key_cells:
        if path in cell:
            return True
        if parent in cell and re.search(rf"(^|[^\w]){re.escape(leaf)}([^\w]|$)", cell):
            return True
    return False


def test_every_value_is_documented() -> None:
    readme = (CHART / "README.md").read_text()
    key_cells = [line.split("|")[1] for line in readme.splitlines() if line.startswith("| `")]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    undocumented = [path for path in _paths(values) if not _documented(path, key_cells)]
    assert not undocumented, f"values missing from the table in charts/hami-dra/README.md: {undocumented}"
