"""The /metrics page of a registry whose large gauge families are rendered once per piece.

Why: at 5,000 nodes × 8 GPUs the controller exports seven series per card, 280,000 in all, and
prometheus_client renders every sample of every family on every scrape: 14 s and 43 MiB measured
(``make bench-scale``), past Prometheus's default scrape timeout of 10 s. Those series come in
pieces that are never changed once published (one per node, one per claim holder:
``controller/gpu_series.py``), and between two scrapes few pieces are new. So a piece's sample
lines are rendered the first time a scrape meets it, by prometheus_client's own encoder (the same
escaping, number format and content type as the rest of the page), kept while the piece is
published, and a scrape joins the kept lines of each family under its header.

A ``PageRegistry`` is an ordinary ``CollectorRegistry`` for everyone else: ``collect`` and
``get_sample_value`` still see every family, so tests and ``explain``-style readers need nothing
new; only ``page`` (what the metrics server serves) takes the rendered path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

#: prometheus_client's encoder for one content type: anything with ``collect()`` -> the page.
Encoder = Callable[[Any], bytes]
Sample = tuple[tuple[str, ...], float]
#: One piece: family name -> its samples (never changed once handed over).
Piece = Mapping[str, Sequence[Sample]]
#: The OpenMetrics page's last line; the text format has none.
_EOF = b"# EOF\n"
#: The Accept header Prometheus sends by default (its ``scrape_protocols`` order): the page a real
#: scrape asks for, so the one worth rendering ahead of it.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


class Prerendered(Protocol):
    """A collector that can hand the metrics server its families' text itself."""

    def render(self, encoder: Encoder, content_type: str) -> bytes: ...


class _Families:
    """What an encoder needs: an object whose ``collect`` yields the families to render."""

    def __init__(self, families: Iterable[Any]) -> None:
        self._families = list(families)

    def collect(self) -> list[Any]:
        return self._families


def _without_eof(text: bytes) -> bytes:
    return text[: -len(_EOF)] if text.endswith(_EOF) else text


def sample_lines(encoder: Encoder, families: Iterable[GaugeMetricFamily]) -> dict[str, bytes]:
    """Family name -> its sample lines as ``encoder`` writes them (headers and EOF left out).

    Sample lines never start with ``#`` (a newline in a label value is written ``\\n``), so the
    header lines mark where each family's samples begin."""
    lines: dict[str, list[bytes]] = {}
    current: list[bytes] | None = None
    for line in _without_eof(encoder(_Families(families))).splitlines(keepends=True):
        if line.startswith(b"# TYPE "):
            current = lines.setdefault(line.split(b" ", 3)[2].decode(), [])
        elif not line.startswith(b"#") and current is not None:
            current.append(line)
    return {name: b"".join(chunk) for name, chunk in lines.items()}


