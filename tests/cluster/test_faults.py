"""Kill anything at any time on the real cluster: lose nothing, allocate nothing twice.

A steady workload of pods with claims of the seed's classes runs while faults are injected:
SIGKILL of our controller (at any time; mid-gang, between a gang's allocation writes and its
gates; mid-preemption, while the victim terminates), webhook and kubelet plugin (during prepare
and during unprepare), of the kubelet, kube-apiserver and etcd (``cluster up --supervise``
restarts those, our harness restarts the driver's processes), and API faults between the
controller and kube-apiserver from a loopback proxy (writes held for seconds; every connection
cut mid-request). After each fault the invariants of tests/cluster/faults.py must hold while
things move, and the system must converge (every pod running or waiting at our gate for a card
that does not exist, no capacity held by a waiting pod) within ``CONVERGE_WITHIN`` seconds, with
nothing left behind; a fault may add checks of its own outcome (``Verdict``).

``make test`` runs each fault kind once; ``make chaos`` runs ``HAMI_DRA_CHAOS_ROUNDS`` rounds
(``HAMI_DRA_CHAOS_KINDS``: only the kinds named).
The table goes to the terminal and to ``build/fault-report.txt``; its last two lines are
``faults survived: <s>/<n>`` and ``lost or double-allocated devices: <k>``.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hami_dra_dev.demo.manifests import NAMESPACE
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest, HostDriver
from tests.cluster.faults import (
    Workload,
    card_count,
    check_invariants,
    gated,
    node_pid,
    preempted_by_us,
    settled,
)
from tests.cluster.refusal import AllocationRefusal, half_committed
from tests.waiting import wait_for

ROUNDS = int(os.environ.get("HAMI_DRA_CHAOS_ROUNDS", "1"))
#: Comma-separated words: only the fault kinds whose names contain one of them (to chase one kind
#: with ``make chaos``); unset, every kind.
KINDS = [word.strip() for word in os.environ.get("HAMI_DRA_CHAOS_KINDS", "").split(",") if word.strip()]
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.parametrize("driver", ["faults"], indirect=True),
    # Each round is eleven faults of at most CONVERGE_WITHIN each (plus the workload's steps and
    # the two kills that wait for their window, at most CONVERGE_WITHIN each too).
    pytest.mark.timeout(300 + ROUNDS * 900),
]
CONVERGE_WITHIN = 60.0
GOAL = 30.0
REPORT = Path(__file__).resolve().parents[2] / "build" / "fault-report.txt"
#: Violations that mean a device was lost or handed out twice (the others are "left behind").
SAFETY = ("overcommitted", "mutex claim")
#: What a fault checks of its own outcome once the system converged: violations, one a line.
Verdict = Callable[[], list[str]]
#: A gang of this many members (each its own claim), its minimum the same.
GANG_SIZE = 3


@dataclass
class Outcome:
    kind: str
    converged_s: float | None
    violations: list[str] = field(default_factory=list)
    #: From the fault's start, its preparation included (a kill that waits for its window).
    took_s: float | None = None

    @property
    def survived(self) -> bool:
        return self.converged_s is not None and not self.violations


class FaultRun:
    def __init__(self, cluster: RealCluster, driver: HostDriver, seed: int) -> None:
        self.cluster = cluster
        self.driver = driver
        self.workload = Workload(cluster, random.Random(seed))
        self.refusal = AllocationRefusal(cluster, NAMESPACE)
        self.outcomes: list[Outcome] = []
        #: When the current fault struck: a fault that first prepares its moment sets it again.
        self.struck = time.monotonic()
        self.gangs_killed = 0

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.cluster.get("pods", "-n", NAMESPACE)["items"]}

    # --- faults: each runs its own workload step at the moment that matters ----------------------
    def kill_driver(self, component: str) -> Callable[[], None]:
        def fault() -> None:
            self.workload.step()
            self.driver.kill(component)

        return fault

    def kill_controller_mid_gang(self) -> Verdict:
        """SIGKILL the controller while a gang is half committed: some members' allocations written,
        every gate kept (tests/cluster/refusal.py holds that window: one member's allocation is
        refused). In turn, the refused member is deleted (the successor must release the others:
        the gang cannot reach its minimum, so no member may hold a device) or the refusal is
        lifted (it must complete the gang: it still fits)."""
        workload = self.workload
        workload.delete_some(creates=workload.max_live)  # room for the gang
        refused_at = workload.rng.randrange(GANG_SIZE)
        self.gangs_killed += 1
        complete = self.gangs_killed % 2 == 0
        self.refusal.install()
        try:
            members = workload.create_gang(GANG_SIZE, refused_at)
            refused = members[refused_at]
            wait_for(
                lambda: half_committed(self.cluster, NAMESPACE, members, refused),
                CONVERGE_WITHIN,
                f"gang {members} half committed ({refused}'s allocation refused)",
                0.3,
            )
            self.struck = time.monotonic()
            self.driver.kill("controller")
            if not complete:
                workload.delete(refused)
        finally:
            self.refusal.remove()

        def verdict() -> list[str]:
            pods = self.pods()
            if complete:
                return [f"gang member {m} not admitted after recovery" for m in members if gated(pods[m])]
            kept = [m for m in members if m != refused]
            return [f"member {m} of an incomplete gang passed the gate" for m in kept if not gated(pods[m])]

        return verdict

    def kill_controller_mid_preemption(self) -> Verdict:
        """Every card filled by a low-priority pod, then a pod that fits only by preempting one:
        SIGKILL the controller while the victim terminates, and pods that would fit in the freed
        room arrive. The successor preempts no one else, and the preemptor runs."""
        workload = self.workload
        workload.delete_some(creates=workload.max_live)  # room for the fillers
        first = workload.created
        fillers = workload.create_fillers(card_count(self.cluster))

        def filled() -> bool:
            pods = self.pods()
            return all(f in pods and pods[f]["spec"].get("nodeName") for f in fillers)

        wait_for(filled, CONVERGE_WITHIN, "every card filled", 0.3)
        urgent = workload.create_urgent()
        wait_for(
            lambda: any(preempted_by_us(p) for n, p in self.pods().items() if n in fillers),
            CONVERGE_WITHIN,
            f"a filler preempted for {urgent}",
            0.3,
        )
        self.struck = time.monotonic()
        self.driver.kill("controller")
        workload.create()  # pods that would fit in the freed room: they may not take it
        mine = {f"fault-{index}" for index in range(first, workload.created)}

        def verdict() -> list[str]:
            events = self.cluster.get("events", "-n", NAMESPACE, "--field-selector", "reason=Preempted")
            victims = sorted({str(e["involvedObject"]["name"]) for e in events["items"]} & mine)
            problems = (
                [] if len(victims) == 1 else [f"{urgent} preempted {victims}, where one filler frees enough"]
            )
            if gated(self.pods()[urgent]):
                problems.append(f"{urgent} still waits after its victim went")
            return problems

        return verdict

    def kill_plugin_during_prepare(self) -> None:
        self.workload.delete_some()
        self.workload.create()
        time.sleep(0.3)  # the controller places them and the kubelet starts preparing
        self.driver.kill("kubelet-plugin")

    def kill_plugin_during_unprepare(self) -> None:
        self.workload.delete_some(creates=self.workload.max_live)  # delete most pods ...
        self.driver.kill("kubelet-plugin")  # ... and kill the plugin while the kubelet unprepares
        self.workload.create()

    def kill_node(self, component: str) -> Callable[[], None]:
        def fault() -> None:
            self.workload.step()
            old = node_pid(self.cluster, component)
            os.kill(old, signal.SIGKILL)
            # The kill took: the supervisor started a new process (it records the new pid).
            wait_for(lambda: node_pid(self.cluster, component) != old, 30, f"{component} restarted")

        return fault

    def delay_writes(self) -> None:
        proxy = self.driver.proxy
        proxy.delay = 0.5  # every chunk held: a write takes seconds, and reads wait behind it
        try:
            self.workload.step()
            time.sleep(5)
        finally:
            proxy.delay = 0.0

    def cut_connections(self) -> None:
        self.workload.step()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            self.driver.proxy.cut()
            time.sleep(0.3)

    def kinds(self) -> list[tuple[str, Callable[[], Verdict | None]]]:
        return [
            ("controller SIGKILL", self.kill_driver("controller")),
            ("controller SIGKILL mid-gang", self.kill_controller_mid_gang),
            ("controller SIGKILL mid-preemption", self.kill_controller_mid_preemption),
            ("webhook SIGKILL", self.kill_driver("webhook")),
            ("kubelet plugin SIGKILL during prepare", self.kill_plugin_during_prepare),
            ("kubelet plugin SIGKILL during unprepare", self.kill_plugin_during_unprepare),
            ("kubelet SIGKILL", self.kill_node("kubelet")),
            ("kube-apiserver SIGKILL", self.kill_node("kube-apiserver")),
            ("etcd SIGKILL", self.kill_node("etcd")),
            ("API writes held (proxy)", self.delay_writes),
            ("API connections cut mid-write (proxy)", self.cut_connections),
        ]

    # --- one fault, then convergence -------------------------------------------------------------
    def inject(self, kind: str, fault: Callable[[], Verdict | None]) -> Outcome:
        outcome = Outcome(kind, None)
        began = self.struck = time.monotonic()
        verdict = fault()
        started = self.struck  # convergence counts from the fault, not from its preparation
        last: list[str] = []
        while time.monotonic() - started < CONVERGE_WITHIN:
            try:
                moving = check_invariants(self.cluster, settled=False)
                outcome.violations += [
                    v for v in moving if v not in outcome.violations and v.startswith(SAFETY)
                ]
                if settled(self.cluster):
                    last = check_invariants(self.cluster, settled=True)
                    if not last:
                        outcome.converged_s = time.monotonic() - started
                        outcome.took_s = time.monotonic() - began
                        break
            except AssertionError:
                pass  # the API server is restarting: kubectl failed, look again
            time.sleep(0.5)
        if outcome.converged_s is not None and verdict is not None:
            outcome.violations += verdict()
        if outcome.converged_s is None:
            outcome.violations += [f"not converged within {CONVERGE_WITHIN:.0f}s: {v}" for v in last] or [
                f"not converged within {CONVERGE_WITHIN:.0f}s: still moving"
            ]
        self.outcomes.append(outcome)
        return outcome

    def report(self) -> str:
        lines = [f"{'fault':<42} {'injected':>8} {'survived':>8} {'p50 s':>7} {'max s':>7} {'took s':>7}"]
        kinds = list(dict.fromkeys(o.kind for o in self.outcomes))
        for kind in kinds:
            mine = [o for o in self.outcomes if o.kind == kind]
            times = [o.converged_s for o in mine if o.converged_s is not None]
            p50 = f"{statistics.median(times):.1f}" if times else "-"
            worst = f"{max(times):.1f}" if times else "-"
            took = [o.took_s for o in mine if o.took_s is not None]
            total = f"{max(took):.1f}" if took else "-"
            lines.append(
                f"{kind:<42} {len(mine):>8} {sum(o.survived for o in mine):>8} {p50:>7} {worst:>7} {total:>7}"
            )
        for outcome in self.outcomes:
            lines += [f"  {outcome.kind}: {v}" for v in outcome.violations]
        survived = sum(o.survived for o in self.outcomes)
        lost = sum(1 for o in self.outcomes for v in o.violations if v.startswith(SAFETY))
        lines.append(f"pods created during the run: {self.workload.created}; convergence goal {GOAL:.0f}s")
        lines.append(f"faults survived: {survived}/{len(self.outcomes)}")
        lines.append(f"lost or double-allocated devices: {lost}")
        return "\n".join(lines)


def test_faults_lose_nothing_and_allocate_nothing_twice(
    real_cluster: RealCluster, driver: DriverUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    assert isinstance(driver, HostDriver) and driver.proxy is not None
    run = FaultRun(real_cluster, driver, seed=int(os.environ.get("HAMI_DRA_CHAOS_SEED", "7")))
    run.workload.setup()
    try:
        run.workload.step()
        chosen = [(kind, fault) for kind, fault in run.kinds() if not KINDS or any(w in kind for w in KINDS)]
        assert chosen, f"no fault kind matches HAMI_DRA_CHAOS_KINDS={','.join(KINDS)}"
        for _ in range(ROUNDS):
            for kind, fault in chosen:
                run.inject(kind, fault)
        run.workload.delete_all()
        run.inject("final drain (every pod deleted)", lambda: None)
    finally:
        run.refusal.remove()
        run.workload.teardown()
    report = run.report()
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(report + "\n")
    with capsys.disabled():
        print("\n" + report)
    failed = [o for o in run.outcomes if not o.survived]
    assert not failed, report
    if KINDS:
        return  # the restart counts below are those of every kind
    killed = {p.name: p.restarts for p in driver.processes}
    assert all(killed[name] >= ROUNDS for name in ("controller", "webhook")), killed
    assert killed["kubelet-plugin"] >= 2 * ROUNDS, killed
