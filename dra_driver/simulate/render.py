"""Output of ``hami-dra simulate``: a readable table per claim, or stable JSON.

JSON format (documented in the README; keys are stable, new keys may be added)::

    {"results": [{"claim": str, "allocated": bool, "node": str|null, "policy": str,
                  "unknownPolicies": [str], "devices": [{"node", "index", "name", "memory", "cores"}],
                  "reason": str|null, "quota": str|null (the namespace/name that held it pending),
                  "candidates": [{"node", "index", "productName", "tenants", "usedMemory", "score",
                                  "eligible", "chosen", "reason"}]}]}

Scores are the usage scores before the claim was placed, rounded to 6 decimals; memory in bytes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from dra_driver.engine import Decision
from dra_driver.quantity import MIB, format_bytes
from dra_driver.simulate.documents import json_text
from dra_driver.simulate.run import SimulationResult


def decision_to_json(decision: Decision, quota: str | None = None) -> dict[str, Any]:
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
                "name": f"gpu-{share.index}",
                "memory": share.memory,
                "cores": share.cores,
            }
            for share in placement.devices
        ],
        "reason": decision.reason,
        "quota": quota,
        "candidates": [
            {
                "node": card.node,
                "index": card.index,
                "productName": card.product_name,
                "tenants": card.tenants,
                "usedMemory": card.used_memory,
                "score": round(card.score, 6),
                "eligible": card.eligible,
                "chosen": card.chosen,
                "reason": None if card.reason is None else card.reason.value,
            }
            for card in decision.candidates
        ],
    }


def result_to_json(result: SimulationResult) -> str:
    """Indented down to each result's fields; each device and candidate card on one line."""
    results = [decision_to_json(d, result.blocked_by(i)) for i, d in enumerate(result.decisions)]
    return json_text({"results": results}, depth=4)


def _mib(value: int) -> str:
    return f"{value // MIB}Mi" if value % MIB == 0 else format_bytes(value)


def decision_table(decision: Decision) -> Table:
    placement = decision.placement
    if placement is None:
        title = f"[bold]{decision.request}[/] ({decision.policy.text}): [red]PENDING[/] {decision.reason}"
    else:
        chosen = ", ".join(f"gpu-{share.index}" for share in placement.devices)
        title = f"[bold]{decision.request}[/] ({decision.policy.text}): [green]{placement.node} {chosen}[/]"
    table = Table(title=title, title_justify="left")
    for column in ("node", "index", "model", "numa", "tenants", "used memory", "score", "eligible", "reason"):
        table.add_column(column, justify="right" if column in {"index", "tenants", "score"} else "left")
    for card in decision.candidates:
        marker = "[green]chosen[/]" if card.chosen else ("yes" if card.eligible else "[red]no[/]")
        table.add_row(
            card.node,
            str(card.index),
            card.product_name,
            "-" if card.numa_node is None else str(card.numa_node),
            str(card.tenants),
            f"{_mib(card.used_memory)} / {_mib(card.total_memory)}",
            f"{card.score:.6f}",
            marker,
            "" if card.reason is None else card.reason.value,
        )
    return table


def print_tables(result: SimulationResult, console: Console) -> None:
    for decision in result.decisions:
        if decision.policy.unknown:
            ignored = ", ".join(decision.policy.unknown)
            console.print(f"[yellow]warning:[/] ignored unknown policies: {ignored}")
        console.print(decision_table(decision))
        console.print()
