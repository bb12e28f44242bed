"""``simulate --from-cluster --claims`` replays priorities and gangs (issue 38 item 4): what-if
claims carry a priority and a gang; they are planned the highest priority first, a gang all
together or not at all, and a claim that fits nowhere reports the pods the controller would
preempt for it, which is what the controller then evicts; nothing is evicted by ``simulate``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from dra_driver.cli import main
from dra_driver.simulate.cluster import ClusterSimulation, simulate_on_cluster
from dra_driver.simulate.render import result_document
from dra_driver.simulate.run import Preempted
from dra_driver.simulate.scenario import ClaimsFile, ClaimSpec
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import DRIVER, NS
from tests.controller.test_gang_preemption import notebooks, share_gang
from tests.controller.test_preemption_flow import busy_card, evicted
from tests.explain.listed import listed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "what-if" / "priorities.yaml"


def simulated(cluster: FakeCluster, *claims: dict[str, Any]) -> ClusterSimulation:
    specs = [ClaimSpec.model_validate({"namespace": NS, **claim}) for claim in claims]
    return simulate_on_cluster(listed(cluster), specs, DRIVER)


def outcomes(simulation: ClusterSimulation) -> list[str | None]:
    """Per claim, in the file's order: the node it is placed on, or None."""
    return [d.placement.node if d.placement else None for d in simulation.result.decisions]


def test_claims_are_planned_the_highest_priority_first_and_reported_in_the_file_s_order() -> None:
    cluster = FakeCluster()  # one H100: two 50Gi claims do not both fit
    simulation = simulated(
        cluster,
        {"name": "batch", "memory": "50Gi", "priority": 1},
        {"name": "serving", "memory": "50Gi", "priorityClassName": "serving", "priority": 1000},
    )
    assert [d.request for d in simulation.result.decisions] == ["batch", "serving"]
    assert outcomes(simulation) == [None, "node-1"]
    assert simulation.reasons[0] == "Unschedulable"
    # Planned in the file's order (equal priorities), the first one wins.
    same = simulated(cluster, {"name": "batch", "memory": "50Gi"}, {"name": "serving", "memory": "50Gi"})
    assert outcomes(same) == ["node-1", None]


def test_a_claim_that_fits_nowhere_reports_the_victims_and_the_controller_evicts_them() -> None:
    cluster = busy_card()  # old 40Gi and young 39Gi, priority 1, running on node-1's one card
    before = copy.deepcopy(cluster.kube.objects)
    simulation = simulated(cluster, {"name": "urgent", "memory": "10Gi", "priority": 1000})
    assert outcomes(simulation) == ["node-1"]
    assert simulation.result.victims_of(0) == (Preempted(f"{NS}/young", 1, "node-1"),)
    assert cluster.kube.objects == before  # nothing evicted, nothing written
    document = result_document(simulation.result)["results"][0]
    assert document["preempts"] == [{"pod": f"{NS}/young", "priority": 1, "node": "node-1"}]
    # The controller, given the same pod, evicts the same victim.
    cluster.gpu_pod("urgent", "10Gi", priority=1000)
    cluster.run()
    assert evicted(cluster) == ["young"]


def test_equal_priority_and_preemption_policy_never_preempt_nothing() -> None:
    cluster = busy_card()
    simulation = simulated(
        cluster,
        {"name": "peer", "memory": "10Gi", "priority": 1},
        {"name": "polite", "memory": "10Gi", "priority": 1000, "preemptionPolicy": "Never"},
    )
    assert outcomes(simulation) == [None, None]
    assert simulation.result.victims == ((), ())


def test_a_gang_is_placed_all_together_or_not_at_all() -> None:
    cluster = FakeCluster(gpus=2)
    whole = [{"name": f"a-{i}", "count": 1, "gang": {"name": "a", "minMember": 3}} for i in range(3)]
    pair = [{"name": f"b-{i}", "count": 1, "gang": {"name": "b", "minMember": 2}} for i in range(2)]
    simulation = simulated(cluster, *whole, *pair)
    # Three whole cards on a node of two: none of gang a placed, so gang b fits.
    assert outcomes(simulation) == [None, None, None, "node-1", "node-1"]
    reason = simulation.result.decisions[0].reason
    assert reason is not None and "gang pod group default/a" in reason and "needs 3" in reason
    assert simulation.reasons[:3] == ("Unschedulable",) * 3


def test_a_gang_preempts_together_as_the_controller_does() -> None:
    cluster = busy_card()
    members = [
        {"name": f"train-{i}", "memory": "15Gi", "priority": 1000, "gang": {"name": "train", "minMember": 2}}
        for i in range(2)
    ]
    simulation = simulated(cluster, *members)
    assert outcomes(simulation) == ["node-1", "node-1"]
    victim = Preempted(f"{NS}/young", 1, "node-1")
    assert simulation.result.victims == ((victim,), (victim,))
    assert evicted(cluster) == []
    share_gang(cluster, "train", 2, "15Gi", priority=1000)  # the same gang, to the controller
    cluster.run()
    assert evicted(cluster) == ["young"]


def test_priority_and_gang_mistakes_are_one_clear_error_each() -> None:
    with pytest.raises(ValidationError, match="priorityClassName 'serving' needs its value as priority"):
        ClaimSpec.model_validate({"name": "c", "priorityClassName": "serving"})
    with pytest.raises(ValidationError, match=r"claims\[1\]\(b\).gang.minMember: 3, but an earlier member"):
        ClaimsFile.model_validate(
            {
                "claims": [
                    {"name": "a", "gang": {"name": "g", "minMember": 2}},
                    {"name": "b", "gang": {"name": "g", "minMember": 3}},
                ]
            }
        )
    with pytest.raises(ValidationError, match="preemptionPolicy"):
        ClaimSpec.model_validate({"name": "c", "preemptionPolicy": "Sometimes"})


def test_a_scenario_file_says_priorities_and_gangs_are_not_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = Path(__file__).resolve().parents[2] / "examples" / "worked-example.yaml"
    claims = tmp_path / "claims.yaml"
    claims.write_text("- {name: fits, memory: 1000Mi, priority: 10, gang: {name: g, minMember: 1}}\n")
    assert main(["simulate", str(scenario), "--claims", str(claims), "-o", "json"]) == 0
    err = capsys.readouterr().err
    assert "(fits).priority/gang not used: a scenario has no pods to order, group or preempt" in err


def test_the_example_claims_file_on_the_notebooks_of_policies_md() -> None:
    """examples/what-if/priorities.yaml on docs/policies.md's three notebooks (priority 100, one
    H100, notebook-c protected by a budget the simulation does not see): serving preempts the
    youngest notebook, the gang needs two whole cards the node does not have (and preempts
    nothing: evicting every notebook frees one card), the notebook takes what serving left."""
    cluster = notebooks()
    claims = ClaimsFile.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    simulation = simulate_on_cluster(listed(cluster), claims.claims, DRIVER, claims.defaults)
    by_name = dict(zip((c.name for c in claims.claims), simulation.result.decisions, strict=True))
    assert by_name["serving"].placement is not None
    position = [c.name for c in claims.claims].index("serving")
    assert [v.pod for v in simulation.result.victims_of(position)] == ["team/notebook-c"]
    assert by_name["train-0"].placement is None and by_name["train-1"].placement is None
    assert simulation.result.victims_of(position + 1) == ()
    notebook = by_name["notebook"].placement  # 19Gi freed, 10Gi to serving: 8Gi fit
    assert notebook is not None and notebook.node == "node-1"
