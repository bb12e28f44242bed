"""Admission decisions over AdmissionReview v1 dicts: pod gating and GpuConfig validation.

Mutation (``/mutate``, pods, CREATE): a pod whose claims (direct or from templates) request one of
our DeviceClasses gets the scheduling gate ``gpu.hami.io/allocation`` so our controller, not
kube-scheduler's first fit, chooses its GPUs. A pod whose claim cannot be read yet is gated too:
the controller lifts the gate of a pod that turns out not to use our classes, while an ungated
pod of ours could be given GPUs first-fit. A pod that already carries the gate is never patched
again, and a pod with ``spec.nodeName`` cannot be gated (the API forbids it).

The same request rejects a pod in which a container consumes a HAMi-limited claim (a claim of
our classes with memory/cores capacity requests) together with another GPU, or only some requests
of such a claim: HAMi-core's ``CUDA_DEVICE_*_LIMIT_<i>`` are per container and indexed by CUDA
ordinal (the rule and why: controller/containers.py, which the controller applies too).

Validation (``/validate``): ``GpuConfig`` in DeviceClasses, ResourceClaims and templates is parsed
strictly (unknown policy names, bad weights, unknown fields are rejected, naming the field).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.config import ConfigError, parse_gpu_config
from dra_driver.config.resolve import read_pod_annotations
from dra_driver.controller.containers import PodClaim, container_conflict, pod_containers, request_facts
from dra_driver.kube.errors import KubeError
from dra_driver.resource.objects import ClaimView, DeviceClassView, ObjectView, PodView, template_claim
from dra_driver.resource.refs import RequestRef
from dra_driver.webhook import GATE_NAME
from dra_driver.webhook.hami_resources import TranslationError, pod_token, translate_pod
from dra_driver.webhook.lookup import Lookup

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Verdict:
    allowed: bool = True
    message: str = ""
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)


def review_response(request: Mapping[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview v1 answer for ``request``."""
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch).encode()).decode()
    if verdict.warnings:
        response["warnings"] = verdict.warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


# --- claims -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """What one of the pod's claims asks for, as far as our driver is concerned."""

    pod_claim: str  # the name in pod.spec.resourceClaims
    ours: bool | None  # None: unknown (claim or class not readable yet)
    #: The claim's facts for the HAMi-core rules (controller/containers.py); None while unreadable.
    facts: PodClaim | None = None


def claim_use(pod_claim: str, refs: Sequence[RequestRef] | None, lookup: Lookup, claim: str = "") -> ClaimUse:
    """``claim``: what the rules call the claim (two pod entries naming one ResourceClaim share
    it); the pod's entry name by default."""
    if refs is None:
        return ClaimUse(pod_claim, None)
    answers: dict[str, bool | None] = {}
    for ref in refs:
        if ref.class_name in answers:
            continue
        try:
            answers[ref.class_name] = lookup.is_our_class(ref.class_name)
        except KubeError as err:
            log.warning("DeviceClass %s not readable, treated as unknown: %s", ref.class_name, err)
            answers[ref.class_name] = None
    values = answers.values()
    ours: bool | None = True if any(values) else (None if None in values else False)
    limited, gpu = request_facts(refs, answers.__getitem__)
    requests = tuple(dict.fromkeys(ref.request for ref in refs))
    return ClaimUse(pod_claim, ours, PodClaim(pod_claim, claim or pod_claim, limited, gpu, requests=requests))


def pod_claim_uses(pod: PodView, namespace: str, lookup: Lookup) -> list[ClaimUse]:
    uses = []
    first_entry: dict[str, str] = {}  # ResourceClaim name -> the first pod entry naming it
    for entry in pod.claim_entries:
        claim = entry.name
        refs: Sequence[RequestRef] | None
        try:
            if entry.claim:
                claim = first_entry.setdefault(entry.claim, entry.name)
                refs = lookup.claim_requests(namespace, entry.claim)
            elif entry.template:
                refs = lookup.template_requests(namespace, entry.template)
            else:
                refs = None
        except KubeError as err:
            # An API blip must not deny pods (of any driver) regardless of the failurePolicy:
            # unknown means gated, and the controller lifts the gate of a pod that is not ours.
            log.warning(
                "claim %s of a pod in %s not readable, treated as unknown: %s", entry.name, namespace, err
            )
            refs = None
        uses.append(claim_use(entry.name, refs, lookup, claim))
    return uses


def hami_core_problems(pod: PodView, uses: Sequence[ClaimUse]) -> list[str]:
    """Containers that would get conflicting HAMi-core limits (one message per container): the
    controller's per-container rule (:func:`container_conflict`), over the claims readable now."""
    claims = {use.pod_claim: use.facts for use in uses if use.facts is not None}
    problems = (container_conflict(container, claims) for container in pod_containers(pod))
    return [problem for problem in problems if problem is not None]


# --- pods -------------------------------------------------------------------------------------


def bound_pod_refusal(pod: PodView, uses: Sequence[ClaimUse]) -> str | None:
    """Why a pod created with ``spec.nodeName`` may not name these claims (None: it may).

    Such a pod skips the scheduler and our gate: kube-controller-manager reserves an allocated
    claim for it and the kubelet, finding the claim prepared for its first pod, runs it without
    asking our plugin. A claim of our classes would so be used by a pod nobody placed or charged,
    and a limited share by a second pod (its HAMi-core limit multiplied). The chart's ``bound-pods``
    admission policy refuses the same pods while the webhook is down; a claim unreadable here
    (created after the pod) is caught by its ``claim-reservations`` policy, which keeps a limited
    claim reserved for one pod.
    """
    ours = [use.pod_claim for use in uses if use.ours]
    if not ours:
        return None
    return (
        f"pod {pod.name or '(generated)'} sets spec.nodeName {pod.bound_to} and uses claim(s) "
        f"{', '.join(ours)} of a hami-dra DeviceClass: those are allocated and shared only by the "
        f"driver's controller, which places pods through the {GATE_NAME} scheduling gate; "
        "leave spec.nodeName out (use a nodeSelector or node affinity to pick the node)"
    )


