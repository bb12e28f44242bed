"""``QuotaBook``: the namespace quotas the controller enforces, and their ``status.used``.

Quotas come from ``GpuQuota`` objects and from ResourceQuotas with HAMi's names (both watched by
the controller's informers). A placement is checked against every quota of the pod's namespace
with the ledger's charges, which include allocations still being written, so pods planned one
after the other on the controller's single worker thread can never overshoot a quota together.
``status.used`` is recomputed from the ledger, so after a restart it matches a full recount.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from dra_driver.controller.ledger import Ledger
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.kube.api import GPU_QUOTAS, KubeApi, Obj
from dra_driver.kube.errors import KubeError
from dra_driver.kube.writes import retry_on_conflict
from dra_driver.quota import (
    Breach,
    Charge,
    Quota,
    QuotaError,
    Usage,
    find_breach,
    quota_from_gpu_quota,
    quota_from_resource_quota,
    usage_of,
)
from dra_driver.quota.crd import RESOURCES
from dra_driver.quota.edits import with_quota_used
from dra_driver.quota.model import QuotaObject, format_amount

log = logging.getLogger(__name__)
#: A quota's status is rewritten at most this often while its usage keeps changing (a burst).
STATUS_INTERVAL_SECONDS = 1.0


def used_status(usage: Usage) -> dict[str, Any]:
    """``status.used`` as the controller writes it: every resource, memory as a quantity."""
    used: dict[str, Any] = {resource: usage.amount(resource) for resource in RESOURCES}
    used["memory"] = format_amount("memory", usage.memory)
    return used


class QuotaBook:
    """Single-threaded (the controller's worker); informer events arrive through ``set_*``."""

    def __init__(self, ledger: Ledger, metrics: ControllerMetrics) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self._gpu_quotas: dict[str, tuple[Quota, QuotaObject]] = {}  # key -> (quota, object as last seen)
        self._resource_quotas: dict[str, Quota] = {}
        self._written_at: dict[str, float] = {}
        self._reported: set[tuple[str, str, str]] = set()  # metric label sets in use
        self.generation = 0
        self._synced: tuple[int, int] | None = None  # (ledger, quota) generations last synced
        self._deferred = False  # a status write was put off by STATUS_INTERVAL_SECONDS

    # --- informer input ------------------------------------------------------------------------
    def set_gpu_quota(self, key: str, obj: Mapping[str, Any] | None) -> None:
        self.generation += 1
        if obj is None:
            self._gpu_quotas.pop(key, None)
            return
        try:
            self._gpu_quotas[key] = (quota_from_gpu_quota(obj), QuotaObject.parse(dict(obj)))
        except QuotaError as err:  # the schema should have refused it: ignore it, loudly
            log.error("%s; this quota is not enforced until it is fixed", err)
            self._gpu_quotas.pop(key, None)

    def set_resource_quota(self, key: str, obj: Mapping[str, Any] | None) -> None:
        self.generation += 1
        quota = None
        if obj is not None:
            try:
                quota = quota_from_resource_quota(obj)
            except QuotaError as err:
                log.error("%s; its HAMi limits are not enforced until it is fixed", err)
        if quota is None:
            self._resource_quotas.pop(key, None)
        else:
            self._resource_quotas[key] = quota

    # --- checks --------------------------------------------------------------------------------
    def in_namespace(self, namespace: str) -> list[Quota]:
        """The namespace's quotas: ``GpuQuota`` objects by name, then ResourceQuotas by name."""
        gpu = [quota for quota, _ in self._gpu_quotas.values() if quota.namespace == namespace]
        rq = [quota for quota in self._resource_quotas.values() if quota.namespace == namespace]
        return sorted(gpu, key=lambda q: q.name) + sorted(rq, key=lambda q: q.name)

    def check(self, namespace: str, new: list[Charge]) -> Breach | None:
        """The first quota ``new`` (a planned pod's charges) would exceed, if any."""
        quotas = self.in_namespace(namespace)
        if not quotas or not new:
            return None
        return find_breach(quotas, self.ledger.namespace_charges(namespace), new)

    # --- status and metrics --------------------------------------------------------------------
    def sync(self, kube: KubeApi, *, force: bool = False) -> None:
        """Write ``status.used`` where it differs from the ledger; refresh the metrics."""
        generations = (self.ledger.generation, self.generation)
        if not force and not self._deferred and generations == self._synced:
            return
        self._synced, self._deferred = generations, False
        now = time.monotonic()
        charges: dict[str, list[Charge]] = {}
        reported: set[tuple[str, str, str]] = set()
        quotas: list[tuple[str, Quota, QuotaObject | None]]
        quotas = [(key, quota, obj) for key, (quota, obj) in self._gpu_quotas.items()]
        quotas += [(key, quota, None) for key, quota in self._resource_quotas.items()]
        for key, quota, obj in quotas:
            if quota.namespace not in charges:
                charges[quota.namespace] = self.ledger.namespace_charges(quota.namespace)
            usage = usage_of(quota, charges[quota.namespace])
            for resource in RESOURCES:
                labels = (quota.namespace, quota.metric_name, resource)
                reported.add(labels)
                self.metrics.quota_used.labels(*labels).set(usage.amount(resource))
                hard = quota.hard.get(resource)
                if hard is None:
                    _forget(self.metrics.quota_hard, labels)
                else:
                    self.metrics.quota_hard.labels(*labels).set(hard)
            if obj is None:
                continue
            used = used_status(usage)
            if obj.used == used:
                continue
            if not force and now - self._written_at.get(key, 0.0) < STATUS_INTERVAL_SECONDS:
                self._deferred = True
                continue
            self._written_at[key] = now
            written = self._write_status(kube, obj.raw, used)
            if written is not None:
                self._gpu_quotas[key] = (quota, QuotaObject.parse(written))
        for labels in self._reported - reported:
            for gauge in (self.metrics.quota_used, self.metrics.quota_hard):
                _forget(gauge, labels)
        self._reported = reported

    def forget_metrics(self) -> None:
        """This replica stopped leading: its quota series go (the leader's are the ones to read);
        the next term's first ``sync`` sets them all again."""
        for gauge in (self.metrics.quota_used, self.metrics.quota_hard):
            gauge.clear()
        self._reported = set()
        self._synced = None

    def _write_status(self, kube: KubeApi, obj: Mapping[str, Any], used: dict[str, Any]) -> Obj | None:
        meta = obj.get("metadata") or {}
        where = f"GpuQuota {meta.get('namespace')}/{meta.get('name')}"

        def write(current: Obj) -> Obj:
            written: Obj = kube.update(GPU_QUOTAS, with_quota_used(current, used), status=True)
            return written

        try:
            written = retry_on_conflict(
                write, dict(obj), lambda: kube.get(GPU_QUOTAS, meta.get("namespace"), str(meta.get("name")))
            )
        except KubeError as err:
            if not err.not_found:
                log.warning("%s: status not written: %s", where, err)
            return None
        log.info("%s used: %s", where, used)
        return written


def _forget(gauge: Gauge, labels: tuple[str, str, str]) -> None:
    """Drop one series; prometheus-client 0.20 (our lower bound) raises KeyError for one it never had."""
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)
