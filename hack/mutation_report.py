"""Print the kill rate of the last ``mutmut run`` (``make mutation``), overall and per module.

A mutant counts as killed when a test failed (or timed out) on it; survived and suspicious ones
are the gaps. Figures only: the goal (90 % or more) is reported, not enforced.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict

KILLED = {"killed", "timeout"}


def main() -> int:
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in listing.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        module = name.split("__mutmut_", 1)[0].rsplit(".", 1)[0]
        per_module[module][status.strip()] += 1
    if not per_module:
        print("no mutmut results: run `make mutation` first", file=sys.stderr)
        return 1
    total: Counter[str] = Counter()
    print(f"{'module':<44} {'mutants':>8} {'killed':>8} {'survived':>9} {'rate':>7}")
    for module in sorted(per_module):
        counts = per_module[module]
        total.update(counts)
        killed = sum(counts[s] for s in KILLED)
        tested = sum(counts.values()) - counts["not checked"] - counts["skipped"]
        print(f"{module:<44} {sum(counts.values()):>8} {killed:>8} {counts['survived']:>9} "
              f"{100 * killed / max(tested, 1):>6.1f}%")  # fmt: skip
    killed = sum(total[s] for s in KILLED)
    tested = sum(total.values()) - total["not checked"] - total["skipped"]
    rate = 100 * killed / max(tested, 1)
    print(f"{'all':<44} {sum(total.values()):>8} {killed:>8} {total['survived']:>9} {rate:>6.1f}%")
    print(f"statuses: {dict(total)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
