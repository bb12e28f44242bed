"""Plain-text rendering of an :class:`~dra_driver.explain.report.Explanation` for a terminal."""

from __future__ import annotations

from dra_driver.explain.report import Explanation


def render(explanation: Explanation) -> str:
    lines = [f"Pod {explanation.pod}: {explanation.state}"]
    for claim in explanation.claims:
        devices = ", ".join(claim.devices) or "-"
        lines.append(f"  claim {claim.pod_claim} -> {claim.claim or '(not created yet)'}: {devices}")
    if explanation.pending:
        reason, message = explanation.pending
        lines.append(f"  pending: {reason}: {message}")
    if explanation.decided_at:
        lines.append(f"  decided at {explanation.decided_at} (scores as the controller saw them then)")
    elif explanation.requests:
        lines.append("  evaluated now against the cluster (the controller re-plans it the same way)")
    for request in explanation.requests:
        lines.append(f"  {request.subject}")
        lines.append(f"    config: {request.config}")
        chosen = f"{request.node}/{','.join(request.devices)}" if request.node else "none"
        lines.append(f"    chosen: {chosen}")
        lines.append(f"    {'CARD':<32} {'SCORE':>10}  RESULT")
        for card in request.cards:
            result = "chosen" if card.chosen else (card.reason or "eligible")
            lines.append(f"    {card.device:<32} {card.score:>10.4f}  {result}")
        if request.omitted:
            lines.append(f"    ... {request.omitted} more cards")
    fixes = explanation.fixes()
    if fixes:
        lines.append("  what would make it fit:")
        for reason, count, fix in fixes:
            lines.append(f"    {count} card(s) {reason}: {fix or '-'}")
    if explanation.note:
        lines.append(f"  note: {explanation.note}")
    return "\n".join(lines)
