"""Gangs in the controller: the members of one group get their GPUs all together, or none.

A pod that names a group (dra_driver/controller/gang_refs.py) is not planned alone: when the pod
queue gives it, the whole group is planned jointly (dra_driver/controller/gang_plan.py) and

* **enough members placeable** (those past our gate plus those placeable now reach the group's
  minimum): the placements are assumed in the cache and committed in two phases. Phase 1 writes
  every placed member's claim allocations with its gate kept (``Placed.hold_gate``); only when
  all of them are written does phase 2 lift the members' gates (with their annotations). Until
  then kube-scheduler sees none of them, so no member runs while another's write may still fail.
* **not enough**: nothing is written or held (the tentative plan is undone), the members stay
  pending, quietly at first: a group whose members are still being created must not warn. Past
  the group's timeout (``--gang-timeout``, or the coscheduling PodGroup's
  ``scheduleTimeoutSeconds``) every gated member gets a Warning event and our condition saying
  why ("gang ...: 3 of 4 members placeable now, needs 4; ...").

**Crash safety: a gang is completed or released, never left half-held.** A controller that dies
(or loses its lease) during phase 1 leaves some members with allocated claims and all of them
gated. Its successor, like this process after a failed write, plans the group again: members whose
claims are allocated are placeable where those claims pin them, so the group is *completed* when
the rest still fit (phase 1 for the others, then every gate), and *released* when it does not:
the allocations (and reservations) of its gated members' claims are cleared (a status update
guarded by resourceVersion), so no capacity stays held by a member of an incomplete gang. A crash
during phase 2 leaves a group with enough members allocated: its remaining gates are lifted.

Once a group has its minimum past the gate, its other members are placed one by one as they fit
(a group of 4 with minMember 3). Groups are planned in the order the pod queue reaches their
first member (priority, then age), so of two gangs competing for the same GPUs the first one
reached is placed and the other holds nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dra_driver.controller.allocator import Allocator, Placed, Unschedulable, WaitingForClaim
from dra_driver.controller.binder import Binder, BindOutcome, BindResult
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.failure import FailureHandler
from dra_driver.controller.gang_plan import GangPlan, plan_gang
from dra_driver.controller.gang_refs import GROUP_KINDS, GroupDirectory, GroupRef, group_of
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.pod_queue import PodQueue, Step
from dra_driver.kube.api import RESOURCE_CLAIMS, KubeApi, Obj
from dra_driver.kube.errors import KubeError, NotFound
from dra_driver.kube.watch import object_key
from dra_driver.resource.edits import without_allocation
from dra_driver.resource.objects import ClaimView, PodView

log = logging.getLogger("dra_driver.controller")
#: ``--gang-timeout``'s default: seconds a gang waits quietly before it says why.
DEFAULT_GANG_TIMEOUT = 60.0


class GangIndex:
    """Which pods name which group (every pod: members outside our gate count too)."""

    def __init__(self) -> None:
        self._of: dict[str, GroupRef] = {}
        self._members: dict[str, set[str]] = {}
        self._refs: dict[str, GroupRef] = {}

    def observe(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        key = object_key(obj)
        ref = group_of(new) if new is not None else None
        previous = self._of.get(key)
        if previous == ref:
            return
        if previous is not None:
            members = self._members.get(previous.key, set())
            members.discard(key)
            if not members:
                self._members.pop(previous.key, None)
                self._refs.pop(previous.key, None)
            del self._of[key]
        if ref is not None:
            self._of[key] = ref
            self._members.setdefault(ref.key, set()).add(key)
            self._refs[ref.key] = ref

    def ref(self, pod_key: str) -> GroupRef | None:
        return self._of.get(pod_key)

    def members(self, ref: GroupRef) -> set[str]:
        return set(self._members.get(ref.key, ()))

    def groups(self) -> list[GroupRef]:
        return list(self._refs.values())


@dataclass(slots=True)
class Commit:
    """A gang in phase 1: its placements, and the members whose allocations are being written."""

    placed: dict[str, Placed]
    writing: set[str]
    failed: bool = False


@dataclass(slots=True)
class _Wait:
    since: float
    timeout: float
    reported: bool = False


@dataclass(slots=True)
class _Decided:
    """What a pass decided for a gang's members (``steps`` None: planned one by one)."""

    pass_number: int
    steps: dict[str, Step] | None = field(default=None)


