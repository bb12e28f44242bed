"""``dra_driver/metrics_page.py``: large gauge families rendered once per piece, not per scrape.

What must hold: the page a scrape gets is what prometheus_client would have written for the same
families (both content types, label values that need escaping, families without samples); a
piece's text is made once while it is published and forgotten once it is not; every other
collector of the registry is still on the page and still readable through ``collect``.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.metrics_page import Encoder, PageRegistry, Piece, PieceText

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"
ACCEPTS = pytest.mark.parametrize(
    "accept", ["", "text/plain", OPENMETRICS], ids=["none", "text", "openmetrics"]
)

FAMILIES: dict[str, tuple[str, Sequence[str]]] = {
    "t_gpu_memory_bytes": ('Memory of a "card"\\ with a\nnewline in its help', ("node", "device")),
    "t_gpu_tenants": ("Tenants", ("node", "device")),
    "t_never_set": ("A family no piece has samples of", ("node",)),
}


class PieceMap(dict[str, Sequence[tuple[tuple[str, ...], float]]]):
    """A piece that can be weakly referenced (a plain dict cannot), to see it forgotten."""


def node_piece(node: str, memory: float, tenants: int = 1) -> PieceMap:
    return PieceMap(
        t_gpu_memory_bytes=(((node, "gpu-0"), memory), ((node, 'gpu-"1"\\\n'), memory / 2)),
        t_gpu_tenants=(((node, "gpu-0"), float(tenants)),),
    )


class Snapshot:
    """The controller's ``_Snapshot`` reduced to what the page needs: pieces, collect, render."""

    def __init__(self, families: Mapping[str, tuple[str, Sequence[str]]]) -> None:
        self.families = families
        self.pieces: list[Piece] = []
        self.text = PieceText(families)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (documentation, labels) in self.families.items():
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for piece in self.pieces:
                for values, value in piece.get(name, ()):
                    family.add_metric(list(values), value)
            yield family

    def render(self, encoder: Encoder, content_type: str) -> bytes:
        return self.text.render(self.pieces, encoder, content_type)


def registries(pieces: list[Piece]) -> tuple[PageRegistry, CollectorRegistry]:
    """The same collectors twice: a page registry with the snapshot prerendered, and a plain one."""
    page_registry, plain = PageRegistry(), CollectorRegistry()
    for registry in (page_registry, plain):
        Counter("t_things_total", "Things", ["kind"], registry=registry).labels("a").inc(3)
    snapshot = Snapshot(FAMILIES)
    snapshot.pieces = pieces
    page_registry.register_prerendered(snapshot)
    plain.register(snapshot)
    return page_registry, plain


@ACCEPTS
def test_the_page_is_what_the_encoder_writes_for_the_same_families(accept: str) -> None:
    page_registry, plain = registries([node_piece("n1", 1e9), node_piece("n2", 2.5e10, tenants=3)])
    encoder, content_type = choose_encoder(accept)
    body, served_type = page_registry.page(accept)
    assert served_type == content_type
    assert body == encoder(plain)  # byte for byte: header, escaping, number format, EOF


@ACCEPTS
def test_a_page_without_pieces_keeps_every_familys_header(accept: str) -> None:
    page_registry, plain = registries([])
    encoder, _ = choose_encoder(accept)
    body, _ = page_registry.page(accept)
    assert body == encoder(plain)
    assert b"# TYPE t_never_set gauge" in body


def test_openmetrics_ends_with_one_eof() -> None:
    page_registry, _ = registries([node_piece("n1", 1.0)])
    body, _ = page_registry.page(OPENMETRICS)
    assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1


def test_a_new_piece_replaces_the_old_and_only_it_is_rendered() -> None:
    snapshot = Snapshot(FAMILIES)
    snapshot.pieces = [node_piece("n1", 1.0), node_piece("n2", 2.0)]
    encoder, content_type = choose_encoder("")
    calls: list[int] = []

    def counting(collector: Any) -> bytes:
        calls.append(len(list(collector.collect())))
        return encoder(collector)

    snapshot.render(counting, content_type)
    first = len(calls)
    snapshot.pieces = [snapshot.pieces[0], node_piece("n2", 7.0)]
    text = snapshot.render(counting, content_type).decode()
    assert len(calls) == first + 1  # the new piece only; n1's text and the headers were kept
    values = {
        (sample.name, sample.labels["node"], sample.labels["device"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert values[("t_gpu_memory_bytes", "n2", "gpu-0")] == 7.0
    assert values[("t_gpu_memory_bytes", "n1", "gpu-0")] == 1.0
    assert len(values) == 6  # the old n2 piece's samples are gone


def test_a_piece_no_longer_published_is_forgotten() -> None:
    snapshot = Snapshot(FAMILIES)
    gone = node_piece("n1", 1.0)
    watch = weakref.ref(gone)
    snapshot.pieces = [gone, node_piece("n2", 2.0)]
    encoder, content_type = choose_encoder("")
    snapshot.render(encoder, content_type)
    snapshot.pieces = snapshot.pieces[1:]
    del gone
    gc.collect()
    assert watch() is not None  # kept for its text until a scrape sees it unpublished
    snapshot.render(encoder, content_type)
    gc.collect()
    assert watch() is None


def test_collect_still_sees_the_prerendered_families() -> None:
    page_registry, _ = registries([node_piece("n1", 5.0)])
    assert page_registry.get_sample_value("t_gpu_memory_bytes", {"node": "n1", "device": "gpu-0"}) == 5.0
    assert page_registry.get_sample_value("t_things_total", {"kind": "a"}) == 3.0


def test_an_unregistered_collector_leaves_the_page() -> None:
    page_registry = PageRegistry()
    counter = Counter("t_gone_total", "Gone", registry=page_registry)
    snapshot = Snapshot(FAMILIES)
    page_registry.register_prerendered(snapshot)
    page_registry.unregister(counter)
    page_registry.unregister(snapshot)
    body, _ = page_registry.page("")
    assert body == b""


def test_warm_renders_every_piece_ahead_so_the_next_scrape_renders_none() -> None:
    page_registry, plain = registries([node_piece("n1", 1.0), node_piece("n2", 2.0)])
    snapshot = next(c for c in page_registry._prerendered if isinstance(c, Snapshot))
    rendered: list[str] = []
    original = snapshot.text._piece_families

    def counting(piece: Piece) -> Iterator[GaugeMetricFamily]:
        rendered.append(next(iter(piece.values()))[0][0][0])
        return original(piece)

    snapshot.text._piece_families = counting  # type: ignore[method-assign]
    thread = page_registry.warm(OPENMETRICS)
    assert thread is not None
    thread.join(timeout=10)
    assert sorted(rendered) == ["n1", "n2"]
    body, _ = page_registry.page(OPENMETRICS)
    assert sorted(rendered) == ["n1", "n2"]  # the scrape joined the kept text, rendered nothing
    assert body == choose_encoder(OPENMETRICS)[0](plain)
    # the text format was not warmed: its first scrape renders both pieces
    page_registry.page("text/plain")
    assert len(rendered) == 4


def test_the_default_warm_up_is_for_what_prometheus_asks() -> None:
    from dra_driver.metrics_page import PROMETHEUS_ACCEPT

    _, content_type = choose_encoder(PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text")
