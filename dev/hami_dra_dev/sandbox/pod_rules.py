"""The Pod validation rules that matter for a DRA driver (``pkg/apis/core/validation``).

- ``spec.resourceClaims[]``: DNS-label names, unique; exactly one of ``resourceClaimName`` /
  ``resourceClaimTemplateName``; every ``containers[].resources.claims[].name`` names one of them;
- ``spec.schedulingGates``: unique names; on update gates may only be removed, never added
  (the webhook gates at CREATE, the controller removes the gate);
- pod updates may change only what Kubernetes allows: container images, ``activeDeadlineSeconds``,
  added tolerations, removed scheduling gates and, while the pod is still gated, added
  ``nodeSelector`` entries and ``affinity``. ``spec.nodeName`` is set by the binding only.
"""

from __future__ import annotations

import copy

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.errors import FieldError
from hami_dra_dev.sandbox.fieldcheck import DNS_LABEL

UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`, "
    "`spec.initContainers[*].image`, "
    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), "
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def validate_pod(pod: Obj, errs: list[FieldError]) -> None:
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for i, claim in enumerate(spec.get("resourceClaims") or []):
        path = f"spec.resourceClaims[{i}]"
        name = claim.get("name", "")
        if not DNS_LABEL.match(name) or len(name) > 63:
            errs.append(
                e.invalid(
                    f"{path}.name",
                    name,
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
                )
            )
        if name in names:
            errs.append(e.duplicate(f"{path}.name", name))
        names.add(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(k)]
        if len(sources) != 1:
            errs.append(
                e.invalid(
                    path, claim, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"
                )
            )
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            for j, ref in enumerate((container.get("resources") or {}).get("claims") or []):
                if ref.get("name") not in names:
                    errs.append(
                        e.not_supported(
                            f"spec.{kind}[{i}].resources.claims[{j}].name", ref.get("name"), sorted(names)
                        )
                    )
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    for i, gate in enumerate(gates):
        if gate in gates[:i]:
            errs.append(e.duplicate(f"spec.schedulingGates[{i}].name", gate))


def _comparable(spec: Obj, gated: bool) -> Obj:
    out = copy.deepcopy(spec)
    for kind in ("containers", "initContainers"):
        for container in out.get(kind) or []:
            container.pop("image", None)
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        out.pop(key, None)
    if gated:
        out.pop("nodeSelector", None)
        out.pop("affinity", None)
    return out


def validate_pod_update(new: Obj, old: Obj, errs: list[FieldError]) -> None:
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    old_gates = [g.get("name") for g in old_spec.get("schedulingGates") or []]
    for i, gate in enumerate(new_spec.get("schedulingGates") or []):
        if gate.get("name") not in old_gates:
            errs.append(
                e.forbidden(
                    f"spec.schedulingGates[{i}]",
                    f"only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
                )
            )
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        errs.append(
            e.forbidden(
                "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"
            )
        )
    if old_gates:
        for key, value in (old_spec.get("nodeSelector") or {}).items():
            if (new_spec.get("nodeSelector") or {}).get(key) != value:
                errs.append(
                    e.invalid(
                        "spec.nodeSelector",
                        new_spec.get("nodeSelector"),
                        "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                    )
                )
                break
    if _comparable(new_spec, bool(old_gates)) != _comparable(old_spec, bool(old_gates)):
        errs.append(e.forbidden("spec", UPDATE_FORBIDDEN))
