"""HAMi's extended resources -> per-container ResourceClaimTemplates (the ``/mutate-hami`` webhook).

A container that asks for ``nvidia.com/gpu`` (count), ``nvidia.com/gpumem`` (MiB per GPU),
``nvidia.com/gpumem-percentage`` or ``nvidia.com/gpucores`` (percent) gets, instead, a pod claim
made from a ResourceClaimTemplate of one of our DeviceClasses. kube-controller-manager creates the
claim from the template, owned by the pod, so no claim outlives its pod whatever happens to this
webhook.

The webhook writes nothing: its Service answers any caller, so a hand-made review must not create
objects with the webhook's rights (it would write into any namespace). It only rewrites the pod,
naming a template per pod and shape (``hami-<shape>-<token>``, the token from the review's UID) and
recording what it translated in the ``gpu.hami.io/hami-translated`` annotation. The controller
creates those templates afterwards, from the pod the API server stored, owned by that pod
(``templates_for_pod``, dra_driver/controller/hami_templates.py): a forged review creates nothing,
and the garbage collector deletes a pod's templates with it.

The derivation is HAMi's (its webhook and ``GenerateResourceRequests``): limits win over requests,
per resource; memory/cores/percentage without a count mean one GPU; a percentage is per card, must
be within 0..100 and 0 means unset; no memory and no percentage means the whole card; a count
without cores and without a memory slice (or with 100 percent) gets 100 cores, i.e. the card alone;
cores above 100 count as 100.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.config.model import API_VERSION, KIND
from dra_driver.quantity import parse_quantity
from dra_driver.webhook.optin import NAMESPACE_LABEL as NAMESPACE_LABEL
from dra_driver.webhook.optin import NAMESPACE_LABEL_VALUE as NAMESPACE_LABEL_VALUE

GPU = "nvidia.com/gpu"
GPU_MEMORY = "nvidia.com/gpumem"
GPU_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
GPU_CORES = "nvidia.com/gpucores"
HAMI_RESOURCES = (GPU, GPU_MEMORY, GPU_MEMORY_PERCENT, GPU_CORES)

#: Pod annotation saying what was translated, container by container.
TRANSLATED_ANNOTATION = "gpu.hami.io/hami-translated"
#: Label on the templates this webhook creates.
TEMPLATE_LABEL = "gpu.hami.io/hami-shape"
REQUEST_NAME = "gpu"
MAX_NAME = 63


class TranslationError(ValueError):
    """A HAMi resource request HAMi itself would reject; the message is the pod's denial."""


@dataclass(frozen=True, slots=True)
class Shape:
    """One container's GPU request in HAMi's terms, after HAMi's defaults."""

    count: int
    memory_mib: int | None  # per GPU; None with memory_percent None = the whole card
    memory_percent: int | None
    cores: int

    @property
    def template_name(self) -> str:
        memory = (
            f"{self.memory_mib}mi" if self.memory_mib is not None
            else f"{self.memory_percent}pct" if self.memory_percent is not None
            else "whole"
        )  # fmt: skip
        return f"hami-{self.count}gpu-{memory}-{self.cores}cores"

    def template(
        self, namespace: str, device_class: str, driver: str, name: str | None = None
    ) -> dict[str, Any]:
        """The ResourceClaimTemplate of this shape, named ``name`` (default: the shape's name)."""
        requests: dict[str, str] = {"cores": str(self.cores)}
        if self.memory_mib is not None:
            requests["memory"] = f"{self.memory_mib}Mi"
        exactly: dict[str, Any] = {"deviceClassName": device_class, "count": self.count}
        exactly["capacity"] = {"requests": requests}
        devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
        if self.memory_percent is not None:
            parameters = {"apiVersion": API_VERSION, "kind": KIND, "memoryPercent": self.memory_percent}
            devices["config"] = [
                {"requests": [REQUEST_NAME], "opaque": {"driver": driver, "parameters": parameters}}
            ]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name or self.template_name,
                "namespace": namespace,
                "labels": {TEMPLATE_LABEL: self.template_name, "app.kubernetes.io/managed-by": "hami-dra"},
            },
            "spec": {"spec": {"devices": devices}},
        }


