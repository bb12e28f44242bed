"""Paged lists: an informer's initial list in pages of ``limit`` items, like client-go's pager.

At 50,000 pods one unpaged list is one response of several hundred megabytes, decoded whole
before the first object can be slimmed: the process briefly holds the raw bytes, the decoded
dicts and the cache being built. Paged, only one page is raw at a time; each page's items are
handed to ``keep`` (the informer's transform) and the raw page is dropped before the next.

While a list is read, Python's cyclic garbage collector is paused (:func:`collection_paused`):
decoded JSON has no reference cycles, so every page's dicts are freed by reference counting the
moment they are dropped, but the collector still counts them, promotes those alive at a
collection into the oldest generation, and so runs full collections over every object already
cached, over and over (hack/bench_memory.py, 2,000 nodes and 20,000 pods: 30 full collections
and 14.7 s of CPU for the controller's initial sync; paused, 4 and 7.5 s). Paused, no collection
runs until the last list ends; cyclic garbage other threads make meanwhile waits until then.

A continue token expires with the history behind it (410 Gone, after etcd's compaction, about 5
minutes by default). The pages read so far are then a snapshot that can no longer be completed:
they are discarded and the whole list is read again in one unpaged call, as client-go's pager does
with ``FullListIfExpired`` (a second expiry while paging again could repeat forever on a server
that compacts faster than we page).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dra_driver.kube.api import KubeApi, Obj, Resource
from dra_driver.kube.errors import KubeError

log = logging.getLogger(__name__)

#: Items per page: client-go's pager default (``DefaultPageSize``). At about 10 kB of JSON per
#: pod a page is 5 MB on the wire, a few tens of MB decoded: small beside the cache, and 100 pages
#: for 50,000 pods keep the round trips a small part of the list's time.
DEFAULT_PAGE_SIZE = 500


_pause_lock = threading.Lock()
_pauses = 0
_resume = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while any caller is inside (informers list in
    parallel: the last one out turns it back on, if it was on when the first came in)."""
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


@dataclass(frozen=True, slots=True)
class Listing:
    """A complete list: what ``keep`` returned for each item, and the list's resourceVersion (where
    the watch starts)."""

    items: list[Obj]
    resource_version: str
    #: Pages read (1 for an unpaged list); ``expired``: a continue token expired on the way.
    pages: int
    expired: bool = False


def list_all(
    kube: KubeApi,
    resource: Resource,
    keep: Callable[[Obj], Obj],
    *,
    field_selector: str | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Listing:
    """Every object of ``resource`` (matching ``field_selector``), each passed through ``keep`` as
    soon as its page arrives; ``page_size`` 0 lists in one call.

    Errors other than an expired continue token propagate (the informer retries the whole list).
    """
    with collection_paused():
        return _list_pages(kube, resource, keep, field_selector, page_size)


def _list_pages(
    kube: KubeApi, resource: Resource, keep: Callable[[Obj], Obj], field_selector: str | None, page_size: int
) -> Listing:
    kept: list[Obj] = []
    token: str | None = None
    pages = 0
    while True:
        try:
            page = kube.list(
                resource, field_selector=field_selector, limit=page_size or None, continue_from=token
            )
        except KubeError as err:
            if not (err.gone and token):
                raise
            log.info("%s: list continue token expired after %d pages; listing again unpaged",
                     resource.plural, pages)  # fmt: skip
            return _unpaged(kube, resource, keep, field_selector, pages)
        pages += 1
        kept.extend(keep(item) for item in page.get("items") or ())
        meta = page.get("metadata") or {}
        token = meta.get("continue") or None
        if not token:
            return Listing(kept, str(meta.get("resourceVersion", "")), pages)


def _unpaged(
    kube: KubeApi, resource: Resource, keep: Callable[[Obj], Obj], field_selector: str | None, pages: int
) -> Listing:
    page = kube.list(resource, field_selector=field_selector)
    items = [keep(item) for item in page.get("items") or ()]
    version = str((page.get("metadata") or {}).get("resourceVersion", ""))
    return Listing(items, version, pages + 1, expired=True)
