"""The Event rules of kube-apiserver (``pkg/apis/core/validation/events.go``), in the core/v1 shape.

Every Event passes the legacy rules: its namespace agrees with its object's, and one with an
``eventTime`` (the new API's events) names its reporting controller, instance, action and reason
within their limits. Writes through ``events.k8s.io/v1`` are also checked strictly: on create an
``eventTime``, a Normal or Warning type and none of the deprecated fields; a series of at least 2
with a ``lastObservedTime``; on update nothing but the series may change.
"""

from __future__ import annotations

from typing import Any

from hami_dra_dev.sandbox import errors as e
from hami_dra_dev.sandbox.fieldcheck import DNS_SUBDOMAIN, LABEL_NAME, Errors

Obj = dict[str, Any]

REPORTING_INSTANCE_LIMIT = 128
ACTION_LIMIT = 128
REASON_LIMIT = 128
NOTE_LIMIT = 1024  # bytes
#: Fields an update through events.k8s.io/v1 may not change (core names).
IMMUTABLE = (
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "action",
    "related",
    "reportingComponent",
    "reportingInstance",
)


def _qualified_name(errs: Errors, path: str, value: str) -> None:
    prefix, _, name = value.rpartition("/")
    if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or not (
        len(name) <= 63 and LABEL_NAME.match(name)
    ):
        errs.append(
            e.invalid(
                path,
                value,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
                "and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'",
            )
        )


def validate_event(errs: Errors, event: Obj, old: Obj | None, strict: bool) -> None:
    """``event`` (and ``old`` on update) in the core/v1 shape; ``strict``: written as events.k8s.io/v1."""
    _legacy(errs, event)
    if not strict:
        return
    if old is None:
        _series(errs, event)
        # The v1 strategy validates a generateName as a whole subdomain (measured on kube-apiserver
        # 1.37: "x." is refused with 422), so events.k8s.io writers name their events themselves.
        prefix = str((event.get("metadata") or {}).get("generateName") or "")
        if prefix and not (len(prefix) <= 253 and DNS_SUBDOMAIN.fullmatch(prefix)):
            errs.append(
                e.invalid(
                    "metadata.generateName",
                    prefix,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                    "'-' or '.', and must start and end with an alphanumeric character",
                )
            )
        if not event.get("eventTime"):
            errs.append(e.required("eventTime"))
        if event.get("type") not in ("Normal", "Warning"):
            errs.append(e.invalid("type", "", f"has invalid value: {event.get('type', '')}"))
        for name in ("firstTimestamp", "lastTimestamp", "count"):
            if event.get(name):
                errs.append(e.invalid(name, "", "needs to be unset"))
        source = event.get("source") or {}
        if source.get("component") or source.get("host"):
            errs.append(e.invalid("source", "", "needs to be unset"))
        return
    if event.get("series") != old.get("series"):
        _series(errs, event)
    for name in IMMUTABLE:
        if event.get(name) != old.get(name):
            errs.append(e.invalid(name, event.get(name), "field is immutable"))


def _series(errs: Errors, event: Obj) -> None:
    series = event.get("series")
    if series is None:
        return
    if int(series.get("count") or 0) < 2:
        errs.append(e.invalid("series.count", "", "should be at least 2"))
    if not series.get("lastObservedTime"):
        errs.append(e.required("series.lastObservedTime"))


def _legacy(errs: Errors, event: Obj) -> None:
    namespace = event.get("metadata", {}).get("namespace", "")
    involved = event.get("involvedObject") or {}
    involved_ns = involved.get("namespace") or ""
    mismatch = e.invalid("involvedObject.namespace", involved_ns, "does not match event.namespace")
    if not event.get("eventTime"):
        if (not involved_ns and namespace not in ("", "default")) or (
            involved_ns and namespace != involved_ns
        ):
            errs.append(mismatch)
        return
    if not involved_ns and namespace not in ("default", "kube-system"):
        errs.append(mismatch)
    controller = event.get("reportingComponent") or ""
    if not controller:
        errs.append(e.required("reportingController"))
    else:
        _qualified_name(errs, "reportingController", controller)
    instance = event.get("reportingInstance") or ""
    if not instance:
        errs.append(e.required("reportingInstance"))
    elif len(instance) > REPORTING_INSTANCE_LIMIT:
        errs.append(
            e.invalid("reportingInstance", "", f"can have at most {REPORTING_INSTANCE_LIMIT} characters")
        )
    for name, limit in (("action", ACTION_LIMIT), ("reason", REASON_LIMIT)):
        value = event.get(name) or ""
        if not value:
            errs.append(e.required(name))
        elif len(value) > limit:
            errs.append(e.invalid(name, "", f"can have at most {limit} characters"))
    if len(str(event.get("message") or "").encode()) > NOTE_LIMIT:
        errs.append(e.invalid("message", "", f"can have at most {NOTE_LIMIT} characters"))
