"""Print a :class:`TopReport`: kubectl-style tables or a stable JSON document.

Tables are plain aligned columns (as ``kubectl top`` prints them) so they survive pipes, ``grep``
and narrow terminals; usage is a ten-character bar and ``used/total`` (``[#####.....] 7.5Gi/15Gi``),
a bar of ``!`` meaning more is allocated than the card has. ``gpus`` prints one line per card
(further tenants of a card on continuation lines), ``nodes`` one line per node; both end with the
pods our controller holds pending, by reason. ``wide`` adds the UUID and each pending pod's message.
With ``-n`` a card lists the namespace's tenants and counts the others (``+2 of other namespaces``);
its usage is the card's whole usage.

JSON (``-o json``, or the same document as YAML with ``-o yaml``; the same document for both
views; keys are stable, new keys may be added; memory in bytes, cores in percent of one GPU, slots
in tenants)::

    {"driver": str,
     "namespace": str | null,           # the namespace listed; null with -A (all namespaces)
     "usageNamespace": str | null,      # usage counts only this namespace's claims (the user may
                                        # not list all namespaces'); null: every namespace's
     "nodes": [{"name": str, "gpus": int,  # physical GPUs (a card in MIG mode once)
                "migInstances": int,    # only with MIG: published instances (each a device below)
                "migOnDemand": [{"device": str, "placements": int}],  # only with MIG on demand:
                                        # cards offering placements (an allocated one is an instance)
                "healthyGpus": int,     # healthy devices
                "memory": {"used": int, "total": int}, "cores": {...}, "slots": {...},
                "tenants": int,         # distinct claims allocated on the node
                "starting": int,        # of those, claims whose pod has not started running yet
                "devices": [{"pool": str, "device": str, "index": int | null, "uuid": str,
                             "productName": str,
                             "isolation": "hami-core" | "none" | "simulated" | "unknown",
                             "health": "healthy" | "unhealthy" | "unknown",
                             "healthyAttribute": bool | null, "unhealthyTaint": bool,
                             "healthMonitored": bool | null,
                             "taints": [{"key": str, "value": str, "effect": str}],
                             "memory": {...}, "cores": {...}, "slots": {...},
                             "tenants": [TENANT],  # of the namespace listed
                             "otherTenants": int,  # tenants of other namespaces, counted
                             # a MIG instance only: its profile and its card's device name
                             "migProfile": str, "migParent": str}]}],
     "pending": [{"reason": str, "count": int,
                  "pods": [{"namespace": str, "name": str, "gated": bool, "message": str}]}],
     "unpublished": [{"pool": str, "device": str, "tenant": TENANT}]}

    TENANT = {"namespace": str, "claim": str, "pods": [str], "request": str,
              "shareID": str | null, "wholeCard": bool, "adminAccess": bool,
              "memory": int, "cores": int, "slots": int, "starting": bool}

A whole-card tenant reports the card's full capacities; an ``adminAccess`` tenant reports what
its result lists (nothing) and is not counted in ``used``. Pending reasons are the controller's
(``Unschedulable``, ``GpuQuotaExceeded``, ``GpuLimitsConflict``, ``InvalidRequest``, ...), or
``AwaitingController`` for a gated pod it has not answered yet.

A card in MIG mode publishes its instances, each a device of its own (product ``MIG 1g.10gb of
gpu-1``, a tenant ``(MIG instance)``); the ``gpus`` view ends with one line per such card: its
instances in use and who holds each. A card offering MIG on demand publishes every possible
placement; only allocated ones are instances (rows of their own, counted in ``migInstances``),
and its line says how many were made of how many offered; the node's capacity counts the card once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.output import JSON, columns, render_document
from dra_driver.quantity import GIB, MIB
from dra_driver.top import GPUS, NODES
from dra_driver.top.report import Card, NodeSummary, PendingGroup, Tenant, TopReport, Usage

BAR_WIDTH = 10
_UNITS = (("Ti", 1024 * GIB), ("Gi", GIB), ("Mi", MIB), ("Ki", 1024))


def short_bytes(value: int) -> str:
    """``7.5Gi``, ``15Gi``, ``512Mi``: one decimal at most, for a column (JSON keeps bytes)."""
    for suffix, unit in _UNITS:
        if value >= unit:
            return f"{value / unit:.1f}".removesuffix(".0") + suffix
    return str(value)


def bar(usage: Usage, width: int = BAR_WIDTH) -> str:
    """``[###.......]``: the used share of ``total``, at least one mark when anything is used."""
    if usage.used > usage.total:
        return "[" + "!" * width + "]"
    filled = 0 if usage.total <= 0 else round(width * usage.used / usage.total)
    if usage.used > 0 and filled == 0:
        filled = 1
    return "[" + "#" * filled + "." * (width - filled) + "]"


def memory_cell(usage: Usage) -> str:
    return f"{bar(usage)} {short_bytes(usage.used)}/{short_bytes(usage.total)}"


def count_cell(usage: Usage, with_bar: bool = True) -> str:
    text = f"{usage.used}/{usage.total}"
    return f"{bar(usage)} {text}" if with_bar else text


def tenant_cell(tenant: Tenant, mig: bool = False) -> str:
    if tenant.admin_access:
        share = "admin access"
    elif tenant.whole_card:
        share = "MIG instance" if mig else "whole card"
    else:
        share = f"{short_bytes(tenant.memory)} {tenant.cores}%"
    return f"{tenant.label} ({share})"


def health_cell(card: Card) -> str:
    if card.unhealthy_taint:
        return f"{card.health} (tainted)"
    if card.health_monitored is False:
        return f"{card.health} (not monitored)"
    return card.health


def gpu_rows(report: TopReport, wide: bool) -> list[list[str]]:
    header = ["NODE", "DEVICE", *(["UUID"] if wide else []), "PRODUCT", "ISOLATION", "HEALTH"]
    header += ["MEMORY", "CORES", "SLOTS", "TENANTS"]
    rows = [header]
    for card in report.cards:
        tenants = [tenant_cell(t, card.mig_profile is not None) for t in card.tenants]
        if card.other_tenants:
            tenants.append(f"+{card.other_tenants} of other namespaces")
        tenants = tenants or ["-"]
        rows.append(
            [
                card.node or "-",
                card.device,
                *([card.uuid or "-"] if wide else []),
                _product(card),
                card.isolation,
                health_cell(card),
                memory_cell(card.memory),
                count_cell(card.cores),
                count_cell(card.slots, with_bar=False),
                tenants[0],
            ]
        )
        rows.extend([""] * (len(header) - 1) + [more] for more in tenants[1:])
    return rows


def _product(card: Card) -> str:
    """The product, or for a MIG instance its profile and card (``MIG 1g.10gb of gpu-1``)."""
    if card.mig_profile is not None:
        return f"MIG {card.mig_profile} of {card.mig_parent}"
    return card.product_name or "-"


def mig_lines(report: TopReport) -> list[str]:
    """One line per card in MIG mode: its instances in use, then each instance and who holds it."""
    lines = []
    for mig in report.mig_cards():
        held = []
        for instance in mig.instances:
            who = ", ".join(t.label for t in instance.tenants) or (
                f"+{instance.other_tenants} of other namespaces" if instance.other_tenants else "free"
            )
            held.append(f"{instance.mig_profile} {who}")
        if mig.placements is not None:
            lines.append(
                f"{mig.node}/{mig.device} (MIG on demand): {len(mig.instances)} instances made of "
                f"{mig.placements} placements offered" + (": " + "; ".join(held) if held else "")
            )
            continue
        lines.append(
            f"{mig.node}/{mig.device} (MIG): {mig.in_use}/{len(mig.instances)} instances in use: "
            + "; ".join(held)
        )
    return lines


def node_rows(report: TopReport) -> list[list[str]]:
    rows = [["NODE", "GPUS", "HEALTHY", "MEMORY", "CORES", "SLOTS", "TENANTS", "STARTING"]]
    for node in report.nodes:
        rows.append(
            [
                node.name or "-",
                str(node.gpus) + (f" ({node.mig_instances} MIG)" if node.mig_instances else ""),
                f"{node.healthy_cards}/{len(node.cards)}",
                memory_cell(node.memory),
                count_cell(node.cores),
                count_cell(node.slots, with_bar=False),
                str(node.tenants),
                str(node.starting),
            ]
        )
    return rows


def pending_rows(pending: Sequence[PendingGroup], wide: bool) -> list[list[str]]:
    if wide:
        rows = [["REASON", "POD", "MESSAGE"]]
        for group in pending:
            rows.extend([group.reason, f"{p.namespace}/{p.name}", p.message or "-"] for p in group.pods)
        return rows
    rows = [["REASON", "PENDING", "PODS"]]
    for group in pending:
        names = ", ".join(f"{pod.namespace}/{pod.name}" for pod in group.pods)
        rows.append([group.reason, str(len(group.pods)), names])
    return rows


def render_table(report: TopReport, view: str = GPUS, wide: bool = False) -> str:
    lines: list[str] = []
    if not report.nodes:
        lines.append(f"No GPUs: no ResourceSlice of driver {report.driver} is published.")
    else:
        lines += columns(node_rows(report) if view == NODES else gpu_rows(report, wide))
    mig = mig_lines(report)
    if mig:
        lines += ["", *mig]
    if report.pending:
        lines += ["", *columns(pending_rows(report.pending, wide))]
    notes = []
    if report.usage_namespace is not None:
        notes.append(
            f"Usage and tenants of namespace {report.usage_namespace} only (claims of all namespaces "
            "cannot be listed with these credentials); -A for all namespaces."
        )
    elif report.namespace is not None:
        notes.append(
            f"Tenants and pending pods of namespace {report.namespace} only (usage counts every "
            "namespace); -A for all namespaces."
        )
    for use in report.unpublished:
        notes.append(
            f"{tenant_cell(use.tenant)} is allocated {use.pool}/{use.device}, which no slice publishes."
        )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _usage(usage: Usage) -> dict[str, int]:
    return {"used": usage.used, "total": usage.total}


def tenant_json(tenant: Tenant) -> dict[str, Any]:
    return {
        "namespace": tenant.namespace,
        "claim": tenant.claim,
        "pods": list(tenant.pods),
        "request": tenant.request,
        "shareID": tenant.share_id,
        "wholeCard": tenant.whole_card,
        "adminAccess": tenant.admin_access,
        "memory": tenant.memory,
        "cores": tenant.cores,
        "slots": tenant.slots,
        "starting": tenant.starting,
    }


def card_json(card: Card) -> dict[str, Any]:
    return {
        "pool": card.pool,
        "device": card.device,
        "index": card.index,
        "uuid": card.uuid,
        "productName": card.product_name,
        "isolation": card.isolation,
        "health": card.health,
        "healthyAttribute": card.healthy,
        "unhealthyTaint": card.unhealthy_taint,
        "healthMonitored": card.health_monitored,
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in card.taints],
        "memory": _usage(card.memory),
        "cores": _usage(card.cores),
        "slots": _usage(card.slots),
        "tenants": [tenant_json(t) for t in card.tenants],
        "otherTenants": card.other_tenants,
        **({"migProfile": card.mig_profile, "migParent": card.mig_parent} if card.mig_profile else {}),
    }


