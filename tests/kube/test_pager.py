"""Paged lists (dra_driver/kube/pager.py) and what an informer keeps (dra_driver/kube/watch.py):
pages joined in order, an expired continue token answered by one unpaged list, every listed and
watched object through the transform, the field selector on the list and on the watch."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from dra_driver.kube.api import PODS, RESOURCE_SLICES, Obj, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.kube.pager import collection_paused, list_all
from dra_driver.kube.watch import Informer, drop_managed_fields


def item(index: int, driver: str = "gpu.hami.io") -> Obj:
    return {
        "metadata": {"name": f"obj-{index:03}", "resourceVersion": str(index), "managedFields": [{"m": 1}]},
        "spec": {"driver": driver},
    }


@dataclass
class PagedApi:
    """A list endpoint with continue tokens (``expire``: how many continue calls answer 410) and a
    watch that delivers ``events`` once; every call is recorded."""

    items: list[Obj]
    expire: int = 0
    events: list[Obj] = field(default_factory=list)
    lists: list[tuple[int | None, str | None, str | None]] = field(default_factory=list)
    watches: list[str | None] = field(default_factory=list)

    def list(
        self,
        resource: Resource,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
    ) -> Obj:
        self.lists.append((limit, continue_from, field_selector))
        if continue_from and self.expire:
            self.expire -= 1
            raise KubeError(410, "The provided continue parameter is too old")
        start = int(continue_from or 0)
        end = start + limit if limit else len(self.items)
        meta: Obj = {"resourceVersion": "500"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return {
            "items": [dict(i, metadata=dict(i["metadata"])) for i in self.items[start:end]],
            "metadata": meta,
        }

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> Iterator[Obj]:
        self.watches.append(field_selector)
        return iter(self.events)

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        raise NotImplementedError

    def create(self, resource: Resource, namespace: str | None, obj: Obj) -> Obj:
        raise NotImplementedError

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
        raise NotImplementedError


def names(items: list[Obj]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def test_pages_are_joined_in_order_and_each_item_is_kept_as_its_page_arrives() -> None:
    api = PagedApi([item(i) for i in range(7)])
    seen_pages: list[int] = []

    def keep(obj: Obj) -> Obj:
        seen_pages.append(len(api.lists))
        return {"metadata": {"name": obj["metadata"]["name"]}}

    listing = list_all(api, RESOURCE_SLICES, keep, page_size=3, field_selector="spec.driver=x")
    assert names(listing.items) == [f"obj-{i:03}" for i in range(7)]
    assert (listing.pages, listing.resource_version, listing.expired) == (3, "500", False)
    assert api.lists == [(3, None, "spec.driver=x"), (3, "3", "spec.driver=x"), (3, "6", "spec.driver=x")]
    assert seen_pages == [1, 1, 1, 2, 2, 2, 3], "an item is kept before the next page is asked for"


def test_an_expired_continue_token_lists_everything_again_in_one_call() -> None:
    api = PagedApi([item(i) for i in range(5)], expire=1)
    listing = list_all(api, PODS, lambda obj: obj, page_size=2)
    assert names(listing.items) == [f"obj-{i:03}" for i in range(5)], "no item twice, none lost"
    assert listing.expired and listing.pages == 2
    assert api.lists == [(2, None, None), (2, "2", None), (None, None, None)]


def test_an_expired_first_page_is_the_callers_error() -> None:
    """Without a token there is nothing to complete: the informer retries its whole list."""

    class Gone(PagedApi):
        def list(self, resource: Resource, **_: object) -> Obj:
            raise KubeError(410, "too old resource version")

    with pytest.raises(KubeError) as raised:
        list_all(Gone([]), PODS, lambda obj: obj)
    assert raised.value.gone


def test_page_size_zero_lists_in_one_call() -> None:
    api = PagedApi([item(i) for i in range(4)])
    assert len(list_all(api, PODS, lambda obj: obj, page_size=0).items) == 4
    assert api.lists == [(None, None, None)]


def test_the_informer_keeps_only_what_its_transform_returns_listed_or_watched() -> None:
    added = {"type": "ADDED", "object": item(9)}
    modified = {"type": "MODIFIED", "object": dict(item(1), spec={"driver": "gpu.hami.io", "new": True})}
    deleted = {"type": "DELETED", "object": item(2)}
    api = PagedApi([item(i) for i in range(3)], events=[added, modified, deleted])
    changes: list[tuple[Obj | None, Obj | None]] = []

    def slim(obj: Obj) -> Obj:
        meta = obj["metadata"]
        return {
            "metadata": {"name": meta["name"], "resourceVersion": meta["resourceVersion"]},
            "kept": obj["spec"].get("new", False),
        }

    informer = Informer(
        api, RESOURCE_SLICES, lambda _kind, old, new: changes.append((old, new)),
        transform=slim, field_selector="spec.driver=gpu.hami.io", page_size=2,
    )  # fmt: skip
    informer._relist()
    informer._watch()
    assert sorted(informer.cache) == ["obj-000", "obj-001", "obj-009"]
    assert informer.cache["obj-001"] == {
        "metadata": {"name": "obj-001", "resourceVersion": "1"},
        "kept": True,
    }
    assert all(set(obj) == {"metadata", "kept"} for obj in informer.cache.values())
    assert all(set(obj) == {"metadata", "kept"} for change in changes for obj in change if obj is not None)
    assert [limit for limit, _, _ in api.lists] == [2, 2]
    assert {selector for _, _, selector in api.lists} == {"spec.driver=gpu.hami.io"}
    assert api.watches == ["spec.driver=gpu.hami.io"]
    assert informer.resource_version == "2"


def test_by_default_an_informer_drops_managed_fields_only() -> None:
    api = PagedApi([item(0)])
    informer = Informer(api, PODS, lambda *_: None)
    informer._relist()
    assert informer.cache["obj-000"] == {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "obj-000", "resourceVersion": "0"},
        "spec": {"driver": "gpu.hami.io"},
    }  # fmt: skip
    assert drop_managed_fields({"kind": "Node"}) == {"kind": "Node"}


def test_the_collector_is_paused_while_any_list_runs_and_resumed_by_the_last() -> None:
    assert gc.isenabled()
    first, second = collection_paused(), collection_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled(), "another list still runs"
    second.__exit__(None, None, None)
    assert gc.isenabled()
    seen: list[bool] = []
    list_all(PagedApi([item(0)]), PODS, lambda obj: seen.append(gc.isenabled()) or obj)
    assert seen == [False] and gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
