"""Who consumes a claim whose GPU shares HAMi-core limits: the rules only the controller can check.

HAMi-core reads a share's limits from per-process environment (``CUDA_DEVICE_MEMORY_LIMIT_<i>``,
``<i>`` = the CUDA ordinal in the process) and freezes them in one cache file that must belong to
one container (``dra_driver/kubeletplugin/hamicore.py``). So a claim with memory/cores limits is
only correct when exactly one container of one pod consumes it, and that container has no other
GPU: another claim's or another driver's GPU would shift the ordinals, and its own ``_0`` would
overwrite ours, leaving one card unlimited; a container that consumes only some requests of the
claim gets fewer GPUs than the claim's ordinals count. The per-container rule
(:func:`container_conflict`) is the webhook's too (``dra_driver/webhook/admission.py``), which
denies such a pod when it can see the claims; a pod created before its claims, a shared claim or a
second pod is only visible here, where the pod and all its claims are known, so the controller
keeps such a pod pending with the reason instead of handing out a share nothing enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.contract import LIMITED_CAPACITIES

#: Pending reason of a pod that breaks these rules.
GPU_LIMITS_CONFLICT = "GpuLimitsConflict"


@dataclass(frozen=True)
class PodClaim:
    """One ``spec.resourceClaims`` entry of the pod, with what the rules need of its claim."""

    pod_claim: str
    claim: str
    #: Some request of ours asks for memory/cores: HAMi-core limits apply to the container.
    limited: bool
    #: Any GPU: a request of ours, or of another driver's class that names a GPU.
    gpu: bool
    #: Pods other than this one the claim is reserved for.
    other_pods: tuple[str, ...] = ()
    #: The claim's request names (a limited claim must be consumed with all of them).
    requests: tuple[str, ...] = ()


def request_classes(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(request name, DeviceClass name, body) of each request of a claim's ``spec``, and of each
    ``firstAvailable`` alternative."""
    for request in (spec.get("devices") or {}).get("requests") or ():
        name = str(request.get("name", ""))
        if request.get("exactly"):
            yield name, str(request["exactly"].get("deviceClassName") or ""), request["exactly"]
        for body in request.get("firstAvailable") or ():
            yield name, str(body.get("deviceClassName") or ""), body


def asks_limits(body: Mapping[str, Any]) -> bool:
    """Whether a request of our class asks for memory/cores: HAMi-core limits apply to its GPUs."""
    requested = (body.get("capacity") or {}).get("requests") or {}
    return any(key in requested for key in LIMITED_CAPACITIES)


def names_a_gpu(class_name: str) -> bool:
    """Whether another driver's DeviceClass hands out GPUs (by its name: ``gpu.nvidia.com``...)."""
    return "gpu" in class_name.lower()


def claim_facts(
    pod_claim: str, claim: Mapping[str, Any], pod_uid: str, is_ours: Callable[[str], bool]
) -> PodClaim:
    """Read a ResourceClaim as :class:`PodClaim` (its requests' classes and capacity requests)."""
    meta = claim.get("metadata") or {}
    limited = gpu = False
    requests: dict[str, None] = {}
    for request, class_name, body in request_classes(claim.get("spec") or {}):
        requests[request] = None
        if is_ours(class_name):
            gpu = True
            limited = limited or asks_limits(body)
        elif names_a_gpu(class_name):
            gpu = True
    reserved = ((claim.get("status") or {}).get("reservedFor")) or ()
    others = tuple(
        str(entry.get("name") or entry.get("uid"))
        for entry in reserved
        if entry.get("resource") == "pods" and str(entry.get("uid")) != pod_uid
    )
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    return PodClaim(pod_claim, key, limited, gpu, others, tuple(requests))


def pod_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's init containers and containers."""
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


def _extended_gpus(container: Mapping[str, Any]) -> list[str]:
    resources = container.get("resources") or {}
    names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    return sorted(name for name in names if name.endswith("/gpu"))


def container_conflict(container: Mapping[str, Any], claims: Mapping[str, PodClaim]) -> str | None:
    """Why a limited claim that ``container`` consumes cannot be enforced in it (None: it can).

    Such a container consumes no other GPU (another claim with a GPU, limited or not, or an
    extended-resource GPU) and every request of the claim. ``claims`` maps the pod's claim entries
    to their facts; an entry it lacks (a claim not known yet) counts as no GPU.
    """
    name = str(container.get("name", "?"))
    used: dict[str, PodClaim] = {}
    consumed: dict[str, set[str]] = {}
    whole: set[str] = set()
    for ref in (container.get("resources") or {}).get("claims") or ():
        claim = claims.get(str(ref.get("name")))
        if claim is None:
            continue
        used[claim.claim] = claim
        if ref.get("request"):
            consumed.setdefault(claim.claim, set()).add(str(ref["request"]))
        else:
            whole.add(claim.claim)
    limited = sorted(key for key, claim in used.items() if claim.limited)
    if not limited:
        return None
    mine = limited[0]
    others = sorted(key for key, claim in used.items() if claim.gpu and key != mine)
    extended = _extended_gpus(container)
    if others or extended:
        what = ", ".join([*(f"claim {c}" for c in others), *extended])
        return (
            f"container {name} consumes claim {mine} with memory/cores limits together with another "
            f"GPU ({what}); HAMi-core's limits are per container and its CUDA ordinals would no longer "
            "match: put all the container's GPUs in one claim"
        )
    missing = sorted(set(used[mine].requests) - consumed.get(mine, set())) if mine not in whole else []
    if missing:
        return (
            f"container {name} consumes only some requests of claim {mine} (not {', '.join(missing)}); "
            "a claim with memory/cores limits must be consumed whole by one container"
        )
    return None


def limits_conflict(pod: Mapping[str, Any], claims: Sequence[PodClaim]) -> str | None:
    """Why the pod's limited claims could not be enforced (None: they can); one line for people.

    Claims are compared as ResourceClaims: two pod entries naming one claim are one GPU set.
    """
    by_name = {claim.pod_claim: claim for claim in claims}
    limited = {claim.claim: claim for claim in claims if claim.limited}
    if not limited:
        return None
    consumers: dict[str, list[str]] = {}
    for container in pod_containers(pod):
        problem = container_conflict(container, by_name)
        if problem is not None:
            return problem
        name = str(container.get("name", "?"))
        refs = (container.get("resources") or {}).get("claims") or ()
        used = {by_name[str(ref.get("name"))] for ref in refs if str(ref.get("name")) in by_name}
        for key in sorted({claim.claim for claim in used if claim.limited}):
            consumers.setdefault(key, []).append(name)
    for key, names in sorted(consumers.items()):
        if len(names) > 1:
            return (
                f"claim {key} with memory/cores limits is consumed by containers {', '.join(names)}; "
                "HAMi-core keeps one limits cache per container: give each its own claim"
            )
    for claim in limited.values():
        if claim.other_pods:
            return (
                f"claim {claim.claim} with memory/cores limits is already in use by pod "
                f"{', '.join(claim.other_pods)}; HAMi-core keeps one limits cache per container: give each "
                "pod its own claim (a ResourceClaimTemplate)"
            )
    return None
