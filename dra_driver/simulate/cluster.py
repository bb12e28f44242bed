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
from collections.abc import Sequence
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
from dra_driver.controller.allocator import Allocator, Placed, Unschedulable
from dra_driver.controller.offline import ClusterObjects, allocator_for, apply_placed
from dra_driver.controller.reasons import Reason
from dra_driver.engine import DEFAULT_MAX_CANDIDATES, Decision, parse_node_policy, parse_policy_chain
from dra_driver.kube.api import PODS, RESOURCE_CLAIMS, Obj
from dra_driver.simulate.run import SimulationResult, held
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
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": uid,
            "annotations": annotations,
        },
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
    """Place ``claims`` in order on ``objects`` with the controller's allocator.

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
    decisions: list[Decision] = []
    blocks: list[str | None] = []
    reasons: list[str | None] = []
    refused: list[dict[str, str]] = []
    for claim, _, pod_obj in made:
        pod = allocator.cache.pods[f"{claim.namespace}/{claim.name}"]
        outcome = allocator.allocate(pod)
        decision, block, reason = _decided(allocator, claim, outcome, defaults, max_candidates)
        if isinstance(outcome, Placed) and decision.placement is not None:
            apply_placed(allocator.cache, outcome, decision.placement.node)
            refused.append({})
        else:
            refused.append(_nodes_refused(allocator, pod_obj))
        decisions.append(decision)
        blocks.append(block)
        reasons.append(reason)
    return ClusterSimulation(
        SimulationResult(tuple(decisions), tuple(blocks), tuple(refused)), tuple(reasons)
    )


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
