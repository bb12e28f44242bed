"""The ledger (dra_driver/controller/ledger.py): what every allocated claim uses of our cards, and
the planner's trials. Its invariants under random workloads: test_ledger_properties.py."""

from __future__ import annotations

import pytest

from dra_driver.contract import DeviceId
from dra_driver.engine import DeviceShare, Placement
from dra_driver.resource.uses import Use, claim_uses
from tests.controller.harness import DRIVER, claim, request
from tests.controller.worlds import planner, shared_on_gpu0


def test_a_fractional_consumed_amount_is_counted_up_not_down() -> None:
    obj = claim("half", request())
    obj["status"] = {"allocation": shared_on_gpu0("s", "1.5", cores="0.5")}
    (use,) = claim_uses(obj, DRIVER)
    assert (use.memory, use.cores, use.slots) == (2, 1, 1)


def test_a_trial_is_seen_while_it_lasts_and_undone_after_it_even_on_error() -> None:
    ledger, _ = planner(gpus=2)
    ledger.set_claim("kept", (Use(DeviceId(DRIVER, "n1", "gpu-1"), 1024, 10, 1),))
    share = DeviceShare(0, 2048, 20, 1)

    def usage() -> list[tuple[int, int, int]]:
        return [
            (u.used_memory, u.used_cores, u.tenants)
            for _, u in sorted(ledger.state.nodes["n1"].usage.items())
        ]

    recorded = usage()
    assert recorded == [(0, 0, 0), (1024, 10, 1)]
    with ledger.trial() as trial:
        trial.allocate(Placement("n1", (share,)))
        assert usage() == [(2048, 20, 1), (1024, 10, 1)]  # a later request of the pod sees it
    assert usage() == recorded
    with pytest.raises(RuntimeError), ledger.trial() as trial:
        trial.allocate(Placement("n1", (share, DeviceShare(1, 1024, 10, 1))))
        raise RuntimeError("the planner failed half-way")
    assert usage() == recorded  # the claim recorded before the trial is still counted, nothing else


@pytest.mark.parametrize(
    ("cores", "charged"),
    [(0, 100), (1, 1), (40, 40), (99, 99), (100, 100), (None, 100)],
    ids=["no-sm-limit", "one", "forty", "ninety-nine", "all", "whole-card"],
)
def test_quotas_are_charged_the_compute_a_result_is_given(cores: int | None, charged: int) -> None:
    # HAMi-core limits SMs only for 0 < cores < 100: a share asking for none runs unthrottled, so
    # its namespace is charged a whole card, as for a whole-card result (issue 34).
    ledger, _ = planner(gpus=1)
    memory = None if cores is None else 1024
    use = Use(DeviceId(DRIVER, "n1", "gpu-0"), memory, cores, None if cores is None else 1, "ns", DRIVER)
    charge = ledger.charge(use)
    assert charge.cores == charged
    assert charge.memory == (1024 if cores is not None else ledger.inventory["n1"].device_at(0).card.memory)