def node_json(node: NodeSummary) -> dict[str, Any]:
    return {
        "name": node.name,
        "gpus": node.gpus,
        **({"migInstances": node.mig_instances} if node.mig_instances else {}),
        **(
            {"migOnDemand": [{"device": c.device, "placements": c.placements} for c in node.on_demand]}
            if node.on_demand
            else {}
        ),
        "healthyGpus": node.healthy_cards,
        "memory": _usage(node.memory),
        "cores": _usage(node.cores),
        "slots": _usage(node.slots),
        "tenants": node.tenants,
        "starting": node.starting,
        "devices": [card_json(card) for card in node.cards],
    }


def report_json(report: TopReport) -> dict[str, Any]:
    return {
        "driver": report.driver,
        "namespace": report.namespace,
        "usageNamespace": report.usage_namespace,
        "nodes": [node_json(node) for node in report.nodes],
        "pending": [
            {
                "reason": group.reason,
                "count": len(group.pods),
                "pods": [
                    {"namespace": p.namespace, "name": p.name, "gated": p.gated, "message": p.message}
                    for p in group.pods
                ],
            }
            for group in report.pending
        ],
        "unpublished": [
            {"pool": use.pool, "device": use.device, "tenant": tenant_json(use.tenant)}
            for use in report.unpublished
        ],
    }


def render_json(report: TopReport, output: str = JSON) -> str:
    """The document as JSON, or YAML with ``output`` ``yaml``."""
    return render_document(report_json(report), output)
