"""``simulate --from-cluster --claims``: what-if claims placed by the controller's own allocator.

The cluster's objects (slices, classes, claims, pods, nodes, quotas) build the controller's cache
(``dra_driver/controller/offline.py``, the same one ``hami-dra explain`` decides on), and each
what-if claim is decided by ``Allocator.allocate``, the function the controller runs for a pod:
node fit, quotas and per-container limits included, so a claim simulate places is one the
controller would place there, and a refusal is the reason it would report.

A what-if claim of a claims file becomes the two objects a user would create for it:

* a **ResourceClaim** ``<namespace>/<name>`` with one request ``gpu`` of its ``deviceClass`` (when
  it names none, the DeviceClass named like the driver: the chart's default class, or where the
  cluster has no such class, a plain one selecting the driver's devices, with no config): ``count``,
  ``memory`` and ``cores`` as capacity requests, and ``policy``, ``nodePolicy``, ``weights``,
  ``numaBind`` and ``memoryPercent`` as the claim's GpuConfig (so a DeviceClass's config yields to
  them, as it does for a real claim);
* a gated **Pod** of the same name and namespace (what its quotas count it against) with one
  container, ``main``, that consumes the claim (one container: no per-container limits conflict
  is possible), ``productNames``/``uuids`` and their exclusions as HAMi's pod annotations
  (``nvidia.com/use-gputype`` ...), and ``pod:`` (node selector, tolerations, CPU and memory
  requests) as the pod's spec and the container's requests: without it the pod asks nothing of
  a node, so only nodes any plain pod is refused by (a NoSchedule taint, cordoned, not Ready,
  full) refuse it.

The claims are placed in order, each seeing the ones before: a placement is folded back into the
cache as it settles (``offline.apply_placed``: its claim allocated, its pod bound to the node, so
the pod's CPU and memory count there for the next ones). The claims file's
``defaults`` stand for the controller's ``--default-policy``/``--default-node-policy`` (a class's
or the claim's own config comes first, as in the controller).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.config import ControllerDefaults
from dra_driver.config.resolve import (
    ANNOTATION_NOUSE_GPU_TYPE,
    ANNOTATION_NOUSE_GPU_UUID,
    ANNOTATION_USE_GPU_TYPE,
    ANNOTATION_USE_GPU_UUID,
)
from dra_driver.contract import GATE_NAME
from dra_driver.controller.allocator import AllocateOutcome, Allocator, Placed, Unschedulable
from dra_driver.controller.gang_preemption import gang_candidate, gang_hidden, gang_refusal
from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL
from dra_driver.controller.offline import (
    ClusterObjects,
    allocator_for,
    apply_evicted,
    apply_placed,
    gang_plan_for,
)
from dra_driver.controller.preemption import Holder, candidates_for, refusal
from dra_driver.controller.reasons import Reason
from dra_driver.engine import DEFAULT_MAX_CANDIDATES, Decision, parse_node_policy, parse_policy_chain
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Obj
from dra_driver.resource.objects import PodView
from dra_driver.simulate.run import Preempted, SimulationResult, held
from dra_driver.simulate.scenario import ClaimSpec, Defaults, ScenarioError

#: The request name of a what-if claim, and the pod's entry and container claim for it.
REQUEST = "gpu"
#: The one container of a what-if claim's pod.
CONTAINER = "main"


def claim_object(claim: ClaimSpec, driver: str, uid: str) -> Obj:
    """The ResourceClaim a user would create for ``claim``."""
    exactly: Obj = {"deviceClassName": claim.device_class or driver, "count": claim.count}
    capacity: dict[str, str] = {}
    if claim.memory is not None:
        capacity["memory"] = str(claim.memory)
    if claim.cores:
        capacity["cores"] = str(claim.cores)
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    devices: Obj = {"requests": [{"name": REQUEST, "exactly": exactly}]}
    parameters = _gpu_config(claim)
    if parameters:
        config = {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", **parameters}
        devices["config"] = [{"opaque": {"driver": driver, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": uid},
        "spec": {"devices": devices},
    }


def _gpu_config(claim: ClaimSpec) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if claim.policy is not None:
        parameters["policy"] = claim.policy
    if claim.node_policy is not None:
        parameters["nodePolicy"] = claim.node_policy
    if claim.weights is not None:
        weights = claim.weights
        parameters["scoringWeights"] = {"slot": weights.slot, "core": weights.core, "memory": weights.memory}
    if claim.numa_bind:
        parameters["numaBind"] = True
    if claim.memory_percent is not None:
        parameters["memoryPercent"] = claim.memory_percent
    return parameters


def pod_object(claim: ClaimSpec, uid: str) -> Obj:
    """The gated pod a user would create to run ``claim`` (module docstring)."""
    annotations = {
        key: ",".join(values)
        for key, values in (
            (ANNOTATION_USE_GPU_TYPE, claim.product_names),
            (ANNOTATION_NOUSE_GPU_TYPE, claim.exclude_product_names),
            (ANNOTATION_USE_GPU_UUID, claim.uuids),
            (ANNOTATION_NOUSE_GPU_UUID, claim.exclude_uuids),
        )
        if values
    }
    resources: Obj = {"claims": [{"name": REQUEST}]}
    spec: Obj = {
        "containers": [{"name": CONTAINER, "image": "simulated", "resources": resources}],
        "resourceClaims": [{"name": REQUEST, "resourceClaimName": claim.name}],
        "schedulingGates": [{"name": GATE_NAME}],
    }
    if claim.pod is not None:
        requests = claim.pod.requests()
        if requests:
            resources["requests"] = requests
        if claim.pod.node_selector:
            spec["nodeSelector"] = dict(claim.pod.node_selector)
        if claim.pod.tolerations:
            spec["tolerations"] = [toleration.to_object() for toleration in claim.pod.tolerations]
    if claim.priority is not None:
        spec["priority"] = claim.priority
    if claim.priority_class_name is not None:
        spec["priorityClassName"] = claim.priority_class_name
    if claim.preemption_policy is not None:
        spec["preemptionPolicy"] = claim.preemption_policy
    metadata: Obj = {"name": claim.name, "namespace": claim.namespace, "uid": uid, "annotations": annotations}
    if claim.gang is not None:
        metadata["labels"] = {POD_GROUP_LABEL: claim.gang.name}
        annotations[MIN_MEMBERS_ANNOTATION] = str(claim.gang.min_member)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": "Pending"},
    }


@dataclass(frozen=True)
class ClusterSimulation:
    """The outcome per claim, in the shape ``simulate`` renders (with, for a pending claim, the
    nodes its pod cannot run on), and the reason the controller would report."""

    result: SimulationResult
    #: Per claim: the controller's pending reason (its condition's reason), None when placed.
    reasons: tuple[str | None, ...] = ()


def simulate_on_cluster(
    objects: ClusterObjects,
    claims: Sequence[ClaimSpec],
    driver: str,
    defaults: Defaults | None = None,
    *,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
) -> ClusterSimulation:
    """Place ``claims`` on ``objects`` with the controller's allocator, in the controller's order:
    the highest priority first, then the file's order (the order of arrival). A claim that fits
    nowhere for capacity preempts as the controller would (``preemption.py``: the cheapest pods
    of lower priority, reported as its victims and then taken out of the simulated cluster;
    nothing is evicted); a gang's members are planned together when its first member comes,
    placed all together or none (``gang_plan.py``), and preempt together
    (``gang_preemption.py``). The results are in the file's order.

    ``ScenarioError`` when a claim's name is taken in its namespace (by a claim or a pod of the
    cluster): its objects would replace the cluster's.
    """
    _check_names(objects, claims)
    made = [
        (claim, claim_object(claim, driver, f"simulate-claim-{n}"), pod_object(claim, f"simulate-pod-{n}"))
        for n, claim in enumerate(claims)
    ]
    with_claims = dataclasses.replace(
        objects,
        claims=[*objects.claims, *(claim_obj for _, claim_obj, _ in made)],
        pods=[*objects.pods, *(pod_obj for _, _, pod_obj in made)],
        classes=[*objects.classes, *_default_class(objects, claims, driver)],
    )
    controller_defaults = (
        ControllerDefaults(defaults.policy, defaults.node_policy) if defaults is not None else None
    )
    allocator = allocator_for(with_claims, driver, controller_defaults)
    replay = _Replay(allocator, with_claims, claims)
    for position in sorted(range(len(claims)), key=lambda n: (-(claims[n].priority or 0), n)):
        if position in replay.outcomes:
            continue  # placed (or not) with its gang
        if claims[position].gang is not None:
            replay.gang(position)
        else:
            replay.one(position)
    decisions: list[Decision] = []
    blocks: list[str | None] = []
    reasons: list[str | None] = []
    refused: list[dict[str, str]] = []
    for position, (claim, _, pod_obj) in enumerate(made):
        outcome = replay.outcomes[position]
        decision, block, reason = _decided(allocator, claim, outcome, defaults, max_candidates)
        decisions.append(decision)
        blocks.append(block)
        reasons.append(reason)
        placed = isinstance(outcome, Placed) and decision.placement is not None
        refused.append({} if placed else _nodes_refused(allocator, pod_obj))
    victims = tuple(replay.victims.get(position, ()) for position in range(len(claims)))
    return ClusterSimulation(
        SimulationResult(tuple(decisions), tuple(blocks), tuple(refused), victims), tuple(reasons)
    )


class _Replay:
    """The claims' outcomes as the controller's passes would reach them (``simulate_on_cluster``)."""

    def __init__(self, allocator: Allocator, objects: ClusterObjects, claims: Sequence[ClaimSpec]) -> None:
        self.allocator = allocator
        self.objects = objects
        self.claims = claims
        self.outcomes: dict[int, AllocateOutcome] = {}
        self.victims: dict[int, tuple[Preempted, ...]] = {}
        self.now = time.time()

    def pod(self, position: int) -> PodView:
        claim = self.claims[position]
        return self.allocator.cache.pods[f"{claim.namespace}/{claim.name}"]

    def one(self, position: int) -> None:
        """One pod: placed, or placed once the cheapest lower-priority pods are gone, or pending."""
        allocator, pod = self.allocator, self.pod(position)
        outcome = allocator.allocate(pod, quiet=True)
        if isinstance(outcome, Unschedulable) and refusal(pod, outcome.reason) is None:
            found = candidates_for(allocator, pod, hidden=allocator.hidden_holds(pod), now=self.now)
            if found:
                apply_evicted(allocator.cache, found[0])
                self.victims[position] = _preempted(found[0].victims)
                outcome = allocator.allocate(pod, quiet=True)
        self._settle(position, outcome)

    def gang(self, position: int) -> None:
        """Every member of the claim's gang: placed together (preempting together if it must),
        or each pending with the gang's reason."""
        allocator = self.allocator
        plan = gang_plan_for(self.objects, allocator, self.pod(position))
        assert plan is not None  # the claim names a gang with a minimum
        members = {f"{c.namespace}/{c.name}": n for n, c in enumerate(self.claims) if c.gang is not None}
        members = {key: n for key, n in members.items() if key in plan.gated or key in plan.admitted}
        if plan.satisfied:  # enough members past the gate already: the rest are placed one by one
            for member in sorted(members.values(), key=lambda n: (-(self.claims[n].priority or 0), n)):
                self.one(member)
            return
        candidate = None
        if not plan.ready and gang_refusal(plan) is None:
            hidden = gang_hidden(plan, allocator.hidden_holds)
            candidate = gang_candidate(allocator, plan, hidden=hidden, now=self.now)
            if candidate is not None:
                apply_evicted(allocator.cache, candidate)
                plan = gang_plan_for(self.objects, allocator, self.pod(position))
                assert plan is not None
        if plan.ready:
            for placed in plan.placed:
                position_of = members.get(placed.pod.key)  # None: a gated member of the cluster's
                node = _node_of(placed)
                if candidate is not None and position_of is not None:
                    self.victims[position_of] = _preempted(v for v in candidate.victims if v.node == node)
                self._settle(position_of, placed)
            for key, refused in plan.refused.items():  # past the minimum: pending alone
                if key in members:
                    self.outcomes[members[key]] = refused
        else:
            waiting = Unschedulable(plan.reason(), plan.summary())
            for placed in plan.placed:
                if placed.pod.key in members:
                    self.outcomes[members[placed.pod.key]] = dataclasses.replace(
                        waiting, decisions=placed.decisions
                    )
            for key, refused in plan.refused.items():
                if key in members:
                    decisions = refused.decisions if isinstance(refused, Unschedulable) else ()
                    self.outcomes[members[key]] = dataclasses.replace(waiting, decisions=decisions)
        for member in members.values():  # members the plan did not reach (a claim being written)
            self.outcomes.setdefault(member, Unschedulable(plan.reason(), plan.summary()))

    def _settle(self, position: int | None, outcome: AllocateOutcome) -> None:
        """The outcome of the claim at ``position`` (None: a pod of the cluster's), a placement
        folded into the cache for the next claims to see."""
        if isinstance(outcome, Placed):
            node = _node_of(outcome)
            if node is not None:
                apply_placed(self.allocator.cache, outcome, node)
        if position is not None:
            self.outcomes[position] = outcome