def _whole_number(container: str, resource: str, value: Any) -> int:
    try:
        amount = parse_quantity(str(value))
    except ValueError:
        raise TranslationError(f"container {container}: {resource} {value!r} is not a number") from None
    if amount != int(amount):
        raise TranslationError(f"container {container}: {resource} must be a whole number, got {value}")
    return int(amount)


def hami_values(resources: Mapping[str, Any]) -> dict[str, Any]:
    """HAMi's resources of a container, limits winning over requests for each one."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    found = {}
    for name in HAMI_RESOURCES:
        if name in limits:
            found[name] = limits[name]
        elif name in requests:
            found[name] = requests[name]
    return found


def shape_of(container: str, values: Mapping[str, Any]) -> Shape | None:
    """HAMi's request for one container, or None when it asks for none of HAMi's resources."""
    if not values:
        return None
    count = _whole_number(container, GPU, values[GPU]) if GPU in values else 1
    if count < 0:
        raise TranslationError(f"container {container}: {GPU} must not be negative, got {count}")
    if count == 0:
        return None  # HAMi: no GPU asked for
    memory = _whole_number(container, GPU_MEMORY, values[GPU_MEMORY]) if GPU_MEMORY in values else 0
    if memory < 0:
        raise TranslationError(f"container {container}: {GPU_MEMORY} must not be negative, got {memory} MiB")
    percent: int | None = None
    if GPU_MEMORY_PERCENT in values:
        percent = _whole_number(container, GPU_MEMORY_PERCENT, values[GPU_MEMORY_PERCENT])
        if not 0 <= percent <= 100:
            raise TranslationError(
                f"container {container}: {GPU_MEMORY_PERCENT} must be within 0..100, got {percent} "
                "(HAMi rejects it too)"
            )
        if percent == 0:
            percent = None  # HAMi: 0 means unset
    if memory and percent is not None:
        percent = None  # HAMi's Fit uses the MiB value when both are given
    cores_given = GPU_CORES in values
    cores = _whole_number(container, GPU_CORES, values[GPU_CORES]) if cores_given else 0
    if cores < 0:
        raise TranslationError(f"container {container}: {GPU_CORES} must not be negative, got {cores}")
    cores = min(cores, 100)
    if GPU in values and not cores_given and (percent == 100 or (percent is None and not memory)):
        cores = 100  # HAMi's defaultExclusiveCoreIfNeeded: a whole card is an exclusive card
    if percent == 100:
        percent = None  # the whole card
    return Shape(count, memory or None, percent, cores)


def claim_name(container: str) -> str:
    """The pod claim name for a container's GPUs (a DNS label, unique per container)."""
    name = f"hami-{container}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(container.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}-{digest}"


@dataclass(frozen=True, slots=True)
class Translation:
    patch: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    summary: dict[str, Any]


def _without_hami(resources: Mapping[str, Any], claim: str | None) -> dict[str, Any]:
    """The container's resources without HAMi's names, consuming ``claim`` (None: no GPU asked)."""
    rewritten: dict[str, Any] = dict(resources)
    for section in ("limits", "requests"):
        kept = {k: v for k, v in (resources.get(section) or {}).items() if k not in HAMI_RESOURCES}
        if kept:
            rewritten[section] = kept
        else:
            rewritten.pop(section, None)
    if claim is not None:
        rewritten["claims"] = [*(resources.get("claims") or ()), {"name": claim}]
    return rewritten


def pod_token(review_uid: str = "") -> str:
    """The suffix that makes a pod's template names its own: from the review's UID (unique per
    admission), random without one. The pod's name is no use: with ``generateName`` it does not
    exist yet at admission, nor does its UID."""
    if not review_uid:
        return secrets.token_hex(5)
    return hashlib.sha256(review_uid.encode()).hexdigest()[:10]


