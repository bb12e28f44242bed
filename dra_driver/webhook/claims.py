"""``/mutate-claims``: our finalizer on a new ResourceClaim of our DeviceClasses, at admission.

Why at admission: the controller must carry its finalizer on a claim before it writes the claim's
allocation (a deleted claim would otherwise vanish with a GPU share booked), and a status write
cannot set metadata. Added by the controller, it is one more write on every pod's critical path
(three writes per pod: finalizer, allocation, gate); added when the claim is created, it costs no
write at all. Claims from templates are created by kube-controller-manager, so admission is the
only place every claim passes before its pod is placed.

The chart uses a MutatingAdmissionPolicy for this where the API server serves one (GA and on by
default from Kubernetes 1.36: in process, no TLS round trip), and this webhook where it does not.
Either way it is an optimisation: the controller adds the finalizer itself to a claim that lacks
it (created before the install, during an outage), so a class that cannot be read, or a claim of
no class of ours, is admitted unchanged and the configuration's failurePolicy is Ignore.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dra_driver.contract import FINALIZER
from dra_driver.kube.errors import KubeError
from dra_driver.resource.refs import claim_request_refs
from dra_driver.webhook.admission import Verdict
from dra_driver.webhook.lookup import Lookup

log = logging.getLogger(__name__)


def uses_our_class(claim: Mapping[str, Any], lookup: Lookup) -> bool:
    """Whether any request (or ``firstAvailable`` alternative) of ``claim`` names a DeviceClass of
    ours; a class that cannot be read counts as not ours (the controller adds the finalizer then)."""
    for name in dict.fromkeys(ref.class_name for ref in claim_request_refs(claim)):
        try:
            if lookup.is_our_class(name):
                return True
        except KubeError as err:
            log.info("DeviceClass %s not readable; the claim is left to the controller: %s", name, err)
    return False


def finalizer_patch(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch that adds our finalizer to ``claim`` (empty when it carries it already)."""
    finalizers = (claim.get("metadata") or {}).get("finalizers")
    if not finalizers:  # absent, null or empty: the list is added
        return [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    if FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def finalize_claim(request: Mapping[str, Any], lookup: Lookup) -> Verdict:
    """Admit a ResourceClaim CREATE, with our finalizer when it uses a class of ours."""
    claim = request.get("object") or {}
    if request.get("operation", "CREATE") != "CREATE" or not isinstance(claim, Mapping):
        return Verdict()
    if (request.get("kind") or {}).get("kind", "ResourceClaim") != "ResourceClaim":
        return Verdict()
    if not uses_our_class(claim, lookup):
        return Verdict()
    return Verdict(patch=finalizer_patch(claim) or None)