def _node_of(placed: Placed) -> str | None:
    placements = (planned.decision.placement for planned in placed.decisions)
    return next((placement.node for placement in placements if placement is not None), None)


def _preempted(victims: Iterable[Holder]) -> tuple[Preempted, ...]:
    return tuple(Preempted(victim.key, victim.priority, victim.node) for victim in victims)


def _default_class(objects: ClusterObjects, claims: Sequence[ClaimSpec], driver: str) -> list[Obj]:
    """The class a claim naming none asks for, where the cluster lacks it: a plain DeviceClass of
    the driver's devices (no config, so the claim's and the defaults' policies apply, as in a
    scenario). A cluster's own class of that name is used as it is."""
    if all(claim.device_class for claim in claims):
        return []
    if any((obj.get("metadata") or {}).get("name") == driver for obj in objects.classes):
        return []
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    ]


def _check_names(objects: ClusterObjects, claims: Sequence[ClaimSpec]) -> None:
    taken = {
        (kind, (obj.get("metadata") or {}).get("namespace"), (obj.get("metadata") or {}).get("name"))
        for kind, listed in ((RESOURCE_CLAIMS.kind, objects.claims), (PODS.kind, objects.pods))
        for obj in listed
    }
    problems = [
        f"claims[{position}]({claim.name}): the cluster has a {kind} {claim.namespace}/{claim.name}; "
        "give the what-if claim another name"
        for position, claim in enumerate(claims)
        for kind in (RESOURCE_CLAIMS.kind, PODS.kind)
        if (kind, claim.namespace, claim.name) in taken
    ]
    if problems:
        raise ScenarioError("\n".join(problems))


