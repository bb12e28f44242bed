"""``retry_on_conflict``: re-read after a 409, write the fresh object, give up after N attempts."""

from __future__ import annotations

import pytest

from dra_driver.kube.api import Obj
from dra_driver.kube.errors import KubeError
from dra_driver.kube.writes import retry_on_conflict


def test_a_conflict_is_retried_with_the_re_read_object() -> None:
    seen: list[str] = []
    conflicts: list[int] = []

    def write(current: Obj) -> str:
        seen.append(current["rv"])
        if current["rv"] == "1":
            raise KubeError(409, "conflict")
        return f"written at {current['rv']}"

    result = retry_on_conflict(
        write, {"rv": "1"}, lambda: {"rv": "2"}, on_conflict=lambda: conflicts.append(1)
    )
    assert result == "written at 2" and seen == ["1", "2"] and conflicts == [1]


def test_other_errors_propagate_without_a_re_read() -> None:
    reads: list[int] = []

    def write(current: Obj) -> str:
        raise KubeError(500, "boom")

    with pytest.raises(KubeError) as caught:
        retry_on_conflict(write, {}, lambda: reads.append(1) or {})  # type: ignore[func-returns-value]
    assert caught.value.status == 500 and reads == []


def test_the_last_conflict_propagates_after_every_attempt() -> None:
    attempts: list[int] = []

    def write(current: Obj) -> str:
        attempts.append(1)
        raise KubeError(409, "conflict")

    with pytest.raises(KubeError) as caught:
        retry_on_conflict(write, {}, dict, attempts=3)
    assert caught.value.conflict and len(attempts) == 3
