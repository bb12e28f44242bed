"""A tenant's compute against its quota and against the planner (issue 34), on the real cluster.

The tenant of tests/cluster/tenancy.py (a namespace Role, impersonated through ``kubectl --as``)
tries the two attacks of issue 34 against the chart-installed driver:

* **Compute quota escape.** Before: under ``GpuQuota {cores: 50}`` two 1Gi shares that asked for no
  cores were charged 0 and ran without an SM limit (HAMi-core sets none unless 0 < cores < 100):
  ``status.used.cores`` 0 while the namespace used 200 % of a GPU. Now such a share is charged a
  whole card's 100 and refused there; a 40-core share runs with ``CUDA_DEVICE_SM_LIMIT_0=40`` and is
  charged 40.
* **Costly selectors.** Before: three pods whose claims carried 8 ``firstAvailable`` alternatives x 16
  legal selectors held the single planner; another tenant's pod was still not placed after 180 s.
  Now the issue's selectors are refused at compile time (estimated cost per device), selectors
  just under that limit stop at the claim's cost budget, and another tenant's pod created right
  after them is placed within ``VICTIM_BOUND`` seconds (docs/multi-tenant.md, "Planner fairness").

After each attack no card is over capacity and no namespace over any of its quotas, and
``status.used.cores`` is never under the compute its shares are given.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from dra_driver.quantity import parse_quantity
from dra_driver.quota import crd
from tests.cluster.drivers import DRIVER
from tests.cluster.tenancy import (
    OTHER_NS,
    TENANT_NS,
    Tenancy,
    claim,
    manifest,
    pod,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["chart"], indirect=True)]

#: How long another tenant's pod may wait for its gate to be lifted while the attack's claims are
#: planned: the controller's bound (one claim budget per other namespace, ~1-2 s on 2 vCPUs,
#: docs/multi-tenant.md) plus the API round trips and informer delays of a loaded test machine.
VICTIM_BOUND = 30.0
MEMORY = 'device.capacity["gpu.hami.io"].memory'


def listed(count: int) -> str:
    return "[" + ", ".join(str(index) for index in range(count)) + "]"


#: The issue's selectors: legal for the API server, about 9,000 quantity comparisons per device.
ISSUE_SELECTOR = (
    f'{listed(90)}.all(x, {listed(99)}.all(y, {MEMORY}.compareTo(quantity("1Gi")) >= {{n}}'
    f' && !{MEMORY}.isLessThan(quantity("1Mi"))))'
)
#: Just under the per-evaluation limit, comparing two device values (which stays a Python call).
UNDER_LIMIT_SELECTOR = f"{listed(29)}.all(x, {listed(29)}.all(y, {MEMORY}.compareTo({MEMORY}) >= {{n}}))"


def costly_claim(name: str, selector: str) -> dict[str, Any]:
    """8 alternatives x 16 selectors, the last of each false: every alternative tried on every GPU."""
    alternatives = []
    for a in range(8):
        expressions = [selector.format(n=-(a * 16 + s) - 1) for s in range(16)]
        expressions[-1] = "!" + expressions[-1]
        alternatives.append(
            {
                "name": f"alt{a}",
                "deviceClassName": f"binpack.{DRIVER}",
                "capacity": {"requests": {"memory": "1Gi"}},
                "selectors": [{"cel": {"expression": expression}} for expression in expressions],
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": alternatives}]}},
    }


def given_cores(cluster: Any, namespace: str) -> int:
    """The compute the namespace's allocated shares may use: a result's cores when HAMi-core
    limits them (0 < cores < 100), else a whole card's 100."""
    total = 0
    for item in cluster.get("resourceclaims", "-n", namespace)["items"]:
        allocation = (item.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != DRIVER or result.get("adminAccess"):
                continue
            cores = int(parse_quantity(str((result.get("consumedCapacity") or {}).get("cores", "0"))))
            total += cores if 0 < cores < 100 else 100
    return total


def assert_quotas_hold(tenancy: Tenancy) -> None:
    """Every quota of the tenant's namespace within its limits and, once the controller has
    written what it booked, its cores not under the compute given; no card over capacity."""
    tenancy.assert_contained()

    def quotas() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = tenancy.cluster.get(crd.PLURAL, "-n", TENANT_NS)["items"]
        return items

    for quota in quotas():
        used, hard = (quota.get("status") or {}).get("used") or {}, quota["spec"]["hard"]
        if "cores" in hard:
            assert int(used.get("cores", 0)) <= int(hard["cores"]), quota

    def cores_cover_compute() -> bool:
        given = given_cores(tenancy.cluster, TENANT_NS)
        return all(
            int(((q.get("status") or {}).get("used") or {}).get("cores", 0)) >= given for q in quotas()
        )

    wait_for(cores_cover_compute, 30, "status.used.cores of every quota at least the compute given")


@pytest.fixture
def compute_quota(tenancy: Tenancy) -> Any:
    body = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": "compute", "namespace": TENANT_NS},
        "spec": {"hard": {"cores": 50}},
    }
    tenancy.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    yield body
    tenancy.cluster.kubectl("delete", crd.PLURAL, "compute", "-n", TENANT_NS, "--ignore-not-found")


