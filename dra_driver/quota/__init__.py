"""Namespace quotas on consumed GPU capacity: the ``GpuQuota`` resource and the checks on it.

Kubernetes counts claims per DeviceClass, not the memory or cores a shared GPU hands out, so the
controller enforces these quotas itself when it places a claim. Layout: ``crd`` (the
CustomResourceDefinition, also written to ``api/crds/`` and the chart's ``crds/``), ``model``
(a ``GpuQuota`` or a HAMi-style ResourceQuota -> ``Quota``), ``usage`` (what claims charge a
namespace, and whether a placement would take it past a quota). The controller keeps quotas
current in ``dra_driver/controller/quotas.py``; ``hami-dra simulate`` checks the same way.
"""

from dra_driver.quota.model import Limits, Quota, QuotaError, quota_from_gpu_quota, quota_from_resource_quota
from dra_driver.quota.usage import Breach, Charge, Usage, find_breach, usage_of

__all__ = [
    "Breach",
    "Charge",
    "Limits",
    "Quota",
    "QuotaError",
    "Usage",
    "find_breach",
    "quota_from_gpu_quota",
    "quota_from_resource_quota",
    "usage_of",
]
