"""``Preemptor``: the writes of a preemption, after the pass that found a pod fits nowhere.

kube-scheduler never preempts for our gated pods (it never sees them) and does not preempt for
DRA devices at all, so the controller does, on shares of cards (``preemption.py`` chooses the
victims; nothing there makes an API call). Like kube-scheduler's PostFilter it runs for pods
whose full plan failed for capacity in the pass (``failed``), the most urgent first
(``PodQueue.pending_by_priority``), a few per pass, and for each:

1. the candidates, cheapest first, over the controller's cache with its planner as the oracle,
   the holds of pods of equal or higher priority counted (``Nominations.hidden_for``);
2. every victim of the first candidate asked of the Eviction API in dry run: a 429 (a
   PodDisruptionBudget allows no disruption) leaves that pod out of victim sets for
   ``REFUSAL_SECONDS`` and the next candidate is tried; nothing is ever deleted directly;
3. the nomination written on the preemptor (``<driver>/nomination``: node, devices and shares,
   victims), then held in the ledger: from here a crash loses nothing, a restarted controller
   reads it back;
4. per victim: the condition ``DisruptionTarget`` (reason ``PreemptionByHamiDra``, as
   kube-scheduler writes ``PreemptionByScheduler``), a ``Preempted`` event naming the preemptor
   and why, then the eviction, then the condition once more (the Eviction API replaces it with
   its own, reason ``EvictionByEvictionAPI``, which says neither who nor why). A 429 now (a
   budget another eviction just used up) stops the evictions: the condition is set back to
   False, the pod is left out for a while, and the next full plan of the preemptor counts the
   victims already terminating as free.

A candidate with no new victim (pods already terminating free enough) only nominates: the pod
waits for them, its capacity held. Outcomes are counted in ``hami_dra_preemptions_total``.

A gang preempts as a unit (``gang_preemption.py``): a gang whose joint plan waits for capacity
(``gang_waits``) gets the same steps, its victims chosen over the nodes its members may run on,
every member the plan places nominated to its node (each member's devices held), the victims'
condition and event naming the gang. A waiting gang that may not preempt, or for which no room
can be made any more, has its members' nominations withdrawn (their holds released).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from enum import StrEnum

from dra_driver.controller.allocation import rfc3339_now
from dra_driver.controller.allocator import Allocator, Unschedulable
from dra_driver.controller.binder import Binder
from dra_driver.controller.cache import ClusterCache, Wake
from dra_driver.controller.gang_plan import GangPlan
from dra_driver.controller.gang_preemption import gang_candidate, gang_hidden, gang_holds, gang_refusal
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.nomination import Nomination, Nominations
from dra_driver.controller.pod_queue import PodQueue
from dra_driver.controller.preemption import Candidate, Holder, candidates_for, held_uses, refusal
from dra_driver.controller.slim import keep_pod
from dra_driver.kube.api import PODS, KubeApi, Obj
from dra_driver.kube.errors import KubeError
from dra_driver.kube.eviction import Evicted, evict
from dra_driver.quantity import format_bytes
from dra_driver.resource.objects import PodView
from dra_driver.resource.uses import Use

log = logging.getLogger("dra_driver.controller")
#: Pods preempted for, at most, per pass (the rest wait for the next pass).
PREEMPTIONS_PER_PASS = 4
#: No further preemption starts in a pass once this much of it went to preemptions (each is
#: bounded by ``preemption.TOTAL_BUDGET`` plans: about 0.2-0.4 s, hack/bench_preemption.py).
PREEMPTION_SECONDS = 0.5
#: Candidate sets tried for one pod in one pass (each costs a dry-run eviction per victim).
TRIES_PER_POD = 3
#: How long a pod whose eviction a PodDisruptionBudget refused stays out of victim sets.
REFUSAL_SECONDS = 60.0
#: The victims' condition, as kube-scheduler and the taint manager write it.
DISRUPTION_TARGET = "DisruptionTarget"
#: Its reason when we preempt (kube-scheduler's is ``PreemptionByScheduler``).
PREEMPTION_REASON = "PreemptionByHamiDra"


class Result(StrEnum):
    """What one preemption came to (the label of ``hami_dra_preemptions_total``)."""

    EVICTING = "evicting"  # victims asked to leave; the capacity held for the preemptor
    WAITING = "waiting"  # pods already terminating free enough: nominated, nothing evicted
    NO_CANDIDATE = "no_candidate"  # evicting lower-priority pods would not make it fit anywhere
    REFUSED = "refused"  # every candidate tried had a victim a PodDisruptionBudget protects
    ERROR = "error"  # an API error; tried again at the pod's next full plan


def disruption_patch(pod: PodView, status: str, message: str, now: str) -> Obj:
    """A strategic merge patch of ``pods/status`` with the ``DisruptionTarget`` condition (merged
    by type; the uid in it, so a namesake refuses it)."""
    condition = {
        "type": DISRUPTION_TARGET,
        "status": status,
        "reason": PREEMPTION_REASON,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    return {"metadata": {"uid": pod.uid}, "status": {"conditions": [condition]}}


class Preemptor:
    """Pods to preempt for, recorded while planning; their writes made by ``run``."""

    def __init__(
        self,
        kube: KubeApi,
        cache: ClusterCache,
        allocator: Allocator,
        binder: Binder,
        queue: PodQueue,
        metrics: ControllerMetrics,
        *,
        enabled: bool = True,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.allocator = allocator
        self.binder = binder
        self.queue = queue
        self.metrics = metrics
        self.enabled = enabled
        self.wall = wall
        self.clock = clock
        self.nominations = Nominations(cache.ledger, cache.driver)
        allocator.hidden_holds = self.nominations.hidden_for
        self._tried: set[str] = set()  # pods whose full plan failed for capacity, not preempted for yet
        self._refused: dict[str, float] = {}  # pod key -> until when a budget keeps it out
        self._evicting: dict[str, str] = {}  # pod key -> uid: evictions asked, the pod not gone yet
        #: Gangs (by group key) whose joint plan waits, as planned this pass: preempted for after
        #: it, or (``None`` in ``_gang_may``) their members' nominations withdrawn.
        self._gangs: dict[str, GangPlan] = {}

    # --- on the planning path: no API calls ------------------------------------------------------
    def failed(self, pod: PodView, outcome: Unschedulable) -> None:
        """A full plan of ``pod`` failed: preempt for it after the pass if it may."""
        if self.enabled and not outcome.quiet and refusal(pod, outcome.reason) is None:
            self._tried.add(pod.key)

    def placed(self, pod: PodView) -> None:
        self._tried.discard(pod.key)
        self.nominations.placed(pod)

    def gang_waits(self, plan: GangPlan) -> None:
        """A gang's joint plan does not reach its minimum: preempt for it after the pass if it may,
        else withdraw what its members hold."""
        if plan.busy:
            return
        may = self.enabled and gang_refusal(plan) is None
        if may or any(self.nominations.of(pod) is not None for pod in plan.gated.values()):
            self._gangs[plan.ref.key] = plan  # preempted for, or its holds withdrawn

    def observe(self, wake: Wake) -> None:
        """The pods a change concerns, as the cache has them now: their nominations follow."""
        self.nominations.forget(wake.deleted_pods)
        for key in wake.pods:
            self.nominations.observe(key, self.cache.pods.get(key))
            if key in self._evicting and key not in self.cache.pods:
                del self._evicting[key]
        self.wake_released()

    def wake_released(self) -> None:
        """Pending pods may fit where a hold was released (its preemptor placed elsewhere, gone,
        or its nomination withdrawn): they are planned there again."""
        released = self.nominations.take_released()
        if released:
            self.queue.retry_on(released)

    def going(self, pod: PodView) -> bool:
        """Terminating, or its eviction was asked for: its claims are on their way out."""
        return pod.deleting or self._evicting.get(pod.key) == pod.uid

    def refused(self) -> frozenset[str]:
        """The pods a PodDisruptionBudget refused to let go, recently."""
        now = self.clock()
        self._refused = {key: until for key, until in self._refused.items() if until > now}
        return frozenset(self._refused)

    # --- after the pass ------------------------------------------------------------------------------
    def run(self) -> None:
        """Preempt for the pods and gangs recorded since the last call, the most urgent first (a
        gang where its most urgent member comes)."""
        tried, self._tried = self._tried, set()
        gangs, self._gangs = self._gangs, {}
        if not tried and not gangs:
            return
        gang_of = {key: ref for ref, plan in gangs.items() for key in plan.gated}
        done, started = 0, self.clock()
        for pod in self.queue.pending_by_priority():
            ref = gang_of.get(pod.key)
            plan = gangs.pop(ref, None) if ref is not None else None
            if pod.key not in tried and plan is None:
                continue
            if done == PREEMPTIONS_PER_PASS or (done and self.clock() - started > PREEMPTION_SECONDS):
                if plan is None:
                    self._tried.add(pod.key)  # the next pass
                else:
                    self._gangs.setdefault(plan.ref.key, plan)
                continue
            done += 1
            subject = pod.key if plan is None else f"gang {plan.ref}"
            try:
                result = self.preempt(pod) if plan is None else self.preempt_gang(plan)
            except KubeError as err:
                log.warning("%s: preemption interrupted: %s", subject, err)
                result = Result.ERROR
            except Exception:  # one pod's preemption must not stop the controller
                log.exception("%s: preemption failed", subject)
                self.metrics.unexpected_errors.labels("Pod").inc()
                result = Result.ERROR
            if result is None:
                done -= 1  # a gang's holds withdrawn only: no preemption
            else:
                self.metrics.preemptions.labels(result.value).inc()

    def preempt(self, pod: PodView) -> Result:
        """Find the cheapest victims for ``pod`` and act on them (see the module's steps). A set
        with a victim its budget protects is dropped and the victims chosen again without it
        (on the same node or another), ``TRIES_PER_POD`` times at most."""
        hidden = self.nominations.hidden_for(pod)
        refused_any = False
        for _ in range(TRIES_PER_POD):
            chosen = self._choose(pod, hidden)
            if chosen is None:
                break
            candidate, uses = chosen
            if self._any_refused(candidate.victims):
                refused_any = True
                continue
            nomination = Nomination(
                candidate.node, uses, tuple(victim.key for victim in candidate.victims), rfc3339_now()
            )
            self._nominate(pod, nomination)
            if not candidate.victims:
                log.info("pod %s: waits on node %s for pods already terminating", pod.key, candidate.node)
                return Result.WAITING
            wanted = _wanted(uses)
            self.binder.event(
                pod, "Normal", "Preempting",
                f"node {candidate.node}: evicting {_names(candidate)} (lower priority) to free {wanted}",
                action="Preempt",
            )  # fmt: skip
            return self._evict(
                f"pod {pod.key}", pod.priority, candidate, {candidate.node: wanted},
                "it fits on no node's free GPU capacity",
            )  # fmt: skip
        if not refused_any:
            log.info("pod %s: no lower-priority pods whose eviction would make room for it", pod.key)
        self._withdraw(pod)
        return Result.REFUSED if refused_any else Result.NO_CANDIDATE

    def preempt_gang(self, plan: GangPlan) -> Result | None:
        """The same steps as ``preempt`` for a waiting gang as a whole: the cheapest victims over
        the nodes its members may run on, every member placed by the joint plan once they are
        gone nominated to its node, then the evictions. A gang that may not preempt (or with
        preemption off) only has its members' nominations withdrawn (None: nothing to count)."""
        for pod in plan.gated.values():
            current = self.cache.pods.get(pod.key)
            if current is None or current.uid != pod.uid or not current.gated or current.deleting:
                return None  # the gang changed since it was planned: its next plan records it again
        why = gang_refusal(plan) if self.enabled else "preemption is off"
        if why is not None:
            if any(self.nominations.of(pod) is not None for pod in plan.gated.values()):
                log.info("gang %s: preempts nothing (%s); its members' holds are released", plan.ref, why)
                for pod in plan.gated.values():
                    self._withdraw(pod)
            return None
        hidden = gang_hidden(plan, self.nominations.hidden_for)
        refused_any = False
        for _ in range(TRIES_PER_POD):
            candidate = gang_candidate(
                self.allocator, plan, hidden=hidden, going=self.going, refused=self.refused(), now=self.wall()
            )
            holds = [] if candidate is None else gang_holds(self.allocator, plan, candidate, hidden)
            if candidate is None or not holds:
                break
            if self._any_refused(candidate.victims):
                refused_any = True
                continue
            at = rfc3339_now()
            held = {hold.pod.key for hold in holds}
            for pod in plan.gated.values():
                if pod.key not in held:
                    self._withdraw(pod)  # nominated before, not placed by this plan
            for hold in holds:
                victims = tuple(victim.key for victim in candidate.victims if victim.node == hold.node)
                self._nominate(hold.pod, Nomination(hold.node, hold.uses, victims, at))
            if not candidate.victims:
                log.info("gang %s: waits for pods already terminating", plan.ref)
                return Result.WAITING
            first = next(iter(plan.gated.values()))
            who = f"gang {plan.ref.describe()} ({len(holds)} member(s), priority {first.priority})"
            self.binder.event(
                first, "Normal", "Preempting",
                f"{who}: evicting {_names(candidate)} (lower priority) to place the gang's members together",
                action="Preempt",
            )  # fmt: skip
            by_node: dict[str, list[Use]] = {}
            for hold in holds:
                by_node.setdefault(hold.node, []).extend(hold.uses)
            wanted = {node: _wanted(tuple(uses)) for node, uses in by_node.items()}
            return self._evict(
                f"gang {plan.ref}", min(p.priority for p in plan.gated.values()), candidate,
                wanted, "the gang fits on no nodes' free GPU capacity all together",
            )  # fmt: skip
        if not refused_any:
            log.info("gang %s: no lower-priority pods whose eviction would make room for it", plan.ref)
        for pod in plan.gated.values():
            self._withdraw(pod)
        return Result.REFUSED if refused_any else Result.NO_CANDIDATE

    def _withdraw(self, pod: PodView) -> None:
        """A nominated pod that can no longer have room made for it anywhere gives up its hold
        (it would keep a node's capacity from everyone else for nothing), and its annotation
        goes, so that a restart does not hold it again."""
        if self.nominations.of(pod) is None:
            return
        patch = {"metadata": {"uid": pod.uid, "annotations": {self.nominations.annotation: None}}}
        self._written(self.kube.patch(PODS, pod.namespace, pod.name, patch))
        self.nominations.withdraw(pod)
        self.wake_released()
        log.info("pod %s: its nomination is withdrawn: no room can be made for it now", pod.key)

    def _written(self, written: Obj) -> None:
        """The pod as a write of ours returned it, into the cache unless the cache has newer."""
        view = PodView.parse(keep_pod(dict(written)))
        cached = self.cache.pods.get(view.key)
        if cached is not None and cached.uid == view.uid and not cached.newer_than(view):
            self.cache.pods[view.key] = view

    def _choose(self, pod: PodView, hidden: frozenset[str]) -> tuple[Candidate, tuple[Use, ...]] | None:
        """The cheapest candidate now and what to hold for the pod there."""
        found = candidates_for(
            self.allocator, pod, hidden=hidden, going=self.going, refused=self.refused(), now=self.wall()
        )
        for candidate in found:
            uses = held_uses(self.allocator, pod, candidate, hidden)
            if uses:
                return candidate, uses
        return None

    def _any_refused(self, victims: tuple[Holder, ...]) -> bool:
        """Ask every victim's eviction in dry run; a refused one is left out for a while."""
        refused = False
        for victim in victims:
            namespace, _, name = victim.key.partition("/")
            if evict(self.kube, namespace, name, victim.uid, dry_run=True) is Evicted.REFUSED:
                log.info("pod %s: its PodDisruptionBudget allows no eviction now; not a victim", victim.key)
                self._refused[victim.key] = self.clock() + REFUSAL_SECONDS
                refused = True
        return refused

    def _nominate(self, pod: PodView, nomination: Nomination) -> None:
        """Write the nomination on the pod (unless it records that node and those uses already),
        then hold its capacity."""
        current = self.nominations.of(pod)
        same = current is not None and (current.node, current.uses) == (nomination.node, nomination.uses)
        if not same or nomination.victims:
            annotations = {self.nominations.annotation: nomination.encode()}
            patch = {"metadata": {"uid": pod.uid, "annotations": annotations}}
            self._written(self.kube.patch(PODS, pod.namespace, pod.name, patch))
        self.nominations.nominate(pod, nomination)

    def _evict(
        self, preemptor: str, priority: int, candidate: Candidate, wanted: Mapping[str, str], why: str
    ) -> Result:
        """The victims' condition, event and eviction, one after the other; ``preemptor`` names
        who they make room for (a pod, a gang), ``wanted`` what it takes on each node."""
        names = _names(candidate)
        log.info("%s (priority %d): evicting %s on node %s", preemptor, priority, names, candidate.node)
        for victim in candidate.victims:
            view = self.cache.pods.get(victim.key)
            if view is None or view.uid != victim.uid:
                continue  # gone meanwhile: its capacity is free already
            node = victim.node or candidate.node
            message = (
                f"Preempted by {preemptor} (priority {priority}, yours {victim.priority}) on node "
                f"{node}: {why} and needs {wanted.get(node, 'its GPU share')} there"
            )
            self._condition(view, "True", message)
            self.binder.event(view, "Normal", "Preempted", message, action="Preempt")
            outcome = evict(self.kube, view.namespace, view.name, view.uid)
            if outcome is Evicted.REFUSED:
                log.info("pod %s: eviction refused by its PodDisruptionBudget; preemption stops", view.key)
                self._refused[view.key] = self.clock() + REFUSAL_SECONDS
                self._condition(view, "False", f"not evicted: its PodDisruptionBudget refused ({message})")
                return Result.REFUSED
            if outcome is Evicted.EVICTED:
                # The Eviction API writes its own DisruptionTarget (EvictionByEvictionAPI: who and
                # why are lost): ours again, on the terminating pod.
                self._condition(view, "True", message)
            self._evicting[view.key] = view.uid
            self.metrics.preemption_victims.inc()
        return Result.EVICTING

    def _condition(self, pod: PodView, status: str, message: str) -> None:
        try:
            self.kube.patch(
                PODS, pod.namespace, pod.name, disruption_patch(pod, status, message, rfc3339_now()),
                status=True, strategic=True,
            )  # fmt: skip
        except KubeError as err:  # the eviction still goes: the condition only explains it
            log.info("pod %s: condition %s not written: %s", pod.key, DISRUPTION_TARGET, err)


def _names(candidate: Candidate) -> str:
    return ", ".join(victim.key for victim in candidate.victims)


def _wanted(uses: tuple[Use, ...]) -> str:
    """What the preemptor takes on the node, in words: ``10 GiB on gpu-0`` or ``gpu-1 whole`` (a
    gang's members' shares of one card added up)."""
    memory: dict[str, int | None] = {}
    for use in uses:
        name = use.device.device
        if use.memory is None or (name in memory and memory[name] is None):
            memory[name] = None
        else:
            memory[name] = (memory.get(name) or 0) + use.memory
    parts = [
        f"{name} whole" if amount is None else f"{format_bytes(amount)} on {name}"
        for name, amount in memory.items()
    ]
    return ", ".join(parts) or "its GPU share"