def used_cores(tenancy: Tenancy, name: str) -> int | None:
    quota = tenancy.cluster.get(crd.PLURAL, name, "-n", TENANT_NS)
    used = (quota.get("status") or {}).get("used")
    return None if used is None else int(used.get("cores", 0))


def test_a_share_without_cores_cannot_escape_a_cores_quota(tenancy: Tenancy, compute_quota: Any) -> None:
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("free", "1Gi"), pod("free", "free")))
    tenancy.described(
        TENANT_NS, "free", f"GpuQuotaExceeded: {TENANT_NS}/compute cores: used 0 + requested 100 > hard 50"
    )
    assert tenancy.gated(TENANT_NS, "free")
    limited = claim("limited", "1Gi", capacity={"requests": {"memory": "1Gi", "cores": "40"}})
    tenancy.tenant("apply", "-f", "-", stdin=manifest(limited, pod("limited", "limited")))
    tenancy.running(TENANT_NS, "limited")
    # What HAMi-core enforces in the container is what the quota charges.
    environment = tenancy.tenant("exec", "limited", "--", "env").splitlines()
    assert "CUDA_DEVICE_SM_LIMIT_0=40" in environment, environment
    wait_for(lambda: used_cores(tenancy, "compute") == 40, 60, "status.used.cores of the 40-core share")
    # A second coreless share is refused too: 40 + 100 > 50.
    tenancy.tenant("apply", "-f", "-", stdin=manifest(claim("free-2", "1Gi"), pod("free-2", "free-2")))
    tenancy.described(
        TENANT_NS, "free-2", f"GpuQuotaExceeded: {TENANT_NS}/compute cores: used 40 + requested 100"
    )
    assert tenancy.gated(TENANT_NS, "free") and tenancy.gated(TENANT_NS, "free-2")
    assert_quotas_hold(tenancy)
    for name in ("free", "free-2", "limited"):
        tenancy.tenant("delete", "pod", name, "--wait=true", "--timeout=60s")
        tenancy.tenant("delete", "resourceclaim", name, "--wait=true", "--timeout=60s")


def test_costly_selectors_do_not_hold_another_tenants_pod(tenancy: Tenancy) -> None:
    attackers = [
        costly_claim("attack-0", ISSUE_SELECTOR),
        costly_claim("attack-1", UNDER_LIMIT_SELECTOR),
        costly_claim("attack-2", UNDER_LIMIT_SELECTOR),
    ]
    pods = [pod(body["metadata"]["name"], body["metadata"]["name"]) for body in attackers]
    tenancy.tenant("apply", "-f", "-", stdin=manifest(*attackers, *pods))
    victim = [claim("victim", "1Gi"), pod("victim", "victim")]
    tenancy.cluster.kubectl("apply", "-n", OTHER_NS, "-f", "-", stdin=manifest(*victim))
    started = time.monotonic()
    wait_for(
        lambda: not tenancy.gated(OTHER_NS, "victim"),
        VICTIM_BOUND,
        "another tenant's pod placed while the costly selectors are planned",
        interval=0.2,
    )
    print(f"another tenant's pod placed {time.monotonic() - started:.1f} s after it was created")
    tenancy.running(OTHER_NS, "victim")
    # Each attacking claim stops with its selector error, as kube-scheduler words them.
    tenancy.described(
        TENANT_NS, "attack-0", "claim tenant-a/attack-0: selector #0: CEL compile error: estimated cost"
    )
    for name in ("attack-1", "attack-2"):
        tenancy.described(TENANT_NS, name, f"claim tenant-a/{name}: selector #")
        tenancy.described(TENANT_NS, name, "CEL runtime error: cost budget exhausted")
        assert tenancy.gated(TENANT_NS, name)
    assert_quotas_hold(tenancy)
    tenancy.cluster.kubectl("delete", "pod", "victim", "-n", OTHER_NS, "--wait=true", "--timeout=60s")
    for body in attackers:
        tenancy.tenant("delete", "pod", body["metadata"]["name"], "--wait=true", "--timeout=60s")
