"""Where ResourceSlices changed between two inventory rebuilds: nodes of changed pools, or anywhere."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.slice_changes import SliceChanges

DRIVER = "gpu.hami.io"


def slice_of(node: str | None, pool: Any = "p", driver: str = DRIVER) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool} if isinstance(pool, str) else pool}
    if node is not None:
        spec["nodeName"] = node
    return {"spec": spec}


def test_nothing_changed_before_the_first_event() -> None:
    changes = SliceChanges(DRIVER)
    assert changes.changed is False
    changes.note(None, slice_of("n1"))
    assert changes.changed is True
    changes.take([])
    assert changes.changed is False


def test_place_reads_pool_and_node_of_our_slices_only() -> None:
    changes = SliceChanges(DRIVER)
    assert changes.place(slice_of("n1", "p1")) == ("p1", "n1")
    assert changes.place(slice_of("n1", driver="other")) == (None, None)
    assert changes.place({"spec": "bad"}) == (None, None)
    assert changes.place(slice_of(None, {})) == ("", None)
    assert changes.place(slice_of("", None)) == ("", None)


def test_a_changed_pool_wakes_every_node_publishing_it_now() -> None:
    changes = SliceChanges(DRIVER)
    changes.note(slice_of("n1", "p1"), slice_of("n2", "p1"))
    current = [slice_of("n3", "p1"), slice_of("n4", "p2"), slice_of("n5", "p1", driver="other")]
    assert changes.take(current) == {"n1", "n2", "n3"}
    assert changes.take(current) == set()


def test_a_deleted_slice_still_counts_after_a_foreign_one() -> None:
    changes = SliceChanges(DRIVER)
    changes.note(slice_of("n9", driver="other"), slice_of("n1", "p1"))
    assert changes.take([]) == {"n1"}


def test_a_slice_without_a_node_means_anywhere_until_taken() -> None:
    changes = SliceChanges(DRIVER)
    changes.note(None, slice_of(None, "p1"))
    changes.note(None, slice_of("n1", "p2"))
    assert changes.take([slice_of("n2", "p2")]) is None
    changes.note(None, slice_of("n1", "p2"))
    assert changes.take([]) == {"n1"}
