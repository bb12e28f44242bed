"""A bounded log of which names changed (nodes), so an index can catch up with only what changed.

The controller's derived indexes (which nodes a pod may run on, which devices a request may use)
are kept per key and brought up to date when next read: each remembers the log position it was
computed at and re-evaluates only the names changed since (``since``). The log keeps the last
``keep`` batches; an index older than that, or one that meets an "everything changed" batch,
recomputes in full, so a forgotten change can never leave an index stale.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

#: How many change batches are kept: enough for every index read at least once in a while.
KEEP = 4096


class ChangeLog:
    """Batches of changed names, numbered from 1; ``position`` is the number of the last one."""

    def __init__(self, keep: int = KEEP) -> None:
        self.position = 0
        self._batches: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=keep)

    def note(self, names: Iterable[str]) -> None:
        """These names changed (one batch; nothing is logged for none)."""
        batch = frozenset(names)
        if batch:
            self.position += 1
            self._batches.append((self.position, batch))

    def note_all(self) -> None:
        """Everything may have changed: whoever is behind this point recomputes in full."""
        self.position += 1
        self._batches.append((self.position, None))

    def since(self, position: int) -> set[str] | None:
        """The names changed after ``position``; None when that is unknown (in full, or forgotten)."""
        if position == self.position:
            return set()
        if position > self.position or not self._batches or self._batches[0][0] > position + 1:
            return None
        changed: set[str] = set()
        for number, batch in reversed(self._batches):
            if number <= position:
                break
            if batch is None:
                return None
            changed |= batch
        return changed