def _namespace(request: Mapping[str, Any], pod: PodView) -> str:
    return str(request.get("namespace") or pod.namespace or "default")


def mutate_pod(request: Mapping[str, Any], lookup: Lookup) -> Verdict:
    pod = PodView(request.get("object") or {})
    if request.get("operation", "CREATE") != "CREATE":
        return Verdict()
    if not pod.claim_entries:
        return Verdict()
    namespace = _namespace(request, pod)
    uses = pod_claim_uses(pod, namespace, lookup)
    problems = hami_core_problems(pod, uses)
    if problems:
        return Verdict(allowed=False, message="; ".join(problems))
    verdict = Verdict(warnings=read_pod_annotations(pod.annotations).warnings())
    if not any(use.ours is not False for use in uses):
        verdict.warnings = []  # not our pod: our annotations mean nothing to it
        return verdict
    if pod.bound_to:
        refusal = bound_pod_refusal(pod, uses)
        if refusal is not None:
            return Verdict(allowed=False, message=refusal)
        verdict.warnings.append(
            f"pod sets spec.nodeName, so it cannot get the {GATE_NAME} gate: a claim of a hami-dra "
            "class is never allocated or shared for it"
        )
        return verdict
    if pod.gated:
        return verdict  # never mutate twice
    if not pod.other_gates:  # no gates (or an empty list): add the list
        verdict.patch = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE_NAME}]}]
    else:
        verdict.patch = [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE_NAME}}]
    return verdict


def translate_hami_pod(request: Mapping[str, Any], device_class: str, driver: str) -> Verdict:
    """``/mutate-hami``: HAMi's ``nvidia.com/*`` resources become claims (see hami_resources.py).

    Answered from the request alone: no API call, no write, no read. The webhook's Service answers
    any caller that reaches it, so whatever a hand-made review names (another namespace, other
    claims), its answer is a patch computed from its own body, and nothing happens anywhere. The
    templates the patch names are created by the controller, from the pod the API server stored
    (dra_driver/controller/hami_templates.py), which is also where the namespace's opt-in is
    checked; the API server only sends pods of opted-in namespaces (the namespaceSelector).

    The translated pod is gated in the same admission (its new claims are ours by construction):
    the controller, not kube-scheduler, must see it, since its templates exist only once the
    controller has made them. A pod bound to a node (``spec.nodeName``) cannot be gated, so it is
    refused rather than admitted to wait for templates nobody makes.
    """
    pod = request.get("object") or {}
    if request.get("operation", "CREATE") != "CREATE":
        return Verdict()
    view = PodView(pod)
    namespace = _namespace(request, view)
    try:
        token = pod_token(str(request.get("uid") or ""))
        translation = translate_pod(pod, namespace, device_class, driver, token)
    except TranslationError as err:
        return Verdict(allowed=False, message=f"HAMi resources: {err}")
    if translation is None:
        return Verdict()
    patch = list(translation.patch)
    if translation.templates:
        if view.bound_to:
            return Verdict(
                allowed=False,
                message="HAMi resources: the pod sets spec.nodeName, so the hami-dra controller cannot place "
                "it; choose the node with a nodeSelector or node affinity instead",
            )
        if not view.gated:
            patch += _gate_patch(view)
    notes = [
        f"container {container}: {', '.join(f'{k}={v}' for k, v in entry['from'].items())} -> "
        f"claim {entry['claim']} from ResourceClaimTemplate {entry['template']}"
        for container, entry in translation.summary.items()
    ]
    log.info("pod %s/%s: %s", namespace, view.name or "(generated)", "; ".join(notes))
    return Verdict(patch=patch)


def _gate_patch(pod: PodView) -> list[dict[str, Any]]:
    """The JSONPatch op that adds our scheduling gate to ``pod`` (which does not carry it)."""
    if not pod.other_gates:  # no gates (or an empty list): add the list
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE_NAME}]}]
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE_NAME}}]


# --- GpuConfig validation ---------------------------------------------------------------------


def config_problems(entries: Sequence[Mapping[str, Any]] | None, driver: str, path: str) -> list[str]:
    problems = []
    for position, entry in enumerate(entries or ()):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        try:
            parse_gpu_config(opaque.get("parameters"))
        except ConfigError as err:
            problems.append(f"{path}[{position}].opaque.parameters: {err}")
    return problems


def validate_object(request: Mapping[str, Any], driver: str) -> Verdict:
    obj = request.get("object") or {}
    kind = (request.get("kind") or {}).get("kind") or obj.get("kind")
    if kind == "DeviceClass":
        problems = config_problems(DeviceClassView(obj, driver).config, driver, "spec.config")
    elif kind == "ResourceClaim":
        problems = config_problems(ClaimView(obj, driver).config, driver, "spec.devices.config")
    elif kind == "ResourceClaimTemplate":
        problems = config_problems(template_claim(obj, driver).config, driver, "spec.spec.devices.config")
    else:
        return Verdict()
    if problems:
        view = ObjectView(obj)
        name = view.name or (obj.get("metadata") or {}).get("generateName", "")
        return Verdict(allowed=False, message=f"{kind} {name}: invalid GpuConfig: " + "; ".join(problems))
    return Verdict()
