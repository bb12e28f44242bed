"""One tenant's costly selectors cannot hold the planner (issue 34).

Each claim's selectors spend a cost budget per plan (its exhaustion is the claim's selector error,
cached so later passes pay nothing), and a pass takes pods namespaces in turn and stops after its
time budget, so another tenant's pod waits for at most one pod of each other namespace.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dra_driver.cel import cost
from dra_driver.controller import eligibility
from dra_driver.controller.retries import fair_order
from tests.controller.fake_cluster import THREE_NODES, FakeCluster
from tests.controller.harness import DRIVER

LIST = "[" + ", ".join(str(i) for i in range(40)) + "]"
#: Under the per-evaluation limit (about 20,000), so only the claim's budget can stop it; every
#: step is taken. A request's last selector says no, so every alternative is tried on every device.
COSTLY = f"{LIST}.all(x, {LIST}.all(y, x + y >= {{n}}))"


def costly_claim(alternatives: int = 8, selectors: int = 16) -> dict[str, Any]:
    """The attack's shape: ``firstAvailable`` alternatives of many legal, costly selectors."""
    subrequests = [
        {
            "name": f"alt{a}",
            "deviceClassName": DRIVER,
            "selectors": [
                {
                    "cel": {
                        "expression": ("!" if s == selectors - 1 else "")
                        + COSTLY.format(n=-(a * selectors + s))
                    }
                }
                for s in range(selectors)
            ],
        }
        for a in range(alternatives)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "x"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}},
    }


class Counting:
    """Counts the claim-selector evaluations the Matcher makes (class selectors have no budget)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claim_evaluations = 0
        inner = eligibility.selectors_match

        def counted(subject: str, expressions: Any, device: Any, budget: Any = None) -> bool:
            if budget is not None:
                self.claim_evaluations += len(expressions)
            return inner(subject, expressions, device, budget)

        monkeypatch.setattr(eligibility, "selectors_match", counted)


def test_the_pass_order_interleaves_namespaces_and_starts_after_the_last_served() -> None:
    created = {"a/1": "1", "a/2": "2", "a/3": "3", "b/1": "4", "c/1": "0"}.__getitem__
    keys = ["a/3", "b/1", "a/1", "c/1", "a/2"]
    assert fair_order(keys, created, "") == ["a/1", "b/1", "c/1", "a/2", "a/3"]
    assert fair_order(keys, created, "a") == ["b/1", "c/1", "a/1", "a/2", "a/3"]
    assert fair_order(keys, created, "c") == ["a/1", "b/1", "c/1", "a/2", "a/3"]


def test_a_claim_over_its_cost_budget_is_refused_with_its_selector_error_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cost, "CLAIM_COST_BUDGET", 1_000_000)  # 50 evaluations: a quick test
    counting = Counting(monkeypatch)
    cluster = FakeCluster(THREE_NODES)
    cluster.pod("attacker", costly_claim(), namespace="tenant-a")
    cluster.gpu_pod("victim", "10Gi", namespace="tenant-b")
    cluster.run(2)
    assert not cluster.gated("victim", "tenant-b")
    message = (cluster.condition("attacker", "tenant-a") or {}).get("message", "")
    assert "claim tenant-a/attacker: selector #" in message and "cost budget exhausted" in message
    per_evaluation = cost.estimate_cost(COSTLY.format(n=0))
    # Counted per call of 16 selectors: the last call's are counted whole, though it stopped early.
    assert counting.claim_evaluations <= cost.CLAIM_COST_BUDGET // per_evaluation + 16
    spent = counting.claim_evaluations
    # Every pending pod is planned again (what a resync does): the refusal is remembered.
    cluster.controller.queue.retry_all()
    cluster.controller.queue.activate(["tenant-a/attacker"])
    cluster.run(2)
    assert counting.claim_evaluations == spent
    assert cluster.gated("attacker", "tenant-a")


def test_a_cheap_claim_with_selectors_is_placed_within_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    cluster = FakeCluster(THREE_NODES)
    claim = costly_claim(alternatives=1, selectors=2)
    for selector in claim["spec"]["devices"]["requests"][0]["firstAvailable"][0]["selectors"]:
        selector["cel"]["expression"] = selector["cel"]["expression"].removeprefix("!")
    cluster.pod("fine", claim, namespace="tenant-a")
    cluster.run(2)
    assert not cluster.gated("fine", "tenant-a")
    assert 0 < counting.claim_evaluations <= 2 * len(THREE_NODES)


def test_a_pass_stops_at_its_budget_and_the_next_starts_with_the_other_namespace() -> None:
    cluster = FakeCluster(THREE_NODES, record_plans=True)
    ticks = itertools.count()
    cluster.controller.queue.clock = lambda: float(next(ticks))  # every look at the clock: one second on
    for index in range(3):
        cluster.gpu_pod(f"a-{index}", "10Gi", namespace="tenant-a")
    cluster.gpu_pod("b", "10Gi", namespace="tenant-b")  # created after all of tenant-a's
    cluster.controller.run_once()
    assert [name for name, _ in cluster.planned()] == ["a-0"]  # then the pass's 0.5 s were spent
    cluster.controller.run_once()
    assert [name for name, _ in cluster.planned()] == ["b"]  # the other namespace first
    cluster.run(4)
    assert {name for name, _ in cluster.planned()} == {"a-1", "a-2"}
    assert all(not cluster.gated(name, ns) for name, ns in (("a-1", "tenant-a"), ("b", "tenant-b")))


def test_without_a_cut_a_pass_still_takes_namespaces_in_turn() -> None:
    cluster = FakeCluster(THREE_NODES, record_plans=True)
    for index in range(3):
        cluster.gpu_pod(f"a-{index}", "1Gi", namespace="tenant-a")
    cluster.gpu_pod("b", "1Gi", namespace="tenant-b")
    cluster.controller.run_once()
    assert [name for name, _ in cluster.planned()] == ["a-0", "b", "a-1", "a-2"]
