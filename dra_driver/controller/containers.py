"""Who consumes a claim whose GPU shares HAMi-core limits: the rules only the controller can check.

HAMi-core reads a share's limits from per-process environment (``CUDA_DEVICE_MEMORY_LIMIT_<i>``,
``<i>`` = the CUDA ordinal in the process) and freezes them in one cache file that must belong to
one container (``dra_driver/kubeletplugin/hamicore.py``). So a claim with memory/cores limits is
only correct when exactly one container of one pod consumes it, and that container has no other
GPU: another claim's or another driver's GPU would shift the ordinals, and its own ``_0`` would
overwrite ours, leaving one card unlimited. The webhook warns at admission when it can see the
claims (``dra_driver/webhook/admission.py``); a pod created before its claims, a shared claim or a
second pod is only visible here, where the pod and all its claims are known, so the controller
keeps such a pod pending with the reason instead of handing out a share nothing enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def claim_facts(
    pod_claim: str, claim: Mapping[str, Any], pod_uid: str, is_ours: Callable[[str], bool]
) -> PodClaim:
    """Read a ResourceClaim as :class:`PodClaim` (its requests' classes and capacity requests)."""
    meta = claim.get("metadata") or {}
    limited = gpu = False
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        bodies = [request.get("exactly") or {}, *(request.get("firstAvailable") or ())]
        for body in bodies:
            class_name = str(body.get("deviceClassName") or "")
            if is_ours(class_name):
                gpu = True
                requested = (body.get("capacity") or {}).get("requests") or {}
                limited = limited or any(key in requested for key in LIMITED_CAPACITIES)
            elif "gpu" in class_name.lower():
                gpu = True
    reserved = ((claim.get("status") or {}).get("reservedFor")) or ()
    others = tuple(
        str(entry.get("name") or entry.get("uid"))
        for entry in reserved
        if entry.get("resource") == "pods" and str(entry.get("uid")) != pod_uid
    )
    return PodClaim(pod_claim, f"{meta.get('namespace')}/{meta.get('name')}", limited, gpu, others)


def _extended_gpus(container: Mapping[str, Any]) -> list[str]:
    resources = container.get("resources") or {}
    names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    return sorted(name for name in names if name.endswith("/gpu"))


def limits_conflict(pod: Mapping[str, Any], claims: Sequence[PodClaim]) -> str | None:
    """Why the pod's limited claims could not be enforced (None: they can); one line for people.

    Claims are compared as ResourceClaims: two pod entries naming one claim are one GPU set.
    """
    by_name = {claim.pod_claim: claim for claim in claims}
    limited = {claim.claim: claim for claim in claims if claim.limited}
    if not limited:
        return None
    spec = pod.get("spec") or {}
    consumers: dict[str, list[str]] = {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        name = str(container.get("name", "?"))
        refs = (container.get("resources") or {}).get("claims") or ()
        used = {by_name[str(ref.get("name"))] for ref in refs if str(ref.get("name")) in by_name}
        mine = sorted({claim.claim for claim in used if claim.limited})
        for key in mine:
            consumers.setdefault(key, []).append(name)
        if not mine:
            continue
        others = sorted({claim.claim for claim in used if claim.gpu and claim.claim != mine[0]})
        extended = _extended_gpus(container)
        if others or extended:
            what = ", ".join([*(f"claim {c}" for c in others), *extended])
            return (
                f"container {name} consumes claim {mine[0]} with memory/cores limits together with another "
                f"GPU ({what}); HAMi-core's limits are per container and its CUDA ordinals would no longer "
                "match: put all the container's GPUs in one claim"
            )
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
