"""``ClaimAssumptions``: what the controller counts for a claim while and after writing it."""

from __future__ import annotations

from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.controller.assumed import ASSUME_SECONDS, ClaimAssumptions
from dra_driver.controller.ledger import Ledger
from dra_driver.resource.objects import ClaimView
from dra_driver.resource.uses import Use
from tests.controller.harness import DRIVER, NS

PLANNED = (Use(DeviceId(DRIVER, "node-1", "gpu-0"), 1024, 0, 1, NS, DRIVER),)


def claim(rv: str, *, allocated: bool, uid: str = "u1") -> ClaimView:
    body: dict[str, Any] = {"metadata": {"name": "c", "namespace": NS, "uid": uid, "resourceVersion": rv}}
    if allocated:
        body["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0",
             "consumedCapacity": {"memory": "1Ki", "cores": "0", "slots": "1"}}]}}}  # fmt: skip
    return ClaimView(body, DRIVER)  # as the informer boundary parses it


def make() -> tuple[Ledger, ClaimAssumptions, list[float]]:
    ledger, now = Ledger(), [0.0]
    return ledger, ClaimAssumptions(ledger, DRIVER, clock=lambda: now[0]), now


def test_planned_uses_count_while_writing_and_our_own_intermediate_events_do_not_erase_them() -> None:
    ledger, assumed, _ = make()
    assumed.begin_write(claim("1", allocated=False), PLANNED)
    assert ledger.claims()["u1"] == PLANNED and assumed.writing(f"{NS}/c")
    assumed.observed(claim("2", allocated=False), claim("2", allocated=False))  # the finalizer update
    assert ledger.claims()["u1"] == PLANNED
    assumed.end_write(claim("1", allocated=False))
    written = claim("3", allocated=True)
    assumed.wrote(written)
    assert not assumed.in_flight and [u.device.device for u in ledger.claims()["u1"]] == ["gpu-0"]


def test_an_older_event_after_the_write_keeps_the_written_view_until_the_cache_catches_up() -> None:
    ledger, assumed, now = make()
    written = claim("3", allocated=True)
    assumed.wrote(written)
    stale = claim("2", allocated=False)
    assumed.observed(stale, stale)
    assert assumed.effective(f"{NS}/c", stale) is written and ledger.claims()["u1"]
    now[0] = ASSUME_SECONDS + 1  # the watch never delivered it: the cache is the truth again
    assert assumed.effective(f"{NS}/c", stale) is stale and not assumed.is_assumed(f"{NS}/c")
    assumed.wrote(written)
    newer = claim("4", allocated=True)
    assert assumed.effective(f"{NS}/c", newer) is newer and not assumed.is_assumed(f"{NS}/c")


def test_a_gone_claim_is_neither_counted_nor_assumed() -> None:
    ledger, assumed, _ = make()
    assumed.wrote(claim("3", allocated=True))
    assumed.gone(claim("3", allocated=True))
    assert "u1" not in ledger.claims() and not assumed.is_assumed(f"{NS}/c")
    assumed.wrote(claim("5", allocated=True))
    other = claim("6", allocated=False, uid="u2")  # a new object with the same name
    assert assumed.effective(f"{NS}/c", other) is other
