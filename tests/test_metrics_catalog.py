"""Every metric the components export follows Prometheus' conventions and means one thing.

The names come from the components' own registries (tests/metrics_catalog.py), so a metric added
anywhere is checked here: the ``hami_dra_`` prefix; ``_total`` on counters and nowhere else; base
units as the last word (``_bytes`` for memory, ``_seconds`` for time; no milliseconds, megabytes or
percent); no name exported by two components (the plugin's prepared-share gauges once shared the
controller's ``hami_dra_gpu_allocated_*`` names, so ``sum()`` counted each share twice); no label
that Prometheus' own target labels would rename to ``exported_*``; and docs/monitoring.md gives
each name with its type.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from tests.metrics_catalog import MetricInfo, catalog

CATALOG = catalog()
#: Labels Prometheus (kube-prometheus' PodMonitors and ServiceMonitors) puts on every target.
TARGET_LABELS = {"namespace", "pod", "container", "service", "endpoint", "job", "instance"}
_NOT_BASE_UNITS = re.compile(
    r"_(milliseconds|microseconds|nanoseconds|minutes|hours|days|kilobytes|megabytes|gigabytes|"
    r"kib|mib|gib|kb|mb|gb|percent|percentage|ms)(_|$)"
)
_DOC_ROW = re.compile(r"^\|\s*`(hami_dra_[a-z0-9_]+)`\s*\|\s*([a-z]+)\s*\|")


def _ids(metric: MetricInfo) -> str:
    return metric.name


def test_every_component_exports_metrics() -> None:
    assert {metric.component for metric in CATALOG} == {"controller", "kubelet-plugin", "webhook"}


def test_no_name_is_exported_by_two_components() -> None:
    owners: dict[str, set[str]] = defaultdict(set)
    for metric in CATALOG:
        owners[metric.name].add(metric.component)
    shared = {name: sorted(components) for name, components in owners.items() if len(components) > 1}
    assert not shared, f"one name, two components (sum() would mix their meanings): {shared}"


@pytest.mark.parametrize("metric", CATALOG, ids=_ids)
def test_name_follows_the_conventions(metric: MetricInfo) -> None:
    name = metric.name
    assert re.fullmatch(r"hami_dra_[a-z][a-z0-9_]*[a-z0-9]", name), name
    assert "__" not in name
    if metric.type == "counter":
        assert name.endswith("_total"), f"{name}: a counter's name ends in _total"
    else:
        assert "_total" not in name, f"{name}: _total is for counters only"
    assert not re.search(r"_(count|sum|bucket|created)$", name), f"{name}: a suffix Prometheus reserves"
    assert not _NOT_BASE_UNITS.search(name), f"{name}: use base units (bytes, seconds)"
    stem = name.removesuffix("_total")
    for unit in ("bytes", "seconds"):
        if f"_{unit}" in stem:
            assert stem.endswith(f"_{unit}"), f"{name}: the unit is the last word"
    words = f"{name} {metric.help}".lower()
    if "memory" in words and metric.type == "gauge" and "quota" not in name:
        assert stem.endswith("_bytes"), f"{name}: memory is in bytes"
    if metric.type == "histogram" or re.search(r"\b(latency|time to|age)\b", metric.help.lower()):
        assert stem.endswith("_seconds"), f"{name}: time is in seconds"
    assert metric.help.strip(), f"{name}: no help text"


@pytest.mark.parametrize("metric", CATALOG, ids=_ids)
def test_labels_never_collide_with_target_labels(metric: MetricInfo) -> None:
    collide = set(metric.labels) & TARGET_LABELS
    assert not collide, f"{metric.name}: {collide} would become exported_* under a PodMonitor"


def test_per_card_series_carry_node_device_uuid_model() -> None:
    """Capacity, allocation and per-claim series can be joined with dcgm-exporter (UUID, modelName)."""
    card = {"node", "device", "uuid", "model"}
    for metric in CATALOG:
        if metric.name.startswith(("hami_dra_gpu_", "hami_dra_claim_")) and metric.component == "controller":
            assert card <= set(metric.labels), metric
    claims = {m.name: m for m in CATALOG if m.name.startswith("hami_dra_claim_")}
    assert claims and all({"claim_namespace", "claim", "claim_pod"} <= set(m.labels) for m in claims.values())


def test_docs_give_every_name_with_its_type() -> None:
    from tests.chart.helpers import REPO

    rows: dict[str, str] = {}
    for line in (REPO / "docs" / "monitoring.md").read_text().splitlines():
        match = _DOC_ROW.match(line)
        if match:
            rows[match[1]] = match[2]
    exported = {metric.name: metric.type for metric in CATALOG}
    assert rows == exported
