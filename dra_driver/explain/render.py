"""Plain-text rendering of an :class:`~dra_driver.explain.report.Explanation` for a terminal.

The same text on a terminal and in a pipe: plain lines and columns, nothing decorated. ``wide``
adds to each card the fix for its reason (what the summary says per reason).
"""

from __future__ import annotations

from dra_driver.explain.report import FIXES, Explanation

#: Nodes named per reason in the one-line summary of refused nodes (the rest are counted).
NODES_NAMED = 8


def _nodes_refused(refused: dict[str, str]) -> str:
    """``2 TaintToleration (node-a, node-b); 1 InsufficientCPU (node-c)``, most frequent first."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in refused.items():
        by_reason.setdefault(reason, []).append(node)
    parts = []
    for reason, nodes in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        named = ", ".join(sorted(nodes)[:NODES_NAMED]) + (", ..." if len(nodes) > NODES_NAMED else "")
        parts.append(f"{len(nodes)} {reason} ({named})")
    return "; ".join(parts)


def _reason_line(reason: str, message: str) -> str:
    """``reason: message``, the reason once: a quota refusal's message already starts with it."""
    return message if message.startswith(f"{reason}: ") else f"{reason}: {message}"


def render(explanation: Explanation, wide: bool = False) -> str:
    # A priority is named only where one was set: pending pods are planned higher priorities first.
    priority = f" (priority {explanation.priority})" if explanation.priority else ""
    lines = [f"Pod {explanation.pod}: {explanation.state}{priority}"]
    for claim in explanation.claims:
        devices = ", ".join(claim.devices) or "-"
        lines.append(f"  claim {claim.pod_claim} -> {claim.claim or '(not created yet)'}: {devices}")
    for label, reported in (("pending", explanation.pending), ("now", explanation.now)):
        if reported:
            lines.append(f"  {label}: {_reason_line(*reported)}")
    gang = explanation.gang
    if gang is not None:
        state = "can be placed now" if gang.ready else "waits"
        lines.append(
            f"  gang: {gang.placeable} of {gang.members} members placeable now, needs {gang.needed}: {state}"
        )
        if explanation.now is None or explanation.now[1] != gang.summary:
            lines.append(f"    {gang.summary}")
    refused = _nodes_refused(explanation.nodes_refused)
    if refused:
        lines.append(f"  nodes the pod cannot run on: {refused}")
    lines += _preemption_lines(explanation)
    if explanation.decided_at:
        lines.append(f"  decided at {explanation.decided_at} (scores as the controller saw them then)")
    elif explanation.requests:
        lines.append("  evaluated now against the cluster (the controller re-plans it the same way)")
    for request in explanation.requests:
        lines.append(f"  {request.subject}")
        lines.append(f"    config: {request.config}")
        chosen = f"{request.node}/{','.join(request.devices)}" if request.node else "none"
        lines.append(f"    chosen: {chosen}")
        header = f"    {'CARD':<32} {'SCORE':>10}  RESULT"
        if wide:
            results = ["chosen" if c.chosen else (c.reason or "eligible") for c in request.cards]
            width = max(len(r) for r in ["RESULT", *results])
            header = f"    {'CARD':<32} {'SCORE':>10}  {'RESULT':<{width}}  FIX"
        lines.append(header)
        for card in request.cards:
            result = "chosen" if card.chosen else (card.reason or "eligible")
            line = f"    {card.device:<32} {card.score:>10.4f}  {result}"
            if wide:
                fix = FIXES.get(card.reason or "", "") if not card.chosen else ""
                line = f"    {card.device:<32} {card.score:>10.4f}  {result:<{width}}  {fix or '-'}"
            lines.append(line.rstrip())
            if card.note:  # a MIG instance: where it sits and what taking it leaves free
                lines.append(f"      {card.note}")
        if request.omitted:
            lines.append(f"    ... {request.omitted} more cards")
    fixes = explanation.fixes()
    if fixes:
        lines.append("  what would make it fit:")
        for reason, count, fix in fixes:
            lines.append(f"    {count} card(s) {reason}: {fix or '-'}")
    if explanation.note:
        lines.append(f"  note: {explanation.note}")
    if explanation.events:
        lines.append("  warnings on the pod (newest last):")
        for event in explanation.events:
            times = f" x{event.count}" if event.count > 1 else ""
            lines.append(
                f"    {event.last_seen} {event.reason}{times} ({event.source or '-'}): {event.message}"
            )
            if event.hint:
                lines.append(f"      what to do: {event.hint}")
    return "\n".join(lines)


def _preemption_lines(explanation: Explanation) -> list[str]:
    """Its nomination (victims evicted for it, the node holding its capacity) and the victims
    preemption would choose now, or why none."""
    preemption = explanation.preemption
    if preemption is None:
        return []
    lines = []
    if preemption.nominated_node:
        evicted = ", ".join(preemption.evicted) or "none (pods already terminating)"
        lines.append(
            f"  nominated to node {preemption.nominated_node} at {preemption.nominated_at or '-'}: "
            f"evicted {evicted}; the capacity is held for it while they terminate"
        )
    label = f"preemption for its whole {preemption.gang}" if preemption.gang else "preemption"
    if preemption.node and preemption.gang:
        if preemption.victims:
            victims = ", ".join(f"{v.pod} (priority {v.priority}) on {v.node}" for v in preemption.victims)
            lines.append(f"  {label}: would evict {victims}")
        else:
            lines.append(f"  {label}: waits for {_waiting(preemption.waiting)}")
    elif preemption.node:
        if preemption.victims:
            victims = ", ".join(f"{v.pod} (priority {v.priority})" for v in preemption.victims)
            lines.append(f"  preemption: would evict {victims} on node {preemption.node}")
        else:
            lines.append(f"  preemption: waits on node {preemption.node} for {_waiting(preemption.waiting)}")
    elif preemption.why_not:
        lines.append(f"  {label}: {preemption.why_not}")
    return lines


def _waiting(pods: tuple[str, ...]) -> str:
    """What a preemptor with no new victims waits for: pods terminating, or claims being released
    (their pods gone already)."""
    return f"{', '.join(pods)} to terminate" if pods else "claims being released (their pods are gone)"
