"""Output of ``hami-dra simulate``: a table per claim, or a stable JSON (or YAML) document.

On a terminal the tables are drawn with rich (boxes, colour, the terminal's width); anywhere else
(a pipe, a file) they are plain kubectl-style columns (:func:`plain_tables`): a title line per
claim, then one line per candidate card, no box drawing, no padding. ``wide`` adds the cores the
card's tenants use.

JSON format (documented in the README; keys are stable, new keys may be added)::

    {"results": [{"claim": str, "allocated": bool, "node": str|null, "policy": str,
                  "unknownPolicies": [str], "devices": [{"node", "index", "name", "memory", "cores"}],
                  "reason": str|null, "quota": str|null (the namespace/name that held it pending),
                  "nodesRefused": [{"node", "reason"}] (--from-cluster: nodes the claim's pod
                                  cannot run on, for a pending claim),
                  "preempts": [{"pod", "priority", "node"}] (--from-cluster: the pods the
                              controller would evict to place it; nothing is evicted),
                  "candidates": [{"node", "index", "name", "productName", "tenants", "usedMemory",
                                  "score", "eligible", "chosen", "reason", "note"}]}]}

Scores are the usage scores before the claim was placed, rounded to 6 decimals; memory in bytes.
A MIG claim's candidates are MIG instances (``engine/mig.py``): ``name`` is the instance's
(``gpu-1-mig-13-0``; ``index`` an engine number), ``score`` and ``tenants`` its card's instances in
use, ``note`` where it sits and what taking it leaves free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from dra_driver.engine import CandidateCard, Decision
from dra_driver.output import YAML, columns, render_document
from dra_driver.quantity import MIB, format_bytes
from dra_driver.simulate.documents import json_text
from dra_driver.simulate.run import Preempted, SimulationResult


def device_name(decision: Decision, node: str, index: int) -> str:
    """The published name of the card (``gpu-<index>``) or MIG instance ``index`` of ``node``."""
    for card in decision.candidates:
        if card.node == node and card.index == index and card.device:
            return card.device
    return f"gpu-{index}"


def _card_name(card: CandidateCard) -> str:
    return card.device or f"gpu-{card.index}"


def decision_to_json(
    decision: Decision,
    quota: str | None = None,
    nodes_refused: Mapping[str, str] | None = None,
    victims: Sequence[Preempted] = (),
) -> dict[str, Any]:
    placement = decision.placement
    return {
        "claim": decision.request,
        "allocated": placement is not None,
        "node": None if placement is None else placement.node,
        "policy": decision.policy.text,
        "unknownPolicies": list(decision.policy.unknown),
        "devices": []
        if placement is None
        else [
            {
                "node": placement.node,
                "index": share.index,
                "name": device_name(decision, placement.node, share.index),
                "memory": share.memory,
                "cores": share.cores,
            }
            for share in placement.devices
        ],
        "reason": decision.reason,
        "quota": quota,
        "nodesRefused": [{"node": node, "reason": why} for node, why in (nodes_refused or {}).items()],
        "preempts": [{"pod": v.pod, "priority": v.priority, "node": v.node} for v in victims],
        "candidates": [
            {
                "node": card.node,
                "index": card.index,
                "name": _card_name(card),
                "productName": card.product_name,
                "tenants": card.tenants,
                "usedMemory": card.used_memory,
                "score": round(card.score, 6),
                "eligible": card.eligible,
                "chosen": card.chosen,
                "reason": None if card.reason is None else card.reason.value,
                **({"note": card.note} if card.note else {}),
            }
            for card in decision.candidates
        ],
    }


def result_document(result: SimulationResult) -> dict[str, Any]:
    return {
        "results": [
            decision_to_json(d, result.blocked_by(i), result.refused_on(i), result.victims_of(i))
            for i, d in enumerate(result.decisions)
        ]
    }


def result_to_json(result: SimulationResult) -> str:
    """Indented down to each result's fields; each device and candidate card on one line."""
    return json_text(result_document(result), depth=4)


def result_to_yaml(result: SimulationResult) -> str:
    """The JSON document as YAML."""
    return render_document(result_document(result), YAML)


def _mib(value: int) -> str:
    return f"{value // MIB}Mi" if value % MIB == 0 else format_bytes(value)


