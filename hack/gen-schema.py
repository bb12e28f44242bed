#!/usr/bin/env python3
"""Regenerate api/gpuconfig.schema.json from the pydantic GpuConfig model (or --check it is current)."""

from __future__ import annotations

import sys
from pathlib import Path

from dra_driver.config.schema import render_schema

TARGET = Path(__file__).resolve().parents[1] / "api" / "gpuconfig.schema.json"


def main(argv: list[str]) -> int:
    text = render_schema()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is stale: run hack/gen-schema.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
