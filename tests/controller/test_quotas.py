"""Quotas (dra_driver/controller/quotas.py), over ``FakeKube``: a GpuQuota's status says what its
namespace uses, and the quota series follow usage, limits and deletion. A placement refused by a
quota: test_allocator.py; quotas on the API and the webhook: tests/quota/."""

from __future__ import annotations

from dra_driver.kube.api import GPU_QUOTAS
from tests.controller.harness import NS
from tests.controller.worlds import World, tenant


def test_a_quota_status_reports_what_its_namespace_uses() -> None:
    world = World()
    world.deliver(
        "GpuQuota", {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "1536Mi"}}}
    )
    tenant(world, "a")
    assert world.place("a-pod").outcome == "bound"
    world.cache.quotas.sync(world.kube, force=True)
    assert world.kube.stored(GPU_QUOTAS, NS, "cap")["status"]["used"] == {
        "memory": "1Gi",
        "cores": 100,  # no cores asked: no SM limit, a whole card's compute
        "devices": 1,
    }


def test_quota_metrics_follow_usage_limits_and_deletion() -> None:
    world = World()
    quotas = world.cache.quotas
    cap = {"metadata": {"name": "cap", "namespace": NS}, "spec": {"hard": {"memory": "8Gi", "devices": 2}}}
    world.deliver("GpuQuota", cap)
    quotas.set_resource_quota(f"{NS}/hami", {
        "metadata": {"name": "hami", "namespace": NS},
        "spec": {"hard": {"limits.nvidia.com/gpucores": "150", "pods": "10"}},
    })  # fmt: skip
    tenant(world, "a", memory="2Gi", cores=30)
    world.place("a-pod")
    quotas.sync(world.kube, force=True)
    registry = world.metrics.registry

    def sample(name: str, quota: str, resource: str) -> float | None:
        labels = {"quota_namespace": NS, "quota": quota, "resource": resource}
        return registry.get_sample_value(name, labels)

    assert sample("hami_dra_quota_used", "cap", "memory") == 2 * 1024**3
    assert sample("hami_dra_quota_hard", "cap", "memory") == 8 * 1024**3
    assert sample("hami_dra_quota_hard", "cap", "devices") == 2
    assert sample("hami_dra_quota_hard", "cap", "cores") is None  # not limited: no series
    assert sample("hami_dra_quota_used", "resourcequota/hami", "cores") == 30
    assert sample("hami_dra_quota_hard", "resourcequota/hami", "cores") == 150
    quotas.set_gpu_quota(f"{NS}/cap", None)
    quotas.sync(world.kube, force=True)
    assert sample("hami_dra_quota_used", "cap", "memory") is None
    assert sample("hami_dra_quota_used", "resourcequota/hami", "cores") == 30
