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


def test_one_writer_runs_one_bind_at_a_time_on_a_thread_named_writer() -> None:
    """``workers`` bounds the binds in flight on the API (thread names show up in profiles)."""
    release = threading.Event()
    running: list[tuple[str, str]] = []

    def bind(job: Placed) -> BindResult:
        running.append((job.pod.name, threading.current_thread().name))
        if job.pod.name == "first":
            assert release.wait(10)
        return BindResult(job)

    pool = BindingPool(bind, workers=1, wake=threading.Event())
    try:
        pool.submit("ns/first", placed("first"))
        pool.submit("ns/second", placed("second"))
        while not running:
            threading.Event().wait(0.01)
        assert not pool.wait_idle(timeout=0.1)
        assert [name for name, _ in running] == ["first"], "the second waits for the only writer"
        release.set()
        while len(running) < 2:
            threading.Event().wait(0.01)
        assert all(thread.startswith("writer") for _, thread in running), running
    finally:
        release.set()
        pool.shutdown()


def test_shutdown_lets_the_running_bind_finish_and_drops_the_queued_ones() -> None:
    release = threading.Event()
    started = threading.Event()
    finished: list[str] = []

    def bind(job: Placed) -> BindResult:
        if job.pod.name == "running":
            started.set()
            assert release.wait(10)
        finished.append(job.pod.name)
        return BindResult(job)

    pool = BindingPool(bind, workers=1, wake=threading.Event())
    pool.submit("ns/running", placed("running"))
    pool.submit("ns/queued", placed("queued"))
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    pool.shutdown()
    assert finished == ["running"], "shutdown waited for the running bind and cancelled the queued one"
