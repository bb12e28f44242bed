"""The chart README's values table is generated from values.yaml's ``# --`` comments
(``hack/gen_values_table.py``): every value must have one, and the table must be current."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.chart.helpers import CHART

GENERATOR = Path(__file__).resolve().parents[2] / "hack" / "gen_values_table.py"
#: Free-form Kubernetes fields, documented as one key (their sub-keys are Kubernetes' own).
OPAQUE = ("resources", "updateStrategy", "config", "tolerations", "nodeSelector", "affinity")


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_values_table", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_values_table_is_current(gen: ModuleType) -> None:
    readme = (CHART / "README.md").read_text()
    assert readme == gen.Chart(CHART).expected_readme(), (
        "the values table of charts/hami-dra/README.md is stale: run hack/gen_values_table.py"
    )


def test_the_check_mode_passes_on_the_tree() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


VALUES = """\
# Header comment: not a value's.

# -- The driver name.
driverName: gpu.hami.io
image:
  # -- The image's repository.
  repository: hami-dra
  # -- Its tag; spans
  # two comment lines.
  tag: ""
# -- Grouped: one row for the mapping.
rbac:
  create: true
# -- Classes.
deviceClasses:
  - name: gpu.hami.io
    config:
      policy: spread
    # -- Extra CEL selectors.
    selectors: []
  - name: second
    # -- Not the first item's.
    extra: 1
# -- Kubernetes' own, one value.
resources:
  requests: {cpu: 1}
"""


def test_comments_are_read_per_key_path(gen: ModuleType) -> None:
    assert gen.comments(VALUES) == {
        "driverName": "The driver name.",
        "image.repository": "The image's repository.",
        "image.tag": "Its tag; spans two comment lines.",
        "rbac": "Grouped: one row for the mapping.",
        "deviceClasses": "Classes.",
        "deviceClasses[].selectors": "Extra CEL selectors.",
        "deviceClasses[].extra": "Not the first item's.",
        "resources": "Kubernetes' own, one value.",
    }


def test_the_table_has_a_row_per_documented_value(gen: ModuleType) -> None:
    rows = gen.table(VALUES).splitlines()
    assert rows[:2] == ["| key | default | description |", "|---|---|---|"]
    assert "| `driverName` | `gpu.hami.io` | The driver name. |" in rows
    assert "| **image** | | |" in rows
    assert '| `image.tag` | `""` | Its tag; spans two comment lines. |' in rows
    assert "| `rbac` | `{create: true}` | Grouped: one row for the mapping. |" in rows
    assert "| `deviceClasses[].selectors` | `[]` | Extra CEL selectors. |" in rows
    assert "| `resources` | `{requests: {cpu: 1}}` | Kubernetes' own, one value. |" in rows


def test_an_undocumented_value_fails_naming_it(gen: ModuleType) -> None:
    undocumented = VALUES.replace("  # -- The image's repository.\n", "") + "logVerbosity: 1\n"
    with pytest.raises(
        gen.ValuesTableError, match=r"comment in values.yaml.*: image.repository, logVerbosity$"
    ):
        gen.table(undocumented)


def test_a_changed_comment_or_default_makes_the_table_stale(gen: ModuleType, tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.yaml").write_text(VALUES)
    (chart / "README.md").write_text(f"# chart\n\n{gen.START}\nold\n{gen.END}\n\nhand-written\n")
    current = gen.Chart(chart).expected_readme()
    assert current.endswith(f"{gen.END}\n\nhand-written\n") and "old" not in current
    (chart / "README.md").write_text(current)
    assert gen.Chart(chart).expected_readme() == current
    for changed in (VALUES.replace("The driver name.", "The name."), VALUES.replace("hami-dra", "other")):
        (chart / "values.yaml").write_text(changed)
        assert gen.Chart(chart).expected_readme() != current


def test_markup_in_descriptions_stays_visible(gen: ModuleType) -> None:
    rows = gen.table("# -- A | pipe and libvgpu.so.<tag>, and `<code>`.\nkey: 1\n").splitlines()
    assert rows[2] == "| `key` | `1` | A \\| pipe and libvgpu.so.&lt;tag&gt;, and `<code>`. |"


def _paths(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict) or not node or prefix.rsplit(".", 1)[-1] in OPAQUE:
        return [prefix]
    paths: list[str] = []
    for key, value in node.items():
        paths += _paths(value, f"{prefix}.{key}" if prefix else key)
    return paths


def _documented(path: str, rows: dict[str, str]) -> bool:
    """A row of its own, or the row of a mapping above it whose default shows it (`image`: `{tag: ..}`)."""
    if path in rows:
        return True
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        default = rows.get(".".join(parts[:cut]))
        if default and all(re.search(rf"\b{re.escape(part)}:", default) for part in parts[cut:]):
            return True
    return False


def test_every_value_is_documented() -> None:
    # Independent of the generator: read back the table it wrote.
    readme = (CHART / "README.md").read_text()
    rows = {
        cells[1].strip().strip("`"): cells[2]
        for cells in (line.split("|") for line in readme.splitlines() if line.startswith("| `"))
    }
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    undocumented = [path for path in _paths(values) if not _documented(path, rows)]
    assert not undocumented, f"values missing from the table in charts/hami-dra/README.md: {undocumented}"
