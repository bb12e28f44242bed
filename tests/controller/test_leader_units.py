"""Leader election stepped on a fake clock over ``FakeKube``: the races are exact, not timed.

Replaces timing-based checks (a 0.9 s delayed renewal against a 0.75 s deadline on the sandbox),
which a loaded machine could make flaky.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_driver.kube.api import LEASES, Obj, Resource
from dra_driver.kube.leader import Clock, LeaderElector
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
