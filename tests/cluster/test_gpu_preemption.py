"""Share-aware preemption on the real cluster (issue 38 item 2): four T4 full of lower-priority
shares, the youngest protected by a PodDisruptionBudget; a high-priority pod asking for 10 GiB
runs after the controller evicts the cheapest share it may (the next youngest) through the
Eviction API; the protected pod is untouched and nobody else took the freed capacity. A gang of
two high-priority workers gets two cards the same way (preemption for a whole gang).

The victims trap SIGTERM (they leave at the end of their grace period), so the test sees a victim
terminating, with its DisruptionTarget condition, while a pod of their priority arrives that
would fit in the freed room.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL
from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest, HostDriver
from tests.cluster.test_e2e import POD_TIMEOUT, recipe_classes
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
TEAM = "preempt-team"
RECIPE = "binpack"
LOW, HIGH = "hami-test-batch", "hami-test-serving"
#: A share that fills a T4 (14967 MiB published) but for 967 MiB.
FULL = "14000Mi"
GRACE = 8


def template(name: str, memory: str) -> dict[str, Any]:
    body = manifests.claim_template(RECIPE)
    body["metadata"].update(name=name, namespace=TEAM)
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = memory
    return body


def gpu_pod(
    name: str, memory: str, priority_class: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    body = manifests.pod(manifests.DemoPod(name, RECIPE, "-", "preemption"))
    body["metadata"]["namespace"] = TEAM
    body["metadata"]["labels"].update(labels or {})
    body["spec"]["priorityClassName"] = priority_class
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"share-{memory.lower()}"}]
    body["spec"]["terminationGracePeriodSeconds"] = GRACE
    body["spec"]["containers"][0]["command"] = ["sh", "-c", "trap '' TERM; sleep 86400"]
    return body


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "description": "hami-dra preemption test"}  # fmt: skip


def apply(cluster: RealCluster, *objects: dict[str, Any]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


@pytest.fixture
def team(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[RealCluster]:
    real_cluster.kubectl("create", "namespace", TEAM)
    apply(
        real_cluster,
        *recipe_classes(driver, RECIPE),
        priority_class(LOW, 100),
        priority_class(HIGH, 1000),
        *(template(f"share-{memory.lower()}", memory) for memory in (FULL, "10Gi", "5000Mi")),
    )
    try:
        yield real_cluster
    finally:
        real_cluster.kubectl("delete", "namespace", TEAM, "--wait=true", "--timeout=180s")
        real_cluster.kubectl("delete", "priorityclass", LOW, HIGH, "--ignore-not-found")


def pod(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    found = json.loads(cluster.kubectl("get", "pods", "-n", TEAM, "-o", "json"))["items"]
    return next((item for item in found if item["metadata"]["name"] == name), None)


def running(cluster: RealCluster, name: str) -> None:
    cluster.kubectl(
        "wait", "--for=condition=Ready", f"pod/{name}", "-n", TEAM, f"--timeout={POD_TIMEOUT:.0f}s"
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def full_cards(team: RealCluster) -> None:
    """Four batch pods fill the four cards, one each (binpack), each younger than the last; the
    youngest is protected by a budget that allows no disruption."""
    for index in range(4):
        labels = {"preempt-test": "guarded"} if index == 3 else None
        apply(team, gpu_pod(f"batch-{index}", FULL, LOW, labels))
        running(team, f"batch-{index}")
    apply(team, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": TEAM},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"preempt-test": "guarded"}}},
    })  # fmt: skip
    wait_for(
        lambda: (team.get("pdb", "guarded", "-n", TEAM).get("status") or {}).get("observedGeneration"),
        60,
        "the disruption controller to observe the budget",
        0.5,
    )


def evicted_and_marked(team: RealCluster, name: str) -> dict[str, Any] | None:
    """The pod's DisruptionTarget condition once it terminates with ours (written again after the
    Eviction API's own); None before."""
    found = pod(team, name)
    if found is None or not found["metadata"].get("deletionTimestamp"):
        return None
    marked = condition(found, "DisruptionTarget")
    return marked if marked is not None and marked["reason"] == "PreemptionByHamiDra" else None