class GangCoordinator:
    """Plans gangs jointly for the controller, commits them in two phases, reports their waits."""

    def __init__(
        self,
        kube: KubeApi,
        cache: ClusterCache,
        allocator: Allocator,
        queue: PodQueue,
        failures: FailureHandler,
        binder: Binder,
        metrics: ControllerMetrics,
        submit: Callable[[str, Placed], None],
        waiting_for_claim: Callable[[PodView], None],
        *,
        timeout: float = DEFAULT_GANG_TIMEOUT,
        clock: Callable[[], float],
        pass_number: Callable[[], int],
        waits: Callable[[GangPlan], None] = lambda _plan: None,
        member_placed: Callable[[PodView], None] = lambda _pod: None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.allocator = allocator
        self.queue = queue
        self.failures = failures
        self.binder = binder
        self.controller_metrics = metrics
        self.metrics = metrics.gangs
        self._submit = submit
        #: What the controller does for a pod whose claim does not exist yet (HAMi's templates).
        self._waiting_for_claim = waiting_for_claim
        self.timeout = timeout
        self.clock = clock
        self._pass_number = pass_number
        #: A gang's joint plan waits (preemption may make room for it: ``preemptor.py``).
        self._waits_hook = waits
        #: A member is placed with its gang (the capacity held for it, if any, is released).
        self._member_placed = member_placed
        self.directory = GroupDirectory()
        self.index = GangIndex()
        self._waits: dict[str, _Wait] = {}
        self._decided: dict[str, _Decided] = {}
        self._commits: dict[str, Commit] = {}
        self._lifts: list[tuple[str, Placed]] = []

    # --- events in -----------------------------------------------------------------------------
    def observe(self, kind: str, old: Obj | None, new: Obj | None) -> bool:
        """An informer event: pods are indexed by group; a group object's event is taken (True:
        it is not the cache's)."""
        if kind in GROUP_KINDS:
            self.directory.apply(kind, old, new)
            return True
        if kind == "Pod":
            ref = self.index.ref(object_key(old)) if new is None and old is not None else None
            self.index.observe(old, new)
            if ref is not None:
                # A member gone: the others are planned again (a gang that can no longer reach
                # its minimum gives up what preemption held for it).
                self.queue.activate(self.index.members(ref))
        return False

    def is_member(self, pod: PodView) -> bool:
        return self.index.ref(pod.key) is not None

    def due(self) -> set[str]:
        """Pods to plan this pass: the members of groups whose object changed, and of groups whose
        timeout has come (they report why they wait)."""
        changed = self.directory.take_changed()
        now = self.clock()
        keys: set[str] = set()
        live = set()
        for ref in self.index.groups():
            live.add(ref.key)
            wait = self._waits.get(ref.key)
            overdue = wait is not None and not wait.reported and now - wait.since >= wait.timeout
            if overdue or (ref.namespace, ref.name) in changed:
                keys |= self.index.members(ref)
        for gone in set(self._waits) - live:
            del self._waits[gone]
        for gone in set(self._decided) - live:
            del self._decided[gone]
        self._publish(now)
        return keys

    # --- planning ------------------------------------------------------------------------------
    def schedule(self, pod: PodView) -> Step | None:
        """The step of a gang member (its whole group planned with it), or None when the pod is to
        be planned alone: no group, a basic group, or a group that has its minimum already."""
        ref = self.index.ref(pod.key)
        if ref is None:
            return None
        decided = self._decided.get(ref.key)
        if decided is not None and decided.pass_number == self._pass_number():
            return None if decided.steps is None else decided.steps.get(pod.key, Step.SKIP)
        commit = self._commits.get(ref.key)
        if commit is not None:
            # Phase 1 in flight: its end lifts its members' gates or plans the gang again; a
            # member it leaves out (past the minimum) is looked at again next pass.
            return Step.SKIP if pod.key in commit.placed else Step.RETRY
        policy = self.directory.policy(ref, pod.annotations)
        if policy.min_members is None and policy.problem is None:
            return None  # a basic group: no gang
        members = [self.cache.pods[key] for key in sorted(self.index.members(ref)) if key in self.cache.pods]
        if any(member.key in self.queue.in_flight for member in members):
            return Step.RETRY  # a member's placement is being written: planned again next pass
        plan = plan_gang(self.allocator, ref, policy, members)
        for key, refusal in plan.refused.items():
            if isinstance(refusal, WaitingForClaim):
                self._waiting_for_claim(plan.gated[key])
        if plan.satisfied:
            self._end_wait(ref, admitted=False)
            self._decided[ref.key] = _Decided(self._pass_number())
            return None
        if plan.busy:
            return Step.RETRY
        steps = self._commit(plan) if plan.ready else self._wait(plan)
        self._decided[ref.key] = _Decided(self._pass_number(), steps)
        return steps.get(pod.key, Step.SKIP)

    def _commit(self, plan: GangPlan) -> dict[str, Step]:
        """Assume every placement, then phase 1 (or, when every claim is allocated, phase 2)."""
        log.info("%s: placing %d member(s) together", plan.summary(), len(plan.placed))
        self._end_wait(plan.ref, admitted=True)
        steps: dict[str, Step] = {}
        for placed in plan.placed:
            self.failures.warn(placed.pod, placed.warnings)
            self.queue.placed(placed.pod)
            self._member_placed(placed.pod)
            self.cache.assume((write.claim, write.uses) for write in placed.writes)
        writing = [placed for placed in plan.placed if placed.writes]
        if writing:
            commit = Commit({placed.pod.key: placed for placed in plan.placed}, {p.pod.key for p in writing})
            self._commits[plan.ref.key] = commit
            for placed in plan.placed:
                steps[placed.pod.key] = Step.SKIP  # pinned already: its gate is lifted in phase 2
            for placed in writing:
                steps[placed.pod.key] = Step.BINDING
                self._submit(placed.pod.key, dataclasses.replace(placed, hold_gate=True))
        else:
            for placed in plan.placed:
                steps[placed.pod.key] = Step.BINDING
                self._submit(placed.pod.key, placed)
        for key, refusal in plan.refused.items():
            # Past the group's minimum: this member waits alone, for its own reason.
            steps[key] = Step.WAITING if not isinstance(refusal, Unschedulable) else Step.PENDING
            self.failures.decided(plan.gated[key], refusal)
        return steps

    def _wait(self, plan: GangPlan) -> dict[str, Step]:
        """Not enough members placeable: nothing held; members of ours whose claims are allocated
        (a predecessor's or a failed phase 1) are released; past the timeout, the members say why."""
        now = self.clock()
        timeout = plan.policy.timeout if plan.policy.timeout is not None else self.timeout
        wait = self._waits.setdefault(plan.ref.key, _Wait(now, timeout))
        wait.timeout = timeout
        overdue = now - wait.since >= wait.timeout
        message = plan.summary()
        if overdue and not wait.reported:
            log.warning("%s (waiting %.0fs)", message, now - wait.since)
        wait.reported = wait.reported or overdue
        self._release(plan)
        self._waits_hook(plan)
        steps: dict[str, Step] = {}
        outcomes = {placed.pod.key: placed for placed in plan.placed}
        for key, pod in plan.gated.items():
            steps[key] = Step.PENDING
            placed = outcomes.get(key)
            if placed is not None:
                self.failures.warn(pod, placed.warnings)
            if overdue:
                self.failures.failed(pod, plan.reason(), message)
            else:
                self.failures.quiet(pod)
        self._publish(now)
        return steps

    def _end_wait(self, ref: GroupRef, *, admitted: bool) -> None:
        wait = self._waits.pop(ref.key, None)
        if admitted:
            self.metrics.admitted.inc()
            self.metrics.wait.observe(0.0 if wait is None else self.clock() - wait.since)
        self._publish(self.clock())

    def _publish(self, now: float) -> None:
        self.metrics.waiting.set(len(self._waits))
        self.metrics.timed_out.set(sum(1 for w in self._waits.values() if now - w.since >= w.timeout))

    # --- release of an incomplete gang ---------------------------------------------------------
    def _release(self, plan: GangPlan) -> None:
        """Clear the allocations that gated members of this incomplete gang hold (claims of ours
        used by none but them): a predecessor's phase 1, or ours that failed half way."""
        members = {pod.uid for pod in plan.gated.values()}
        keys = set(plan.gated)
        for pod in plan.gated.values():
            for _, claim in self.cache.pod_claims(pod):
                if claim is None or not claim.allocation or not claim.ours:
                    continue
                if self.cache.assumed.writing(claim.key):
                    continue
                if not set(self.cache.consumers.get(claim.key, ())) <= keys:
                    continue  # another pod uses it too
                if not set(claim.reserved_uids) <= members:
                    continue
                self._deallocate(pod, claim, plan)

    def _deallocate(self, pod: PodView, claim: ClaimView, plan: GangPlan) -> None:
        released = without_allocation(claim)
        released.setdefault("status", {}).pop("reservedFor", None)
        try:
            written = self.kube.update(RESOURCE_CLAIMS, released, status=True)
        except NotFound:
            return
        except KubeError as err:
            log.warning("claim %s of incomplete gang %s not released: %s", claim.key, plan.ref, err)
            self.queue.retry(pod.key)
            return
        self.cache.wrote(written)
        self.controller_metrics.deallocations.inc()
        self.metrics.released.inc()
        message = f"claim {claim.key} released: {plan.summary()}"
        log.warning("%s", message)
        self.binder.event(pod, "Warning", "GangReleased", message, action="Deallocate")

    # --- the binding cycle ---------------------------------------------------------------------
    def written(self, key: str, placed: Placed, result: BindResult) -> None:
        """A bind ended: the end of a member's phase 1 may complete its gang's (phase 2 queued,
        ``take_lifts``); a failed one plans the gang again (completed or released)."""
        if not placed.hold_gate:
            return
        ref = self.index.ref(key)
        commit = None if ref is None else self._commits.get(ref.key)
        if ref is None or commit is None or key not in commit.writing:
            self.queue.activate([key])
            return
        commit.writing.discard(key)
        commit.failed = commit.failed or result.outcome is not BindOutcome.BOUND
        if commit.writing:
            return
        del self._commits[ref.key]
        if commit.failed:
            log.warning("gang %s: a member's allocation was not written; planned again", ref)
            self.queue.activate(commit.placed)
            return
        for member, planned in commit.placed.items():
            pod = self.cache.pods.get(member)
            if pod is None or pod.uid != planned.pod.uid or not pod.gated:
                continue
            self._lifts.append((member, Placed(pod, [], dict(planned.annotations), (), planned.decisions)))

    def take_lifts(self) -> Iterable[tuple[str, Placed]]:
        """Phase 2: the gates to lift now (each a placement without writes)."""
        lifts, self._lifts = self._lifts, []
        return lifts
