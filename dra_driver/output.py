"""``-o/--output`` of the read commands (explain, top, simulate, discover): one set of formats.

Every read command takes ``-o table|wide|json|yaml``, as kubectl's read commands do: ``table`` the
human view, ``wide`` that view with more columns, ``json`` and ``yaml`` the same stable document
(what a script reads). Earlier spellings stay accepted as aliases (``explain -o text`` is
``table``), so scripts written against them keep working; the help text names them.

Tables printed to a terminal may be decorated; printed anywhere else (a pipe, a file) they are
plain kubectl-style columns: no box drawing, no colour, no padding to a terminal width, so that
``grep``, ``awk`` and ``column`` read them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

TABLE = "table"
WIDE = "wide"
JSON = "json"
YAML = "yaml"
FORMATS: tuple[str, ...] = (TABLE, WIDE, JSON, YAML)
#: Formats that print the command's document rather than a table.
DOCUMENTS = frozenset({JSON, YAML})
#: Spellings earlier releases accepted, per the format they now name.
ALIASES: Mapping[str, str] = {"text": TABLE}


def add_output_flag(parser: argparse.ArgumentParser, default: str = TABLE, what: str = "") -> None:
    """``-o/--output FORMAT`` with :data:`FORMATS` and :data:`ALIASES` (an alias parses as its format)."""

    def output_format(value: str) -> str:
        chosen = ALIASES.get(value, value)
        if chosen not in FORMATS:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {value!r} (choose from {', '.join(map(repr, FORMATS))})"
            )
        return chosen

    aliases = "; ".join(f"'{old}' is an alias of {new}" for old, new in ALIASES.items())
    parser.add_argument(
        "-o",
        "--output",
        type=output_format,
        default=default,
        metavar="{" + ",".join(FORMATS) + "}",
        help=f"output format (default: {default}){what}; {aliases}",
    )


def render_document(document: Any, output: str) -> str:
    """``document`` as indented JSON or block YAML, ending in a newline."""
    if output == YAML:
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return json.dumps(document, indent=2) + "\n"


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stdout) is a terminal: only then are tables decorated."""
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns three spaces apart, each line as long as its cells, as kubectl prints them."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
