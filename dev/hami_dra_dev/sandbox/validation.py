"""Validation the way kube-apiserver does it: schema first, then the hand-written rules.

Schema: every object is checked against the strict OpenAPI schema of the Kubernetes version the
sandbox reports (``kubernetes-validate``'s bundled schemas; validators are built once per kind
because loading them costs far more than validating). Unknown fields are a 400 "strict decoding
error" and schema violations a 422 with field paths.

Rules: object metadata (names, labels, finalizers, owner references) here; the
``resource.k8s.io/v1`` rules in :mod:`dra_rules`; the Pod rules in :mod:`pod_rules`; field
formats in :mod:`fieldcheck`.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import referencing
from kubernetes_validate import utils as kv_utils

from dra_driver.kube.api import Obj
from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox import structural
from hami_dra_dev.sandbox.dra_rules import (
    validate_claim_spec,
    validate_claim_status,
    validate_device_class,
    validate_slice,
    validate_slice_update,
)
from hami_dra_dev.sandbox.errors import ApiError, FieldError
from hami_dra_dev.sandbox.event_rules import validate_event
from hami_dra_dev.sandbox.fieldcheck import DNS_SUBDOMAIN, LABEL_NAME, Errors
from hami_dra_dev.sandbox.pod_rules import validate_pod, validate_pod_update
from hami_dra_dev.sandbox.resources import ResourceType, to_storage

# --------------------------------------------------------------------------------------------- schema


class SchemaValidator:
    """Strict schema validation against one Kubernetes version, with validators cached per kind."""

    def __init__(self, kube_version: str) -> None:
        self.kube_version = kube_version
        versions = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= kube_version]
        self._schema_version = versions[-1] if versions else kv_utils.latest_version()
        self._dir = f"kubernetes-json-schema/v{self._schema_version}-local-strict"
        self._lock = threading.Lock()
        self._registry: referencing.Registry[Any] | None = None
        self._validators: dict[tuple[str, str], Any] = {}

    def _validator(self, rt: ResourceType) -> Any:
        key = (rt.api_version, rt.kind)
        with self._lock:
            if key in self._validators:
                return self._validators[key]
            api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", rt.api_version)
            try:
                schema = kv_utils.schema_contents(
                    f"{self._dir}/{rt.kind.lower()}-{api}.json", self.kube_version
                )
            except FileNotFoundError:
                self._validators[key] = None
                return None
            if self._registry is None:
                defs = kv_utils.schema_contents(f"{self._dir}/_definitions.json", self.kube_version)
                self._registry = referencing.Resource.from_contents(defs) @ referencing.Registry()
            registry = referencing.Resource.from_contents(schema) @ self._registry
            validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
            self._validators[key] = validator
            return validator

    def check(self, rt: ResourceType, obj: Obj) -> None:
        if rt.crd_schema is not None:
            self._check_custom(rt, obj)
            return
        validator = self._validator(rt)
        if validator is None:
            return
        name = obj.get("metadata", {}).get("name", "")
        unknown: list[str] = []
        field_errors: list[FieldError] = []
        for err in sorted(validator.iter_errors(obj), key=lambda x: list(map(str, x.absolute_path))):
            path = _path(err.absolute_path)
            if err.validator == "additionalProperties":
                for extra in re.findall(r"'([^']+)'", err.message.split("(")[-1]):
                    unknown.append(f"{path}.{extra}" if path else extra)
            elif err.validator == "required":
                missing = re.findall(r"'([^']+)' is a required property", err.message)
                field = missing[0] if missing else ""
                field_errors.append(e.required(f"{path}.{field}" if path and field else path or field))
            elif err.validator == "type":
                # Go's JSON decoder fails before validation runs: Kubernetes answers 400, not 422.
                wanted = (
                    err.validator_value
                    if isinstance(err.validator_value, str)
                    else "/".join(map(str, err.validator_value))
                )
                raise e.bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: cannot '
                    f"unmarshal {_json_type(err.instance)} into Go struct field {rt.kind}.{path} "
                    f"of type {wanted}"
                )
            else:
                field_errors.append(e.invalid(path or "<root>", err.instance, err.message))
        if unknown:
            raise e.bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown)
            )
        if field_errors:
            raise e.invalid_object(rt, name, field_errors)

    @staticmethod
    def _check_custom(rt: ResourceType, obj: Obj) -> None:
        assert rt.crd_schema is not None
        unknown: list[str] = []
        field_errors: list[FieldError] = []
        body = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")}
        structural.validate(rt.crd_schema, body, "", unknown, field_errors)
        if unknown:
            raise e.bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown)
            )
        if field_errors:
            raise e.invalid_object(rt, obj.get("metadata", {}).get("name", ""), field_errors)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --------------------------------------------------------------------------------------------- metadata


def validate_metadata(rt: ResourceType, obj: Obj, errs: Errors) -> None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        errs.append(e.required("metadata.name", "name or generateName is required"))
    elif rt.plural in ("namespaces",):
        errs.dns_label("metadata.name", name)
    else:
        errs.dns_subdomain("metadata.name", name)
    if rt.namespaced and not meta.get("namespace"):
        errs.append(e.required("metadata.namespace"))
    for kind in ("labels", "annotations"):
        for key, value in (meta.get(kind) or {}).items():
            prefix, _, short = key.rpartition("/")
            if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or not (
                len(short) <= 63 and LABEL_NAME.match(short)
            ):
                errs.append(
                    e.invalid(
                        f"metadata.{kind}",
                        key,
                        "name part must consist of alphanumeric characters, "
                        "'-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
            if kind == "labels" and value and (len(value) > 63 or not LABEL_NAME.match(value)):
                errs.append(
                    e.invalid(
                        "metadata.labels",
                        value,
                        "a valid label must be an empty string or consist "
                        "of alphanumeric characters, '-', '_' or '.'",
                    )
                )
    errs.unique("metadata.finalizers", meta.get("finalizers") or [])
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(f):
                errs.append(e.required(f"metadata.ownerReferences[{i}].{f}"))
    if sum(1 for r in meta.get("ownerReferences") or [] if r.get("controller")) > 1:
        errs.append(
            e.invalid(
                "metadata.ownerReferences",
                meta["ownerReferences"],
                "Only one reference can have Controller set to true",
            )
        )


# --------------------------------------------------------------------------------------------- entry points


class Validator:
    """All validation for one sandbox (one Kubernetes version)."""

    def __init__(self, kube_version: str) -> None:
        self.schema = SchemaValidator(kube_version)

    def validate(self, rt: ResourceType, obj: Obj, old: Obj | None, *, status_only: bool = False) -> None:
        """Raise ApiError (400/422) when ``obj`` (replacing ``old``, if any) is not acceptable."""
        self.schema.check(rt, obj)
        errs = Errors()
        validate_metadata(rt, obj, errs)
        if old is not None:
            new_fin = set(obj["metadata"].get("finalizers") or [])
            old_fin = set(old["metadata"].get("finalizers") or [])
            if old["metadata"].get("deletionTimestamp") and new_fin - old_fin:
                errs.append(
                    e.forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being "
                        "deleted, found new finalizers " + json.dumps(sorted(new_fin - old_fin)),
                    )
                )
            if rt.immutable_spec and obj.get("spec") != old.get("spec"):
                errs.append(e.invalid("spec", obj.get("spec"), "field is immutable"))
        key = rt.key
        if key == "resourceslices.resource.k8s.io":
            validate_slice(errs, obj)
            if old is not None:
                validate_slice_update(errs, obj, old)
        elif key == "resourceclaims.resource.k8s.io":
            if old is None or not status_only:
                validate_claim_spec(errs, "spec", obj.get("spec") or {})
            validate_claim_status(errs, obj, old)
        elif key == "resourceclaimtemplates.resource.k8s.io":
            validate_claim_spec(errs, "spec.spec", (obj.get("spec") or {}).get("spec") or {})
        elif key == "deviceclasses.resource.k8s.io":
            validate_device_class(errs, obj)
        elif rt.storage_key == "events":
            # The rules see the core/v1 shape, whichever version the request used.
            event, old_event = to_storage(rt, obj), None if old is None else to_storage(rt, old)
            validate_event(errs, event, old_event, strict=rt.group == "events.k8s.io")
        elif key == "pods" and not status_only:
            validate_pod(obj, errs)
            if old is not None:
                validate_pod_update(obj, old, errs)
        if errs:
            raise e.invalid_object(rt, obj.get("metadata", {}).get("name", ""), list(errs))


__all__ = ["ApiError", "Validator"]
