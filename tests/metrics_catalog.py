"""Every metric each component exports, read from the components' own registries.

The catalog test (tests/test_metrics_catalog.py) checks names against Prometheus' conventions and
against docs/monitoring.md; the chart tests check that every PromQL query the chart ships names
only metrics listed here. Registries are built fresh, as each component builds its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

COMPONENTS = ("controller", "kubelet-plugin", "webhook")


@dataclass(frozen=True)
class MetricInfo:
    component: str
    name: str  # as exported: counters with _total, histograms by their base name
    type: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str


def _label_names(owner: Any, registry: CollectorRegistry) -> dict[str, set[str]]:
    """Family name -> label names: from the metric objects (labelled ones without series yet),
    snapshot collectors' declared families, and the samples present now."""
    labels: dict[str, set[str]] = {}
    for value in vars(owner).values():
        if isinstance(value, MetricWrapperBase) and value._labelnames:
            labels.setdefault(value._name, set()).update(value._labelnames)
        families = getattr(value, "families", None)
        if isinstance(families, dict):
            for name, (_, names) in families.items():
                labels.setdefault(name, set()).update(names)
    for family in registry.collect():
        for sample in family.samples:
            labels.setdefault(family.name, set()).update(k for k in sample.labels if k != "le")
    return labels


def _infos(component: str, owner: Any, registry: CollectorRegistry) -> Iterable[MetricInfo]:
    labels = _label_names(owner, registry)
    for family in registry.collect():
        exported = f"{family.name}_total" if family.type == "counter" else family.name
        yield MetricInfo(component, exported, family.type, tuple(sorted(labels.get(family.name, ()))),
                         family.documentation)  # fmt: skip


def catalog() -> list[MetricInfo]:
    from dra_driver.controller.metrics import ControllerMetrics
    from dra_driver.kubeletplugin.metrics import PluginMetrics
    from dra_driver.webhook.metrics import WebhookMetrics

    controller = ControllerMetrics()
    plugin = PluginMetrics(node="node-1")
    webhook = WebhookMetrics(["/mutate", "/validate"])
    webhook.watch_connections(lambda _reason: 0, lambda: 0)
    return [
        *_infos("controller", controller, controller.registry),
        *_infos("kubelet-plugin", plugin, plugin.registry),
        *_infos("webhook", webhook, webhook.registry),
    ]
