"""Leader election stepped on a fake clock over ``FakeKube``: the races are exact, not timed.

Replaces timing-based checks (a 0.9 s delayed renewal against a 0.75 s deadline on the sandbox),
which a loaded machine could make flaky.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from dra_driver.kube.api import LEASES, Obj, Resource
from dra_driver.kube.leader import Clock, LeaderElector, _format, _parse
from tests.controller.fake_kube import FakeKube

NS = "hami-system"
TIMING = {"lease_duration": 1.0, "renew_deadline": 0.75, "retry_period": 0.1}


@dataclass
class FakeTime:
    now: float = 1_000_000.0

    def clock(self) -> Clock:
        return Clock(monotonic=lambda: self.now, wall=lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class SlowLeaseKube(FakeKube):
    """Lease updates take ``delays`` seconds each (in fake time), in order; then none."""

    time: FakeTime = field(default_factory=FakeTime)
    delays: list[float] = field(default_factory=list)

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
        written = super().update(resource, obj, status=status)
        if resource is LEASES and self.delays:
            self.time.advance(self.delays.pop(0))  # the answer arrives late; the write happened
        return written


def elector(kube: SlowLeaseKube, identity: str, **kwargs: Any) -> LeaderElector:
    return LeaderElector(kube, NS, identity, clock=kube.time.clock(), **{**TIMING, **kwargs})


def holder(kube: FakeKube) -> str:
    return str(kube.stored(LEASES, NS, "hami-dra-controller")["spec"]["holderIdentity"])


def test_the_first_replica_acquires_and_the_second_waits() -> None:
    kube = SlowLeaseKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    a.step()
    b.step()
    assert a.is_leader() and not b.is_leader() and holder(kube) == "a"
    kube.time.advance(0.5)
    a.step()  # renewed in time
    kube.time.advance(0.6)  # 1.1 s after the first acquisition, 0.6 s after the renewal
    b.step()
    assert a.is_leader() and not b.is_leader()
    lease = kube.stored(LEASES, NS, "hami-dra-controller")
    assert lease["spec"]["leaseTransitions"] == 0 and lease["spec"]["leaseDurationSeconds"] == 1


def test_a_slow_renewal_counts_from_when_it_was_sent() -> None:
    kube = SlowLeaseKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    a.step()
    kube.time.advance(0.5)
    kube.delays = [0.9]  # the renewal is written now but answered 0.9 s later
    a.step()
    assert not a.is_leader(), "an answer later than the renew deadline must not extend leadership"
    kube.time.advance(0.1)  # the lease (renewed at the send time) has expired for everyone else
    b.step()
    assert b.is_leader() and not a.is_leader() and holder(kube) == "b"
    assert kube.stored(LEASES, NS, "hami-dra-controller")["spec"]["leaseTransitions"] == 1


def test_leadership_lapses_at_the_renew_deadline_before_others_may_take_over() -> None:
    kube = SlowLeaseKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    a.step()
    kube.fail("get", "leases", 500, times=100)  # the API is unreachable for a's renewals
    for _ in range(7):
        kube.time.advance(0.1)
        a.step()
    assert a.is_leader()  # 0.7 s since the last renewal: still within the 0.75 s deadline
    kube.time.advance(0.1)
    assert not a.is_leader()  # 0.8 s: given up, 0.2 s before the lease expires for others
    kube.time.advance(0.25)
    kube._failures.clear()
    b.step()
    assert b.is_leader() and not a.is_leader()


def test_two_candidates_for_an_expired_lease_never_both_win() -> None:
    kube = SlowLeaseKube()
    old = elector(kube, "old")
    old.step()
    kube.time.advance(5)
    b, c = elector(kube, "b"), elector(kube, "c")
    lease_for_b = kube.get(LEASES, NS, "hami-dra-controller")
    c.step()  # c writes first
    original_get = kube.get
    kube.get = lambda *args: lease_for_b if args[0] is LEASES else original_get(*args)  # type: ignore[method-assign]
    b.step()  # b's write carries the older resourceVersion: 409, b does not lead
    assert c.is_leader() and not b.is_leader() and holder(kube) == "c"


def test_stopping_releases_the_lease_for_an_immediate_takeover() -> None:
    kube = SlowLeaseKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    a.step()
    a.stop()
    assert not a.is_leader()
    lease = kube.stored(LEASES, NS, "hami-dra-controller")
    assert lease["spec"]["holderIdentity"] is None
    b.step()
    assert b.is_leader()


def test_the_first_replica_creates_the_lease_as_the_api_expects_it() -> None:
    kube = SlowLeaseKube()
    elector(kube, "a", lease_duration=15.0).step()
    lease = kube.stored(LEASES, NS, "hami-dra-controller")
    assert (lease["apiVersion"], lease["kind"]) == ("coordination.k8s.io/v1", "Lease")
    assert lease["metadata"]["namespace"] == NS
    spec = lease["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("a", 15, 0)
    assert spec["acquireTime"] == spec["renewTime"] == "1970-01-12T13:46:40.000000Z"  # FakeTime's start


def test_a_lease_that_names_no_duration_lasts_our_own() -> None:
    """Another holder's Lease without ``leaseDurationSeconds`` is held for our duration, not 0."""
    kube = SlowLeaseKube()
    kube.put(LEASES, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hami-dra-controller", "namespace": NS},
        "spec": {"holderIdentity": "other", "renewTime": "1970-01-12T13:46:40.000000Z"},
    })  # fmt: skip
    b = elector(kube, "b")  # lease_duration 1.0
    kube.time.advance(0.9)
    b.step()
    assert not b.is_leader() and holder(kube) == "other"
    kube.time.advance(0.2)
    b.step()
    assert b.is_leader()


