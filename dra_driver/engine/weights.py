"""Scoring weights for the card usage score, including HAMi's ``slot=a,core=b,memory=c`` syntax.

Error texts match HAMi's ``ParseDeviceScoringWeights`` so the compatibility annotation
``hami.io/device-scoring-weights`` fails the same way it does under HAMi.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_KEYS = ("slot", "core", "memory")
#: The largest weight accepted. Scores are float32 sums (engine/score.py), so a weight has to stay
#: far below float32's range; a million lets any ratio between terms be expressed (HAMi's annotation
#: has no bound, and a 400-digit weight overflowed the float conversion).
MAX_WEIGHT = 1_000_000


class WeightsError(ValueError):
    """An invalid weights value; the message says which entry is wrong."""


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    slot: int = 1
    core: int = 1
    memory: int = 1

    def __post_init__(self) -> None:
        for key in _KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WeightsError(f'"{key}" weight must be an integer')
            if value < 0:
                raise WeightsError(f'"{key}" weight must not be negative')
            if value > MAX_WEIGHT:
                raise WeightsError(f'"{key}" weight must be at most {MAX_WEIGHT}')
        if not (self.slot or self.core or self.memory):
            raise WeightsError("at least one weight must be positive")

    def __str__(self) -> str:
        return f"slot={self.slot},core={self.core},memory={self.memory}"


DEFAULT_WEIGHTS = ScoringWeights()


def _shorten(text: str, limit: int = 80) -> str:
    """A tenant-supplied value quoted in a message, cut to a readable length."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def parse_scoring_weights(text: str) -> ScoringWeights:
    """Parse ``slot=1,core=2,memory=3`` (any key order, whitespace trimmed, all three keys required)."""
    entries = text.split(",")
    if len(entries) != len(_KEYS):
        raise WeightsError(
            f"invalid scoring weights {_shorten(text)!r}: expected slot, core, and memory weights"
        )
    values: dict[str, int] = {}
    for entry in entries:
        if "=" not in entry:
            raise WeightsError(f"invalid scoring weights {_shorten(text)!r}: expected key=value entries")
        key, _, raw_value = entry.partition("=")
        key, raw_value = key.strip(), raw_value.strip()
        if key not in _KEYS:
            raise WeightsError(f'invalid scoring weights {_shorten(text)!r}: unknown weight "{key}"')
        if key in values:
            raise WeightsError(f'invalid scoring weights {_shorten(text)!r}: duplicate "{key}" weight')
        if not _INTEGER.match(raw_value):
            raise WeightsError(
                f'invalid scoring weights {_shorten(text)!r}: "{key}" weight must be an integer'
            )
        # Bounded before int(): a long digit string is refused without converting it (Python
        # refuses over 4300 digits with a plain ValueError, and anything over 7 is out of range).
        digits = raw_value.lstrip("+-").lstrip("0")
        if len(digits) > len(str(MAX_WEIGHT)) or int(raw_value) > MAX_WEIGHT:
            raise WeightsError(
                f'invalid scoring weights {_shorten(text)!r}: "{key}" weight must be at most {MAX_WEIGHT}'
            )
        value = int(raw_value)
        if value < 0:
            raise WeightsError(
                f'invalid scoring weights {_shorten(text)!r}: "{key}" weight must not be negative'
            )
        values[key] = value
    if not any(values.values()):
        raise WeightsError(
            f"invalid scoring weights {_shorten(text)!r}: at least one weight must be positive"
        )
    return ScoringWeights(**values)
