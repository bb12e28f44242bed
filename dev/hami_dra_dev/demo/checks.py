"""What the demo expected versus what it observed; the exit code is 0 only if every check passed.

A demo that prints a wrong placement and still "succeeds" teaches the wrong thing, so each
printed outcome is also recorded here with the expectation from the worked example.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DemoFailure(Exception):
    """A step could not go on (an outcome never appeared); the message says what was waited for."""


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    observed: str
    ok: bool


@dataclass
class Checks:
    items: list[Check] = field(default_factory=list)

    def expect(self, name: str, expected: object, observed: object, ok: bool | None = None) -> bool:
        """Record a check; ``ok`` defaults to ``expected == observed`` (compared as given)."""
        passed = expected == observed if ok is None else ok
        self.items.append(Check(name, _show(expected), _show(observed), passed))
        return passed

    def fail(self, name: str, expected: str, observed: str) -> None:
        self.items.append(Check(name, expected, observed, False))

    @property
    def passed(self) -> bool:
        return bool(self.items) and all(check.ok for check in self.items)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.items if not check.ok]


def _show(value: object) -> str:
    """Lists, tuples and sets as ``a, b, c`` (sorted for sets) so the checks table stays narrow."""
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=str)
    if isinstance(value, (list, tuple)):
        return ", ".join(f"{item:.6f}" if isinstance(item, float) else str(item) for item in value) or "-"
    return str(value)