def translate_pod(
    pod: Mapping[str, Any], namespace: str, device_class: str, driver: str, token: str = ""
) -> Translation | None:
    """The JSONPatch and the templates that move a pod's HAMi resources onto claims; None if none.

    Templates are named ``<shape>-<token>`` (``token``: ``pod_token``; empty: the shape alone).
    """
    spec = pod.get("spec") or {}
    patch: list[dict[str, Any]] = []
    templates: dict[str, dict[str, Any]] = {}
    pod_claims: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    existing = {str(c.get("name")) for c in spec.get("resourceClaims") or ()}
    for section in ("initContainers", "containers"):
        for position, container in enumerate(spec.get(section) or ()):
            name = str(container.get("name", f"{section}-{position}"))
            resources = container.get("resources") or {}
            values = hami_values(resources)
            shape = shape_of(name, values)
            if shape is None and not values:
                continue
            claim = claim_name(name)
            if claim in existing:
                raise TranslationError(
                    f"container {name}: the pod already has a resource claim named {claim}"
                )
            rewritten = _without_hami(resources, None if shape is None else claim)
            if shape is not None:
                template_name = f"{shape.template_name}-{token}" if token else shape.template_name
                templates[template_name] = shape.template(namespace, device_class, driver, template_name)
                pod_claims.append({"name": claim, "resourceClaimTemplateName": template_name})
                summary[name] = {
                    "from": {k: str(v) for k, v in values.items()},
                    "claim": claim,
                    "template": template_name,
                }
            patch.append({"op": "replace" if "resources" in container else "add",
                          "path": f"/spec/{section}/{position}/resources", "value": rewritten})  # fmt: skip
    if not patch:
        return None
    if pod_claims:
        if spec.get("resourceClaims") is None:
            patch.append({"op": "add", "path": "/spec/resourceClaims", "value": pod_claims})
        else:
            patch += [{"op": "add", "path": "/spec/resourceClaims/-", "value": c} for c in pod_claims]
    annotations = (pod.get("metadata") or {}).get("annotations")
    value = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    if annotations is None:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {TRANSLATED_ANNOTATION: value}})
    else:
        key = TRANSLATED_ANNOTATION.replace("~", "~0").replace("/", "~1")
        patch.append({"op": "add", "path": f"/metadata/annotations/{key}", "value": value})
    return Translation(patch, list(templates.values()), summary)


def apply_patch(pod: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The pod as the API server will store it after ``patch`` (only the ops ``translate_pod`` makes).

    The gate decision runs on this, so a translated pod is gated in the same admission.
    """
    result: dict[str, Any] = json.loads(json.dumps(pod))
    for op in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).lstrip("/").split("/")]
        target: Any = result
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        last = parts[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            target[last] = op["value"]
    return result


def templates_for_pod(pod: Mapping[str, Any], device_class: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates a translated pod waits for, owned by the pod (the controller
    creates them; the garbage collector deletes them with the pod).

    Built from the pod as the API server stored it: its ``gpu.hami.io/hami-translated`` annotation
    says, per container, what was asked for (``from``) and which claim and template replace it.
    Whoever wrote the annotation, a template is only made for a claim the pod itself names with
    that template, from the shape ``from`` gives, and named after that shape; anything else raises
    ``TranslationError`` (the pod's pending reason). Nothing here is trusted beyond the pod's own
    namespace: the template goes where the pod is.
    """
    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(TRANSLATED_ANNOTATION)
    if not text:
        return []
    try:
        summary = json.loads(text)
    except ValueError as err:
        raise TranslationError(f"annotation {TRANSLATED_ANNOTATION} is not JSON: {err}") from None
    if not isinstance(summary, dict):
        raise TranslationError(f"annotation {TRANSLATED_ANNOTATION} must map containers to translations")
    named = {
        str(entry.get("name")): entry.get("resourceClaimTemplateName")
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ()
        if isinstance(entry, dict)
    }
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
    }
    templates: dict[str, dict[str, Any]] = {}
    for container, entry in sorted(summary.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("from"), dict):
            raise TranslationError(f"annotation {TRANSLATED_ANNOTATION}: container {container} has no 'from'")
        claim, name = entry.get("claim"), entry.get("template")
        if not isinstance(name, str) or named.get(str(claim)) != name:
            raise TranslationError(
                f"annotation {TRANSLATED_ANNOTATION}: container {container}'s claim {claim} is not made "
                f"from template {name} in spec.resourceClaims"
            )
        shape = shape_of(str(container), entry["from"])
        if shape is None or not name.startswith(f"{shape.template_name}-"):
            raise TranslationError(
                f"annotation {TRANSLATED_ANNOTATION}: template {name} of container {container} is not "
                f"named after the shape its resources give ({shape.template_name if shape else 'no GPU'})"
            )
        template = shape.template(str(meta.get("namespace") or ""), device_class, driver, name)
        template["metadata"]["ownerReferences"] = [owner]
        templates[name] = template
    return list(templates.values())
