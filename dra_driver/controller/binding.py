"""``BindingPool``: the binding cycles in flight, as kube-scheduler runs them beside its scheduling loop.

The worker decides one pod after another (``controller.py``); each placement's writes (the
binder's claim allocations, then the gate) take a few API round trips, so they run on a small pool
of writer threads while the worker plans the next pod with the placement assumed in the cache.
A finished bind is not applied by the writer: the worker collects it (``finished``) and folds it
into the cache itself, so the cache and ledger are only ever touched by one thread. Without
writer threads (``workers=0``, tests) a bind runs at once on the caller's thread.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from dra_driver.controller.allocator import Placed
from dra_driver.controller.binder import BindResult


class BindingPool:
    """Pods whose placement is being written, by pod key; one bind per pod at a time."""

    def __init__(self, bind: Callable[[Placed], BindResult], workers: int, wake: threading.Event) -> None:
        self._bind = bind
        self._wake = wake
        self._writers = ThreadPoolExecutor(workers, thread_name_prefix="writer") if workers else None
        self._in_flight: dict[str, tuple[Placed, Future[BindResult]]] = {}
        #: Keys of the binds that completed, in completion order, appended by the writer threads:
        #: collecting costs what finished, not a look at every bind still queued (hundreds in a burst).
        self._done: deque[str] = deque()

    @property
    def threaded(self) -> bool:
        """Binds run on writer threads (else ``submit`` runs them at once)."""
        return self._writers is not None

    def __contains__(self, key: object) -> bool:
        return key in self._in_flight

    def __bool__(self) -> bool:
        return bool(self._in_flight)

    def keys(self) -> set[str]:
        return set(self._in_flight)

    def submit(self, key: str, placed: Placed) -> None:
        """Write ``placed`` on a writer thread (wakes the worker when done), or here and now."""
        if self._writers is None:
            future: Future[BindResult] = Future()
            try:
                future.set_result(self._bind(placed))
            except Exception as err:  # reported by ``finished`` like a failed writer thread
                future.set_exception(err)
            self._in_flight[key] = (placed, future)
            self._done.append(key)
            return
        future = self._writers.submit(self._bind, placed)
        self._in_flight[key] = (placed, future)  # before the callback can name it
        future.add_done_callback(functools.partial(self._completed, key))

    def _completed(self, key: str, _: Future[BindResult]) -> None:
        self._done.append(key)
        self._wake.set()

    def finished(self) -> Iterator[tuple[str, Placed, BindResult | Exception]]:
        """The binds that completed since the last call: their result, or what a writer raised."""
        while self._done:
            key = self._done.popleft()
            placed, future = self._in_flight.pop(key)
            try:
                outcome: BindResult | Exception = future.result()
            except Exception as err:
                outcome = err
            yield key, placed, outcome

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no bind is in flight (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._in_flight

    def shutdown(self) -> None:
        """Let the writes already running finish; the queued ones are dropped (retried on restart)."""
        if self._writers is not None:
            self._writers.shutdown(wait=True, cancel_futures=True)