def test_stopping_a_replica_that_does_not_lead_leaves_the_lease_alone() -> None:
    kube = SlowLeaseKube()
    a, b = elector(kube, "a"), elector(kube, "b")
    a.step()
    b.step()

    def no_reads(*args: Any) -> Obj:
        raise AssertionError(f"a replica that does not lead read {args[:3]} on stop")

    kube.get = no_reads  # type: ignore[method-assign]
    b.stop()
    assert holder(kube) == "a" and not b.is_leader()


def test_the_timings_default_to_kube_controller_managers() -> None:
    defaults = LeaderElector(SlowLeaseKube(), NS, "a")
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (15.0, 10.0, 2.0)


def test_leading_holds_up_to_the_renew_deadline_inclusive() -> None:
    kube = SlowLeaseKube()
    a = elector(kube, "a", renew_deadline=0.5)
    a.step()
    kube.time.advance(0.5)
    assert a.is_leader() is True, "exactly at the deadline: still leading"
    kube.time.advance(0.01)
    assert a.is_leader() is False
    kube.delays = [0.5]  # a renewal answered exactly at the deadline still counts
    a.step()
    assert a.is_leader() is True


def test_lease_times_are_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert _parse("2026-01-01T00:00:00.000000Z") == 1767225600.0
        assert _parse("2026-01-01T00:00:00Z") == 1767225600.0
        assert _format(1767225600.0) == "2026-01-01T00:00:00.000000Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_leader_that_finds_the_lease_taken_stops_leading_at_once() -> None:
    """Not at its renew deadline: another holder's valid Lease means two leaders until then."""
    kube = SlowLeaseKube()
    a = elector(kube, "a")
    a.step()
    assert a.is_leader()
    lease = kube.get(LEASES, NS, "hami-dra-controller")
    lease["spec"] |= {"holderIdentity": "b", "renewTime": lease["spec"]["renewTime"]}
    kube.update(LEASES, lease)  # b took over (an admin, or a replica with a skewed clock)
    kube.time.advance(0.1)  # well within a's renew deadline
    a.step()
    assert not a.is_leader() and holder(kube) == "b"
