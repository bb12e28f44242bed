"""The product and the development rooms stay apart (issue 36).

``dra_driver`` is what the wheel, ``pip install .`` and the image ship; ``hami_dra_dev`` (``dev/``:
the sandbox API server, the local cluster harness, the demo) is installed from a clone only. Two
checks keep it so: no module of the product imports the development package (read from the source,
so a lazy import inside a function counts too), and the wheel the project's own build backend makes
holds the product and nothing of the development package, even though ``dev/`` sits beside it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = REPO / "dra_driver"
DEV = REPO / "dev" / "hami_dra_dev"
DEV_PACKAGE = "hami_dra_dev"
#: What a copy of the repository for the wheel build leaves out: environments, caches, outputs.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv*", ".tools", "build", "dist", "mutants", "*.egg-info", "__pycache__",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", ".benchmarks",
)  # fmt: skip


def imported_modules(source: str) -> set[str]:
    """Every module an absolute ``import``/``from ... import`` statement of ``source`` names,
    anywhere in it (a relative import stays inside its own top-level package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _is_dev(name: str) -> bool:
    return name == DEV_PACKAGE or name.startswith(f"{DEV_PACKAGE}.")


def test_imported_modules_reads_every_kind_of_import() -> None:
    source = (
        "import os, hami_dra_dev.sandbox\n"
        "from hami_dra_dev.cluster import layout\n"
        "def later():\n    import hami_dra_dev.demo as demo\n    from . import x\n"
    )
    expected = {"os", "hami_dra_dev.sandbox", "hami_dra_dev.cluster", "hami_dra_dev.demo"}
    assert imported_modules(source) == expected


def test_no_product_module_imports_the_development_package() -> None:
    offenders = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(PRODUCT.rglob("*.py"))
        for name in imported_modules(path.read_text())
        if _is_dev(name)
    }
    assert not offenders, f"the product imports development code: {sorted(offenders)}"


def test_the_development_rooms_are_not_in_the_product_package() -> None:
    for room in ("sandbox", "cluster", "demo"):
        assert not (PRODUCT / room).exists(), f"dra_driver/{room} is back in the product package"
        assert (DEV / room / "__init__.py").is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of a copy of the repository (``dev/`` included), built by the build backend
    pyproject.toml names, as ``pip wheel .`` or ``uv build`` would (without build isolation: the
    backend installed in this environment)."""
    source = tmp_path_factory.mktemp("wheel") / "repo"
    shutil.copytree(REPO, source, ignore=NOT_COPIED, symlinks=True)
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["build-backend"]
    out = source / "wheel-out"
    out.mkdir()
    build = (
        "import importlib, sys; module, _, attr = sys.argv[1].partition(':'); "
        "backend = importlib.import_module(module); backend = getattr(backend, attr) if attr else backend; "
        "print(backend.build_wheel(sys.argv[2]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", build, backend, str(out)],
        cwd=source, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    name = result.stdout.strip().splitlines()[-1]
    return zipfile.ZipFile(out / name)


def test_the_wheel_holds_the_product_and_no_development_module(wheel: zipfile.ZipFile) -> None:
    files = wheel.namelist()
    tops = {name.split("/", 1)[0] for name in files if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"dra_driver"}, f"the wheel ships more than the product: {sorted(tops)}"
    assert "dra_driver/cli.py" in files and "dra_driver/controller/command.py" in files
    product_rooms = [name for name in files if name.split("/")[1:2] in (["sandbox"], ["cluster"], ["demo"])]
    assert not product_rooms, f"development rooms in the wheel: {product_rooms[:5]}"
