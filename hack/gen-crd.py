#!/usr/bin/env python3
"""Write the GpuQuota CRD (dra_driver/quota/crd.py) to api/crds/ and the chart's crds/ (or --check them)."""

from __future__ import annotations

import sys
from pathlib import Path

from dra_driver.quota.crd import CRD_NAME, render

ROOT = Path(__file__).resolve().parents[1]
TARGETS = [ROOT / where / "crds" / f"{CRD_NAME}.yaml" for where in ("api", "charts/hami-dra")]


def main(argv: list[str]) -> int:
    text = render()
    stale = [target for target in TARGETS if not target.exists() or target.read_text() != text]
    if "--check" in argv:
        for target in stale:
            print(f"{target} is stale: run hack/gen-crd.py", file=sys.stderr)
        return 1 if stale else 0
    for target in stale:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