class PieceText:
    """The rendered sample lines of published pieces, per content type, kept while published.

    Keyed by the piece object itself (its identity: a piece is never changed, a change publishes a
    new one); a scrape drops the entries of pieces no longer published."""

    def __init__(self, families: Mapping[str, tuple[str, Sequence[str]]]) -> None:
        self.families = families
        self._lock = threading.Lock()
        self._kept: dict[int, tuple[Piece, dict[str, dict[str, bytes]]]] = {}
        self._headers: dict[str, dict[str, bytes]] = {}

    def render(self, pieces: Iterable[Piece], encoder: Encoder, content_type: str) -> bytes:
        """Every family of ``families``: its header, then the sample lines of each piece. The
        text of pieces no longer among ``pieces`` (no longer published) is forgotten."""
        with self._lock:
            published = list(pieces)
            chunks = [self._lines(piece, encoder, content_type) for piece in published]
            headers = self._family_headers(encoder, content_type)
            if len(self._kept) > len(published):
                live = {id(piece) for piece in published}
                for key in [key for key in self._kept if key not in live]:
                    del self._kept[key]
        out: list[bytes] = []
        for name in self.families:
            out.append(headers[name])
            out.extend(lines[name] for lines in chunks if name in lines)
        return b"".join(out)

    def _lines(self, piece: Piece, encoder: Encoder, content_type: str) -> dict[str, bytes]:
        kept = self._kept.get(id(piece))
        if kept is None or kept[0] is not piece:
            kept = (piece, {})
            self._kept[id(piece)] = kept
        rendered = kept[1].get(content_type)
        if rendered is None:
            rendered = sample_lines(encoder, self._piece_families(piece))
            kept[1][content_type] = rendered
        return rendered

    def _piece_families(self, piece: Piece) -> Iterator[GaugeMetricFamily]:
        for name, samples in piece.items():
            if not samples or name not in self.families:
                continue
            documentation, labels = self.families[name]
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for values, value in samples:
                family.add_metric(list(values), value)
            yield family

    def _family_headers(self, encoder: Encoder, content_type: str) -> dict[str, bytes]:
        headers = self._headers.get(content_type)
        if headers is None:
            headers = {
                name: _without_eof(encoder(_Families([GaugeMetricFamily(name, doc, labels=list(labels))])))
                for name, (doc, labels) in self.families.items()
            }
            self._headers[content_type] = headers
        return headers


class PageRegistry(CollectorRegistry):
    """A registry whose ``Prerendered`` collectors write their own text into the served page.

    ``register_prerendered`` registers such a collector as usual (``collect`` still yields its
    families for ``get_sample_value`` and tests) and remembers it; ``page`` renders every other
    collector with prometheus_client's encoder and appends the prerendered text."""

    def __init__(self) -> None:
        super().__init__()
        self._ordinary: list[Collector] = []
        self._prerendered: list[Prerendered] = []
        self._members_lock = threading.Lock()
        self._warming: threading.Thread | None = None

    def register(self, collector: Collector) -> None:
        super().register(collector)
        with self._members_lock:
            self._ordinary.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        with self._members_lock:
            self._ordinary = [c for c in self._ordinary if c is not collector]
            self._prerendered = [c for c in self._prerendered if id(c) != id(collector)]

    def register_prerendered(self, collector: Any) -> None:
        """Register ``collector`` (a ``Collector`` that is also ``Prerendered``)."""
        super().register(collector)
        with self._members_lock:
            self._prerendered.append(collector)

    def warm(self, accept: str = PROMETHEUS_ACCEPT) -> threading.Thread | None:
        """Render the page for ``accept`` once, in the background, and drop it: what it keeps is
        every published piece's text, so the next scrape only joins it.

        Why: the first scrape after a term's first publish renders every piece; at 5,000 nodes × 8
        that took 10 s (``make bench-scale``), Prometheus's default scrape timeout, so the first
        scrapes of a new leader failed. None when a warm-up is already running (it will meet the
        newer pieces too, or the next scrape will)."""
        with self._members_lock:
            if self._warming is not None and self._warming.is_alive():
                return None
            thread = threading.Thread(target=self.page, args=(accept,), name="metrics-warm", daemon=True)
            self._warming = thread
        thread.start()
        return thread

    def page(self, accept: str) -> tuple[bytes, str]:
        """The /metrics body for an ``Accept`` header, and its content type."""
        encoder, content_type = choose_encoder(accept)
        with self._members_lock:
            ordinary, prerendered = list(self._ordinary), list(self._prerendered)
        families = _Families(family for collector in ordinary for family in collector.collect())
        body = encoder(families)
        if not prerendered:
            return body, content_type
        parts = [_without_eof(body), *(c.render(encoder, content_type) for c in prerendered)]
        if body.endswith(_EOF):
            parts.append(_EOF)
        return b"".join(parts), content_type


def page(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """What /metrics serves for ``registry``: a ``PageRegistry``'s own page, else the encoder's."""
    if isinstance(registry, PageRegistry):
        return registry.page(accept)
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
