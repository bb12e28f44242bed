"""The binding cycles in flight (``dra_driver/controller/binding.py``)."""

from __future__ import annotations

import threading

import pytest

from dra_driver.controller.allocator import Placed
from dra_driver.controller.binder import BindOutcome, BindResult
from dra_driver.controller.binding import BindingPool
from dra_driver.resource.objects import PodView


def placed(name: str) -> Placed:
    return Placed(PodView({"metadata": {"namespace": "ns", "name": name, "uid": name}}), [])


def test_without_writer_threads_a_bind_is_done_when_submit_returns() -> None:
    binds: list[str] = []

    def bind(job: Placed) -> BindResult:
        binds.append(job.pod.key)
        return BindResult(job, outcome=BindOutcome.BOUND)

    pool = BindingPool(bind, workers=0, wake=threading.Event())
    pool.submit("ns/a", placed("a"))
    assert binds == ["ns/a"]
    assert "ns/a" in pool and pool.keys() == {"ns/a"} and pool
    [(key, job, result)] = list(pool.finished())
    assert key == "ns/a" and job.pod.key == "ns/a"
    assert isinstance(result, BindResult) and result.outcome is BindOutcome.BOUND
    assert not pool and "ns/a" not in pool and list(pool.finished()) == []


def test_what_a_bind_raises_is_handed_to_the_worker_not_lost() -> None:
    def bind(job: Placed) -> BindResult:
        raise RuntimeError(f"writer broke on {job.pod.key}")

    pool = BindingPool(bind, workers=0, wake=threading.Event())
    pool.submit("ns/a", placed("a"))
    [(_, _, result)] = list(pool.finished())
    assert isinstance(result, RuntimeError) and str(result) == "writer broke on ns/a"


def test_writer_threads_wake_the_worker_and_unfinished_binds_stay_in_flight() -> None:
    release = threading.Event()
    wake = threading.Event()

    def bind(job: Placed) -> BindResult:
        if job.pod.name == "slow":
            assert release.wait(10)
        return BindResult(job, outcome=BindOutcome.BOUND)

    pool = BindingPool(bind, workers=2, wake=wake)
    try:
        pool.submit("ns/slow", placed("slow"))
        pool.submit("ns/fast", placed("fast"))
        assert wake.wait(10), "a finished bind wakes the worker"
        done: list[str] = []
        while not done:
            done = [key for key, _, _ in pool.finished()]
        assert done == ["ns/fast"]
        assert pool.keys() == {"ns/slow"}
        assert not pool.wait_idle(timeout=0.05), "the held bind is still in flight"
        release.set()
        # Only the worker takes binds out of flight: finished() collects the slow one.
        while "ns/slow" in pool:
            list(pool.finished())
        assert pool.wait_idle(timeout=0.05)
    finally:
        release.set()
        pool.shutdown()


def test_submit_after_shutdown_is_refused() -> None:
    pool = BindingPool(
        lambda job: BindResult(job, outcome=BindOutcome.BOUND), workers=1, wake=threading.Event()
    )
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit("ns/a", placed("a"))
