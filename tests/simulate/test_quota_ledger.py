"""``QuotaLedger`` (running totals) decides as ``dra_driver.quota.find_breach`` (full recount) does."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.contract import DeviceId
from dra_driver.quota import Charge, Limits, Quota, find_breach
from dra_driver.simulate.run import QuotaLedger

NS = "team-a"
CLASSES = ("gpu.hami.io", "gpu-binpack", "")
devices = st.builds(
    lambda node, index: DeviceId("gpu.hami.io", f"n{node}", f"gpu-{index}"),
    st.integers(0, 2),
    st.integers(0, 2),
)
charges = st.builds(Charge, st.sampled_from(CLASSES), devices, st.integers(0, 40), st.integers(0, 60))
limits = st.builds(
    Limits,
    memory=st.none() | st.integers(0, 200),
    cores=st.none() | st.integers(0, 300),
    devices=st.none() | st.integers(0, 6),
)
quotas = st.lists(
    st.builds(
        lambda name, hard, classes: Quota(NS, name, hard, frozenset(classes)),
        st.sampled_from(["a", "b", "c"]),
        limits,
        st.sets(st.sampled_from(CLASSES[:2]), max_size=2),
    ),
    max_size=3,
)


@settings(max_examples=100, deadline=None)
@given(
    listed=quotas,
    existing=st.lists(charges, max_size=8),
    steps=st.lists(st.lists(charges, max_size=3), max_size=8),
)
def test_same_breach_as_a_full_recount(listed: list[Quota], existing: list[Charge], steps: Any) -> None:
    ledger = QuotaLedger({NS: listed}, {NS: existing})
    recorded = list(existing)
    for new in steps:
        expected = find_breach(listed, recorded, new)
        assert ledger.breach(NS, new) == expected
        assert ledger.breach("elsewhere", new) is None
        if expected is None:
            ledger.add(NS, new)
            recorded.extend(new)
