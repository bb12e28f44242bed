"""Rich renderables for the demo; each function turns one observed object into one table or panel.

Tables stay within 120 columns and carry no information in colour alone (a ``*`` marks the
chosen card, words say pass/FAIL), so the output reads the same in a CI log as in a terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from dra_driver.kube.api import Obj, ObjView
from dra_driver.quantity import parse_bytes
from dra_driver.resource.objects import ClaimView
from hami_dra_dev.demo.checks import Check
from hami_dra_dev.demo.controller import RecordedDecision
from hami_dra_dev.demo.observe import ObservedPod, ObservedSlice, PodCondition, consumed_capacity, share_id

WIDTH = 120


def make_console(file: IO[str] | None = None) -> Console:
    """A console that never exceeds 120 columns and stays plain (no colour codes) off a terminal."""
    stream = file if file is not None else sys.stdout
    console = Console(file=stream, soft_wrap=False, highlight=False)
    if not console.is_terminal:
        return Console(file=stream, width=WIDTH, no_color=True, highlight=False, emoji=False)
    return Console(file=stream, width=min(console.width, WIDTH), highlight=False)


def mib(quantity: str) -> str:
    return f"{parse_bytes(quantity) // (1024 * 1024)} MiB"


def slice_table(resource_slice: ObservedSlice) -> Table:
    title = (
        f"ResourceSlice {resource_slice.name}  (node {resource_slice.node}, driver {resource_slice.driver}, "
        f"pool {resource_slice.pool} gen {resource_slice.generation})"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("device", "index", "product", "memory", "cores", "slots", "NUMA", "PCI bus", "taints"):
        table.add_column(column, no_wrap=column != "taints")
    for device in resource_slice.devices:
        attributes, capacities = device.attributes, device.capacities
        table.add_row(
            device.name,
            attributes.get("index", "-"),
            attributes.get("productName", "-"),
            mib(capacities["memory"]) if "memory" in capacities else "-",
            capacities.get("cores", "-"),
            capacities.get("slots", "-"),
            attributes.get("resource.kubernetes.io/numaNode", "-"),
            attributes.get("resource.kubernetes.io/pciBusID", "-"),
            ", ".join(f"{key}:{effect}" for key, effect in device.taints) or "-",
        )
    return table


def text_panel(title: str, text: str) -> Panel:
    """Verbatim tool output (kubectl, CDI JSON) in a titled box, never re-wrapped."""
    return Panel(Text(text, overflow="fold"), title=title, title_align="left", box=box.SQUARE)


def classes_table(classes: Sequence[tuple[str, str]]) -> Table:
    table = Table(
        title="DeviceClasses (GpuConfig opaque parameters)", box=box.SIMPLE_HEAD, title_justify="left"
    )
    table.add_column("DeviceClass", no_wrap=True)
    table.add_column("policy")
    table.add_column("nodePolicy")
    for name, policy in classes:
        table.add_row(name, policy, "binpack")
    return table


def placements_table(rows: Sequence[tuple[str, str, str, str, str]]) -> Table:
    """rows: (pod, policy, expected device, observed device, why)."""
    table = Table(title="Placements by the controller", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("pod", "policy", "expected", "got", "", "why"):
        table.add_column(column, no_wrap=column != "why")
    for pod, policy, expected, got, why in rows:
        table.add_row(pod, policy, expected, got, "ok" if expected == got else "WRONG", why)
    return table


def scores_table(recorded: RecordedDecision, expected: Sequence[float]) -> Table:
    decision = recorded.decision
    title = f"Controller decision for pod {recorded.pod}: policy {decision.policy.text or '-'}"
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        caption=recorded.config,
        caption_justify="left",
    )
    for column in ("card", "tenants", "used memory", "score", "expected", "eligible", "chosen"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("score", "expected") else "left")
    for card in sorted(decision.candidates, key=lambda c: (c.node, c.index)):
        want = f"{expected[card.index]:.6f}" if card.index < len(expected) else "-"
        eligible = "yes" if card.eligible else f"no ({card.reason.value if card.reason else '-'})"
        table.add_row(
            f"{card.node}/gpu-{card.index}",
            str(card.tenants),
            f"{card.used_memory // (1024 * 1024)} MiB",
            f"{card.score:.6f}",
            want,
            eligible,
            "*" if card.chosen else "",
        )
    return table


def _allocation_notes(allocation: ObjView) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The one walk of an allocation beyond its results (the typed claim's): its nodeSelector's
    ``matchFields`` and its configs, as the table's notes show them."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ()
    fields = tuple(
        f"{f['key']} {f['operator']} {f.get('values')}" for t in terms for f in t.get("matchFields") or ()
    )
    configs = tuple(
        f"{entry.get('source')} {entry.get('requests')} "
        f"policy={((entry.get('opaque') or {}).get('parameters') or {}).get('policy')!r}"
        for entry in (allocation.get("devices") or {}).get("config") or ()
    )
    return fields, configs


def allocation_table(claim: ClaimView) -> RenderableType:
    table = Table(
        title=f"ResourceClaim {claim.name}: status.allocation.devices.results",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for column in ("request", "driver / pool / device", "shareID", "consumedCapacity"):
        table.add_column(column, no_wrap=column != "consumedCapacity")
    for result in claim.results:
        consumed = ", ".join(f"{name}={amount}" for name, amount in consumed_capacity(result).items())
        device = result.device
        table.add_row(
            result.request,
            f"{device.driver} / {device.pool} / {device.device}",
            share_id(result) or "-",
            consumed or "-",
        )
    extra = Table.grid(padding=(0, 2))
    fields, configs = _allocation_notes(claim.allocation or {})
    extra.add_row("nodeSelector:", "; ".join(fields) or "-")
    for config in configs:
        extra.add_row("config:", config)
    reserved = ", ".join(name for _, name in claim.reserved_pods)
    extra.add_row("reservedFor:", reserved or "-")
    return Group(table, extra)


def cdi_panel(file_name: str, spec: Obj, cdi_ids: Sequence[str]) -> Panel:
    body = Syntax(
        json.dumps(spec, indent=2), "json", theme="ansi_dark", word_wrap=True, background_color="default"
    )
    ids = Text("CDI IDs handed to the runtime: " + (", ".join(cdi_ids) or "-"))
    return Panel(Group(ids, body), title=f"CDI spec {file_name}", title_align="left", box=box.SQUARE)


def pending_table(
    pod: ObservedPod, conditions: Sequence[PodCondition], events: Sequence[Obj]
) -> RenderableType:
    """What ``kubectl describe pod`` shows for a pending pod: phase, gates, conditions, events."""
    head = Table.grid(padding=(0, 2))
    head.add_row("Pod:", pod.name)
    head.add_row("Status:", pod.phase or "Pending")
    head.add_row("Node:", pod.node or "<none>")
    head.add_row("Scheduling gates:", ", ".join(pod.gates) or "<none>")
    cond = Table(title="Conditions", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("type", "status", "reason", "message"):
        cond.add_column(column, no_wrap=column != "message")
    for entry in conditions:
        cond.add_row(entry.type, entry.status, entry.reason, entry.message)
    ev = Table(title="Events", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("type", "reason", "from", "message"):
        ev.add_column(column, no_wrap=column != "message")
    for event in events:
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
        ev.add_row(event.get("type", ""), event.get("reason", ""), source, event.get("message", ""))
    return Group(head, cond, ev)


def checks_table(checks: Sequence[Check]) -> Table:
    table = Table(title="Checks", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("", "check", "expected", "observed"):
        table.add_column(column, no_wrap=column == "")
    for check in checks:
        table.add_row("pass" if check.ok else "FAIL", check.name, check.expected, check.observed)
    return table
