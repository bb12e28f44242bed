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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import ContainerView, RequestRef

#: Pending reason of a pod that breaks these rules.
GPU_LIMITS_CONFLICT = Reason.LIMITS_CONFLICT


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


def names_a_gpu(class_name: str) -> bool:
    """Whether another driver's DeviceClass hands out GPUs (by its name: ``gpu.nvidia.com``...)."""
    return "gpu" in class_name.lower()


def request_facts(refs: Iterable[RequestRef], is_ours: Callable[[str], bool | None]) -> tuple[bool, bool]:
    """(limited, gpu) of a claim's requests: whether HAMi-core limits apply, whether any is a GPU.

    ``is_ours`` answers None for a class not known (the webhook's unreadable class): neither ours
    nor another driver's GPU.
    """
    limited = gpu = False
    for ref in refs:
        ours = is_ours(ref.class_name)
        if ours:
            gpu = True
            limited = limited or ref.asks_limits
        elif ours is False and names_a_gpu(ref.class_name):
            gpu = True
    return limited, gpu


def claim_facts(
    pod_claim: str, claim: ClaimView, pod_uid: str, is_ours: Callable[[str], bool | None]
) -> PodClaim:
    """Read a ResourceClaim as :class:`PodClaim` (its requests' classes and capacity requests)."""
    limited, gpu = request_facts(claim.request_refs, is_ours)
    others = tuple(name for uid, name in claim.reserved_pods if uid != pod_uid)
    requests = tuple(dict.fromkeys(ref.request for ref in claim.request_refs))
    return PodClaim(pod_claim, claim.key, limited, gpu, others, requests)


def container_conflict(container: ContainerView, claims: Mapping[str, PodClaim]) -> str | None:
    """Why a limited claim that ``container`` consumes cannot be enforced in it (None: it can).

    Such a container consumes no other GPU (another claim with a GPU, limited or not, or an
    extended-resource GPU) and every request of the claim. ``claims`` maps the pod's claim entries
    to their facts; an entry it lacks (a claim not known yet) counts as no GPU.
    """
    name = container.name
    used: dict[str, PodClaim] = {}
    consumed: dict[str, set[str]] = {}
    whole: set[str] = set()
    for ref in container.claims:
        claim = claims.get(ref.name)
        if claim is None:
            continue
        used[claim.claim] = claim
        if ref.request:
            consumed.setdefault(claim.claim, set()).add(ref.request)
        else:
            whole.add(claim.claim)
    limited = sorted(key for key, claim in used.items() if claim.limited)
    if not limited:
        return None
    mine = limited[0]
    others = sorted(key for key, claim in used.items() if claim.gpu and key != mine)
    extended = list(container.extended_gpus)
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


def pod_containers(pod: PodView) -> tuple[ContainerView, ...]:
    """The pod's init containers and containers."""
    return (*pod.init_containers, *pod.containers)


def limits_conflict(pod: PodView, claims: Sequence[PodClaim]) -> str | None:
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
        used = {by_name[ref.name] for ref in container.claims if ref.name in by_name}
        for key in sorted({claim.claim for claim in used if claim.limited}):
            consumers.setdefault(key, []).append(container.name)
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