def test_the_cheapest_lower_priority_share_makes_room_for_a_high_priority_pod(team: RealCluster) -> None:
    full_cards(team)
    started = time.monotonic()
    apply(team, gpu_pod("serving", "10Gi", HIGH))

    # The victim: the youngest pod the Eviction API lets go (batch-3 is protected).
    marked = wait_for(
        lambda: evicted_and_marked(team, "batch-2"), POD_TIMEOUT, "batch-2 evicted, with our condition", 0.5
    )
    assert marked["status"] == "True" and f"{TEAM}/serving" in marked["message"]
    # While it terminates, a batch pod that would fit in the freed room arrives: it may not take it.
    apply(team, gpu_pod("sneaky", "5000Mi", LOW))
    running(team, "serving")
    ran_after = time.monotonic() - started
    placed = pod(team, "serving")
    assert placed is not None and placed["spec"].get("nodeName")
    sneaky = pod(team, "sneaky")
    assert sneaky is not None and not sneaky["spec"].get("nodeName")
    reason = condition(sneaky, "gpu.hami.io/Allocated")
    assert reason is not None and reason["reason"] == "Unschedulable", reason
    # The budget's pod and the older ones are untouched.
    for name in ("batch-0", "batch-1", "batch-3"):
        kept = pod(team, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), name
        assert condition(kept, "DisruptionTarget") is None, name
    gone = pod(team, "batch-2")
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    events = json.loads(
        team.kubectl("get", "events", "-n", TEAM, "--field-selector", "reason=Preempted", "-o", "json")
    )["items"]
    assert [event["involvedObject"]["name"] for event in events] == ["batch-2"]
    print(f"serving ran {ran_after:.1f}s after it was created (victim grace period {GRACE}s)")


def test_a_controller_killed_mid_preemption_loses_nothing(team: RealCluster, driver: DriverUnderTest) -> None:
    """SIGKILL the controller while the victim terminates: the new one reads the nomination back,
    evicts no one else and places the preemptor once the victim is gone."""
    if not isinstance(driver, HostDriver):
        pytest.skip("the controller is killed as a host process (the fault suite's way)")
    full_cards(team)
    apply(team, gpu_pod("serving", "10Gi", HIGH))
    wait_for(lambda: evicted_and_marked(team, "batch-2"), POD_TIMEOUT, "batch-2 evicted", 0.5)
    driver.kill("controller")
    apply(team, gpu_pod("sneaky", "5000Mi", LOW))
    running(team, "serving")
    sneaky = pod(team, "sneaky")
    assert sneaky is not None and not sneaky["spec"].get("nodeName")
    for name in ("batch-0", "batch-1", "batch-3"):
        kept = pod(team, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), name


def gang_member(name: str) -> dict[str, Any]:
    """A 10 GiB worker of gang ``serving-gang`` at the high priority (its minimum, 2, from our
    annotation: no PodGroup CRD needed)."""
    body = gpu_pod(name, "10Gi", HIGH, {POD_GROUP_LABEL: "serving-gang"})
    body["metadata"].setdefault("annotations", {})[MIN_MEMBERS_ANNOTATION] = "2"
    return body


def test_a_high_priority_gang_evicts_the_cheapest_lower_priority_shares_and_runs(
    team: RealCluster, driver: DriverUnderTest
) -> None:
    """Preemption for a whole gang: two 10 GiB workers (priority 1000) need two cards freed; the
    two youngest shares the Eviction API lets go are evicted (batch-2, batch-1; batch-3 is
    protected), both workers run, batch-0 and batch-3 are untouched, and a batch pod arriving
    meanwhile does not take the room held for the gang."""
    full_cards(team)
    apply(team, gang_member("worker-0"), gang_member("worker-1"))
    for victim in ("batch-2", "batch-1"):
        marked = wait_for(
            functools.partial(evicted_and_marked, team, victim), POD_TIMEOUT, f"{victim} evicted", 0.5
        )
        assert marked["status"] == "True" and f"gang {TEAM}/serving-gang" in marked["message"]
    apply(team, gpu_pod("sneaky", "5000Mi", LOW))
    for worker in ("worker-0", "worker-1"):
        running(team, worker)
    sneaky = pod(team, "sneaky")
    assert sneaky is not None and not sneaky["spec"].get("nodeName")
    selector = "reason=Preempted"
    preempted = json.loads(
        team.kubectl("get", "events", "-n", TEAM, "--field-selector", selector, "-o", "json")
    )["items"]
    said = [(event["involvedObject"]["name"], event["message"]) for event in preempted]
    log = [line for line in driver.log("controller").splitlines() if "evict" in line or "preempt" in line]
    for name in ("batch-0", "batch-3"):
        kept = pod(team, name)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp"), (name, said, log[-30:])
        assert condition(kept, "DisruptionTarget") is None, name
    assert sorted(name for name, _ in said) == ["batch-1", "batch-2"], said