def _decided(
    allocator: Allocator,
    claim: ClaimSpec,
    outcome: object,
    defaults: Defaults | None,
    max_candidates: int,
) -> tuple[Decision, str | None, str | None]:
    """The claim's engine decision as simulate renders it, the quota that held it (``namespace/name``)
    and the controller's pending reason."""
    planned = outcome.decisions if isinstance(outcome, (Placed, Unschedulable)) else ()
    decision = (
        dataclasses.replace(planned[0].decision, request=claim.name) if planned else _no_plan(claim, defaults)
    )
    if isinstance(outcome, Placed) and decision.placement is not None:
        return decision, None, None
    if isinstance(outcome, Unschedulable):
        message, reason = outcome.message, outcome.reason.value
    else:  # not the controller's to place: a claim of no class of ours, say
        message, reason = f"not placed by the controller ({type(outcome).__name__})", None
    decision = held(decision, message)
    decision = dataclasses.replace(decision, candidates=decision.candidates[:max_candidates])
    block = _quota_of(allocator, claim.namespace, message) if reason == Reason.QUOTA_EXCEEDED.value else None
    return decision, block, reason


def _no_plan(claim: ClaimSpec, defaults: Defaults | None) -> Decision:
    """A pending decision with no cards: the allocator refused before the planner ran (node fit,
    limits, a missing class); the policies shown are the claim's, else the defaults'."""
    fallback = defaults or Defaults()
    return Decision(
        request=claim.name,
        policy=parse_policy_chain(claim.policy if claim.policy is not None else fallback.policy),
        node_policy=parse_node_policy(claim.node_policy or fallback.node_policy),
        placement=None,
        reason=None,
        candidates=(),
        nodes=(),
    )


def _quota_of(allocator: Allocator, namespace: str, message: str) -> str | None:
    """``namespace/name`` of the quota a refusal's message names (``Breach.message`` names it by
    ``ref``), in the form simulate has always written (a ResourceQuota's ``resourcequota/NAME``)."""
    for quota in allocator.cache.quotas.in_namespace(namespace):
        if message.startswith(f"{Reason.QUOTA_EXCEEDED.value}: {quota.ref} "):
            return f"{quota.namespace}/{quota.metric_name}"
    return None


def _nodes_refused(allocator: Allocator, pod_obj: Obj) -> dict[str, str]:
    pod = allocator.cache.pods[f"{pod_obj['metadata']['namespace']}/{pod_obj['metadata']['name']}"]
    problems = ((node, allocator.fit_problem(pod, node)) for node in sorted(allocator.cache.ledger.inventory))
    return {node: problem for node, problem in problems if problem is not None}
