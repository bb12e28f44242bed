"""The ``nvlinkPeers`` slice attribute: NVLink peers encoded by the plugin, read back by the controller.

One module owns the wire format and HAMi's pair weighting so the writer (the kubelet plugin's
slice builder) and the reader (the controller's inventory) can never drift apart; both may import
``dra_driver.devices`` without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

#: HAMi's link weight: a pair of GPUs joined by ``k`` NVLinks scores ``100 * k`` (calculate_score.go).
NVLINK_PAIR_WEIGHT = 100


def pair_scores(peers: Iterable[tuple[int, int]]) -> Mapping[int, int]:
    """``(peer index, NVLinks)`` pairs -> the engine's pair scores by peer index."""
    return {peer: NVLINK_PAIR_WEIGHT * links for peer, links in peers}


def nvlink_peers_attribute(peers: Sequence[tuple[int, int]]) -> str:
    """Encode NVLink peers compactly for the ``nvlinkPeers`` string attribute.

    Peers with the same link count are grouped and runs of indexes collapsed:
    ``[(1, 18), (2, 18), (3, 18), (5, 4)]`` -> ``"18:1-3;4:5"``. Eight NVSwitch-connected GPUs need
    only ``"18:1-7"``, so even large nodes stay within the 64-character limit.
    """
    groups: dict[int, list[int]] = {}
    for peer, links in sorted(peers):
        groups.setdefault(links, []).append(peer)
    return ";".join(f"{links}:{_ranges(groups[links])}" for links in sorted(groups, reverse=True))


def parse_nvlink_peers(text: str) -> tuple[tuple[int, int], ...]:
    """Inverse of :func:`nvlink_peers_attribute`; raises ``ValueError`` on malformed input."""
    peers: dict[int, int] = {}
    for group in filter(None, text.split(";")):
        links_text, _, ranges = group.partition(":")
        links = int(links_text)
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for peer in range(int(first), int(last or first) + 1):
                peers[peer] = links
    return tuple(sorted(peers.items()))


def _ranges(indexes: list[int]) -> str:
    runs: list[list[int]] = []
    for index in indexes:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
