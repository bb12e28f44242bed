"""The placement decision, recorded on the pod as the controller computed it, for ``hami-dra explain``.

A decision is only explainable from what the engine saw when it decided: recomputing it later
from the cluster's new state would show other scores. So the controller writes, in the same patch
that lifts the gate, the annotation :func:`decision_annotation` holding per request the policy
chain with where each setting came from, the chosen node and devices, and each candidate card's
score and reason (the best :data:`MAX_CARDS` by score, chosen ones first, and how many were left
out). It is informational: a tenant may edit its own pod's annotations, so nothing reads it back
but ``explain``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.engine import Decision


def decision_annotation(driver: str) -> str:
    """``<driver>/decision``: follows the driver name like every key of ours (the chart's
    controller-pods policy admits exactly this key)."""
    return f"{driver}/decision"


#: Cards kept per request (the annotation must stay small on clusters of thousands of GPUs).
MAX_CARDS = 16
RECORD_VERSION = 1


@dataclass(frozen=True)
class CardRecord:
    device: str
    score: float
    chosen: bool
    reason: str | None
    #: What else decided its place: a MIG instance's placement and what taking it leaves free.
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"device": self.device, "score": round(self.score, 6)}
        if self.chosen:
            data["chosen"] = True
        if self.reason:
            data["reason"] = self.reason
        if self.note:
            data["note"] = self.note
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CardRecord:
        reason = data.get("reason")
        return cls(
            str(data["device"]),
            float(data["score"]),
            bool(data.get("chosen")),
            reason and str(reason),
            str(data.get("note") or ""),
        )


@dataclass(frozen=True)
class RequestRecord:
    """One request's decision: ``subject`` as the logs name it, its resolved config, the cards."""

    subject: str
    config: str
    node: str | None
    devices: tuple[str, ...]
    cards: tuple[CardRecord, ...]
    omitted: int = 0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "subject": self.subject,
            "config": self.config,
            "node": self.node,
            "devices": list(self.devices),
            "cards": [card.to_json() for card in self.cards],
        }
        if self.omitted:
            data["omitted"] = self.omitted
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(
            subject=str(data["subject"]),
            config=str(data.get("config", "")),
            node=data.get("node") and str(data["node"]),
            devices=tuple(str(d) for d in data.get("devices") or ()),
            cards=tuple(CardRecord.from_json(card) for card in data.get("cards") or ()),
            omitted=int(data.get("omitted", 0)),
        )


def request_record(
    subject: str, decision: Decision, config: str, device_name: Callable[[str, int], str]
) -> RequestRecord:
    """What the decision annotation keeps of one engine decision."""
    ranked = sorted(
        decision.candidates, key=lambda card: (not card.chosen, -card.score, card.node, card.index)
    )
    cards = tuple(
        CardRecord(
            f"{card.node}/{card.device or device_name(card.node, card.index)}",
            card.score,
            card.chosen,
            card.reason.value if card.reason else None,
            card.note,
        )
        for card in ranked[:MAX_CARDS]
    )
    placement = decision.placement
    node = placement.node if placement is not None else None
    devices = (
        tuple(device_name(node, share.index) for share in placement.devices) if node and placement else ()
    )
    return RequestRecord(subject, config, node, devices, cards, max(0, len(ranked) - MAX_CARDS))


def encode(records: Sequence[RequestRecord], decided_at: str) -> str:
    """The annotation's value: compact JSON, versioned."""
    body = {"version": RECORD_VERSION, "decidedAt": decided_at, "requests": [r.to_json() for r in records]}
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def decode(value: str) -> tuple[str, list[RequestRecord]]:
    """``(decidedAt, records)``; ValueError for anything that is not a record of a known version."""
    try:
        body = json.loads(value)
        if not isinstance(body, dict) or body.get("version") != RECORD_VERSION:
            raise ValueError(f"not a version-{RECORD_VERSION} decision record")
        return str(body.get("decidedAt", "")), [
            RequestRecord.from_json(r) for r in body.get("requests") or ()
        ]
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"unreadable decision record: {err}") from None


def placement_summary(value: str) -> str:
    """The Normal ``Allocated`` event's one line: per request the node, devices and policy."""
    try:
        _, records = decode(value)
    except ValueError:
        return "allocated"
    parts = [
        f"{r.subject} -> {r.node}/{','.join(r.devices)} ({r.config.split(' ', 1)[0]})"
        for r in records
        if r.node
    ]
    return "; ".join(parts) or "allocated (no GPU request of ours)"
