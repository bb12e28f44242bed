"""Did-you-mean: the known name closest to a mistyped one, for flags, choices and file fields.

A typo that is only refused (``memroy: Extra inputs are not permitted``) leaves the user to find
the right spelling in the docs; naming it (``did you mean 'memory'?``) fixes it on the spot.
difflib's ratio with its usual cutoff suggests only names that are plainly close.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Iterator
from typing import Any

#: How close a candidate must be (difflib's ratio) to be suggested.
CUTOFF = 0.6


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be, if one is close enough."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CUTOFF)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'memory'?"``, or ``""`` when nothing is close."""
    suggestion = closest(word, candidates)
    return f"; did you mean {suggestion!r}?" if suggestion else ""


def _models(annotation: Any) -> Iterator[Any]:
    """The pydantic models an annotation holds (``X | None``, ``list[X]``, ``Annotated[X, ...]``)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _models(typing.get_args(annotation)[0])
        return
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        for argument in typing.get_args(annotation):
            yield from _models(argument)


def field_names(model: Any, location: tuple[int | str, ...]) -> list[str]:
    """The field names a user may write at ``location`` below ``model`` (a pydantic error's ``loc``
    without its last item): each field's alias where it has one, else its name. Empty when the
    location is not a model (a mapping of free keys)."""
    current: Any = model
    for step in location:
        if isinstance(step, int):
            continue  # an item of a list: the list's model, already current
        fields = getattr(current, "model_fields", None)
        if fields is None:
            return []
        info = next((f for name, f in fields.items() if step in (name, f.alias)), None)
        if info is None:
            return []
        current = next(_models(info.annotation), None)
        if current is None:
            return []
    fields = getattr(current, "model_fields", {})
    return [info.alias or name for name, info in fields.items()]


def unknown_field_hint(model: Any, location: tuple[int | str, ...]) -> str:
    """For pydantic's ``extra_forbidden`` error at ``location``: ``"; did you mean 'memory'?"``."""
    if not location or not isinstance(location[-1], str):
        return ""
    return did_you_mean(location[-1], field_names(model, tuple(location[:-1])))
