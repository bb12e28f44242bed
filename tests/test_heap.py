"""dra_driver/heap.py in a process of its own: freezing the heap would also set aside the test
runner's objects, so each check runs in a fresh interpreter and reports what it saw."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

CHECK = textwrap.dedent(
    """
    import gc, json, weakref
    from dra_driver import heap

    class Cached:  # stands for a cache entry: a tracked object that lives on
        pass

    cache = [Cached() for _ in range(5000)]
    default = gc.get_threshold()
    heap.tune()
    threshold = gc.get_threshold()
    frozen = heap.settle()
    walked = {id(o) for o in gc.get_objects()}
    dropped = weakref.ref(cache.pop())
    made_after = Cached()
    print(json.dumps({
        "default": default,
        "threshold": threshold,
        "frozen": frozen,
        "cached_walked": sum(id(o) in walked for o in cache),
        "dropped_freed": dropped() is None,
        "new_walked": id(made_after) in {id(o) for o in gc.get_objects()},
    }))
    """
)


def run_check() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_settle_sets_the_live_heap_aside_and_reference_counting_still_frees_it() -> None:
    seen = run_check()
    assert seen["frozen"] >= 5000, "every live cache entry is in the permanent generation"
    assert seen["cached_walked"] == 0, "no collection walks what was frozen"
    assert seen["dropped_freed"], "a frozen object dropped is still freed by reference counting"
    assert seen["new_walked"], "what is made afterwards is collected as usual"


def test_tune_raises_only_the_young_threshold() -> None:
    seen = run_check()
    young, *older = seen["threshold"]
    assert young == 10_000 > seen["default"][0] and older == seen["default"][1:]
