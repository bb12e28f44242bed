"""A pod whose writes the API server keeps refusing is not re-planned and re-written every pass.

Seen on the real cluster: an admission policy refused the allocation write, and the controller
planned and wrote it again every few milliseconds. Now each consecutive failure doubles the pause
(0.2 s up to 10 s), other pods are planned meanwhile, and a success starts from nothing again.
"""

from __future__ import annotations

import logging

import pytest

from dra_driver.controller.retries import CommitBackoff
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import claim, request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status_writes(cluster: FakeCluster) -> int:
    return len([call for call in cluster.kube.calls if call[:2] == ("update/status", "resourceclaims")])


def test_by_default_the_pause_starts_at_a_fifth_of_a_second_and_stops_growing_at_ten() -> None:
    backoff = CommitBackoff(clock=Clock())
    assert [backoff.failed("ns/p") for _ in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]


def test_the_pause_doubles_per_failure_up_to_the_maximum_and_resets_on_success() -> None:
    clock = Clock()
    backoff = CommitBackoff(initial=0.2, maximum=1.0, clock=clock)
    assert [backoff.failed("ns/p") for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.waiting("ns/p") and not backoff.waiting("ns/other")
    clock.now += 1.0
    assert not backoff.waiting("ns/p")
    backoff.forget("ns/p")
    assert backoff.failed("ns/p") == 0.2


def test_a_refused_write_is_retried_after_pauses_that_double(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "dra_driver.controller")
    clock = Clock()
    cluster = FakeCluster(gpus=2, backoff=CommitBackoff(initial=0.2, maximum=10.0, clock=clock))
    cluster.kube.fail("update/status", "resourceclaims", status=422, message="denied by a policy", times=3)
    cluster.pod("refused", claim("refused", request(memory="1Gi")))
    cluster.run(passes=20)
    assert status_writes(cluster) == 1, "one attempt, then it waits"
    assert "pod default/refused: writes not completed; planned again in 0.2 s" in caplog.text
    for attempts, pause in ((2, 0.2), (3, 0.4)):
        clock.now += pause - 0.01
        cluster.run(passes=5)
        assert status_writes(cluster) == attempts - 1, "not before its pause ends"
        clock.now += 0.02
        cluster.run(passes=5)
        assert status_writes(cluster) == attempts
    clock.now += 0.81
    cluster.run(passes=5)
    assert not cluster.gated("refused") and status_writes(cluster) == 4
    assert not cluster.controller.queue.backoff.waiting("default/refused")


def test_other_pods_are_placed_while_one_waits() -> None:
    clock = Clock()
    cluster = FakeCluster(gpus=2, backoff=CommitBackoff(initial=0.2, maximum=10.0, clock=clock))
    cluster.kube.fail("update/status", "resourceclaims", status=422, message="denied by a policy", times=1)
    cluster.pod("refused", claim("refused", request(memory="1Gi")))
    cluster.run()
    cluster.pod("other", claim("other", request(memory="1Gi")))
    cluster.run()
    assert not cluster.gated("other") and cluster.gated("refused")
    clock.now += 0.3
    cluster.run()
    assert not cluster.gated("refused")
