"""The ``GpuQuota`` CustomResourceDefinition (``gpu.hami.io/v1alpha1``), built here once.

``hack/gen-crd.py`` writes it to ``api/crds/`` and ``charts/hami-dra/crds/`` (a test checks both
are current), and the sandbox API server serves the resource from the same schema, so kubectl,
the real kube-apiserver and the sandbox agree on what a valid quota is.

The schema is structural: quantities are int-or-string with Kubernetes' quantity pattern, with
no sign allowed and integers at least 0 (a negative limit is refused, not clamped); ``hard`` lists
only ``memory``, ``cores`` and ``devices``, so a misspelt key is an unknown field (kubectl's
strict field validation refuses it) and a quota with no limit at all is refused too.
"""

from __future__ import annotations

from typing import Any

GROUP = "gpu.hami.io"
VERSION = "v1alpha1"
KIND = "GpuQuota"
PLURAL = "gpuquotas"
SINGULAR = "gpuquota"
SHORT_NAMES = ("gpuq",)
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
#: The resources a quota may limit, in the order they are printed and checked.
RESOURCES = ("memory", "cores", "devices")

#: Kubernetes' quantity grammar without a sign: limits are never negative.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"


def _quantity(description: str) -> dict[str, Any]:
    # Structural: the int-or-string ``anyOf`` may hold nothing but the two types, so the checks sit
    # beside it (a pattern applies to strings only, a minimum to numbers only).
    return {
        "description": description,
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "minimum": 0,
    }


def _count(description: str) -> dict[str, Any]:
    return {"description": description, "type": "integer", "format": "int64", "minimum": 0}


def _amounts(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "memory": _quantity(f"GPU memory {what} (bytes, as a quantity: 64Gi)."),
            "cores": _count(f"GPU cores {what}, in percent of one GPU (200 = two whole GPUs)."),
            "devices": _count(f"Distinct GPUs {what} by the namespace's claims."),
        },
    }


def schema() -> dict[str, Any]:
    """``openAPIV3Schema`` of the served version."""
    hard = _amounts("allowed in the namespace")
    hard["minProperties"] = 1
    hard["description"] = "Limits on what the namespace's allocated claims consume; any subset."
    used = _amounts("in use")
    used["description"] = "What the namespace's allocated claims consume, kept by the controller."
    return {
        "type": "object",
        "description": (
            "A cap on the GPU memory, cores and GPUs that a namespace's claims of hami-dra's "
            "DeviceClasses consume; enforced by the hami-dra controller when it places a claim."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["hard"],
                "properties": {
                    "hard": hard,
                    "deviceClassNames": {
                        "description": "Only claims of these DeviceClasses count (empty: all of hami-dra's).",
                        "type": "array",
                        "items": {"type": "string", "minLength": 1, "maxLength": 253},
                        "maxItems": 64,
                        "x-kubernetes-list-type": "set",
                    },
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "used": used,
                    "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                },
            },
        },
    }


def _columns() -> list[dict[str, Any]]:
    columns = []
    for resource in RESOURCES:
        kind = "string" if resource == "memory" else "integer"
        title = resource.capitalize()
        columns.append({"name": f"{title} used", "type": kind, "jsonPath": f".status.used.{resource}"})
        columns.append({"name": f"{title} hard", "type": kind, "jsonPath": f".spec.hard.{resource}"})
    columns.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return columns


def manifest() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "hami-dra"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["hami-dra"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _columns(),
                }
            ],
        },
    }


def render() -> str:
    """The manifest as the YAML file committed to ``api/crds/`` and the chart."""
    import yaml

    header = "# Generated by hack/gen-crd.py from dra_driver/quota/crd.py; do not edit.\n"
    return header + yaml.safe_dump(manifest(), sort_keys=False, width=120)