def _outcome(decision: Decision) -> str:
    """``node-1 gpu-0, gpu-1``, or ``PENDING <reason>``."""
    placement = decision.placement
    if placement is None:
        return f"PENDING {decision.reason}"
    names = (device_name(decision, placement.node, share.index) for share in placement.devices)
    return f"{placement.node} " + ", ".join(names)


def _numa(card: CandidateCard) -> str:
    return "-" if card.numa_node is None else str(card.numa_node)


def decision_table(decision: Decision, wide: bool = False) -> Table:
    placement = decision.placement
    if placement is None:
        title = f"[bold]{decision.request}[/] ({decision.policy.text}): [red]PENDING[/] {decision.reason}"
    else:
        title = f"[bold]{decision.request}[/] ({decision.policy.text}): [green]{_outcome(decision)}[/]"
    table = Table(title=title, title_justify="left")
    names = ["node", "index", "model", "numa", "tenants", "used memory"]
    names += [*(["used cores"] if wide else []), "score", "eligible", "reason"]
    for column in names:
        table.add_column(column, justify="right" if column in {"index", "tenants", "score"} else "left")
    for card in decision.candidates:
        marker = "[green]chosen[/]" if card.chosen else ("yes" if card.eligible else "[red]no[/]")
        table.add_row(
            card.node,
            card.device or str(card.index),
            card.product_name,
            _numa(card),
            str(card.tenants),
            f"{_mib(card.used_memory)} / {_mib(card.total_memory)}",
            *([str(card.used_cores)] if wide else []),
            f"{card.score:.6f}",
            marker,
            "" if card.reason is None else card.reason.value,
        )
    return table


def _warning(decision: Decision) -> str | None:
    if not decision.policy.unknown:
        return None
    return f"ignored unknown policies: {', '.join(decision.policy.unknown)}"


def _refused(nodes_refused: Mapping[str, str]) -> str | None:
    """``nodes the pod cannot run on: node-1 TaintToleration, node-2 InsufficientCPU``."""
    if not nodes_refused:
        return None
    return "nodes the pod cannot run on: " + ", ".join(f"{node} {why}" for node, why in nodes_refused.items())


def _preempts(victims: Sequence[Preempted]) -> str | None:
    """``preempts: team/notebook-b (priority 100) on node-1`` (nobody is evicted: a what-if)."""
    if not victims:
        return None
    return "preempts: " + ", ".join(f"{v.pod} (priority {v.priority}) on {v.node}" for v in victims)


def print_tables(result: SimulationResult, console: Console, wide: bool = False) -> None:
    """Rich tables, for a terminal."""
    for position, decision in enumerate(result.decisions):
        warning = _warning(decision)
        if warning:
            console.print(f"[yellow]warning:[/] {warning}")
        console.print(decision_table(decision, wide))
        for line in (_refused(result.refused_on(position)), _preempts(result.victims_of(position))):
            if line:
                console.print(line, markup=False)
        console.print()


def plain_tables(result: SimulationResult, wide: bool = False) -> str:
    """kubectl-style columns, for a pipe or a file: per claim a title line
    (``name (policy): node-1 gpu-0`` or ``name (policy): PENDING reason``), then its cards."""
    header = ["NODE", "INDEX", "MODEL", "NUMA", "TENANTS", "MEMORY", *(["CORES"] if wide else [])]
    header += ["SCORE", "ELIGIBLE", "REASON", *(["NOTE"] if wide else [])]
    blocks = []
    for position, decision in enumerate(result.decisions):
        lines = []
        warning = _warning(decision)
        if warning:
            lines.append(f"warning: {warning}")
        lines.append(f"{decision.request} ({decision.policy.text}): {_outcome(decision)}")
        for line in (_refused(result.refused_on(position)), _preempts(result.victims_of(position))):
            if line:
                lines.append(line)
        rows = [header]
        for card in decision.candidates:
            rows.append(
                [
                    card.node,
                    card.device or str(card.index),
                    card.product_name or "-",
                    _numa(card),
                    str(card.tenants),
                    f"{_mib(card.used_memory)}/{_mib(card.total_memory)}",
                    *([str(card.used_cores)] if wide else []),
                    f"{card.score:.6f}",
                    "chosen" if card.chosen else ("yes" if card.eligible else "no"),
                    "-" if card.reason is None else card.reason.value,
                    *([card.note or "-"] if wide else []),
                ]
            )
        lines += columns(rows)
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)
