"""The Warning events of a placed pod that has not started, for ``explain``.

After the controller places a pod, what stops it is told by kubelet, the runtime or the API server
in events on the pod, not in our condition: the kubelet plugin's refusal to prepare a claim
(``FailedPrepareDynamicResources``), a CDI spec the runtime cannot resolve (``Failed``), a sandbox
that cannot be made. ``explain`` shows the newest of them with what to do, so that one command
answers "why does my GPU pod not start?" as it answers "why is it pending?".

Pure functions over the event objects as listed (``v1`` Events, so kubelet's ``source``); the
command lists them with a field selector on the pod's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: How many events are shown, newest last.
SHOWN = 5
TROUBLESHOOTING = "docs/troubleshooting.md, 'A placed pod that does not start'"

#: (reason, words in the message, what to do), the first match wins; "" matches any message.
HINTS: tuple[tuple[str, str, str], ...] = (
    (
        "FailedPrepareDynamicResources",
        "is not registered",
        "no kubelet plugin of the driver runs on the node, or kubelet has not registered it: the "
        "node's plugin pod (kubectl get pods -o wide -l app.kubernetes.io/component=kubelet-plugin)",
    ),
    (
        "FailedPrepareDynamicResources",
        "NodePrepareResources failed for ResourceClaim",
        f"the kubelet plugin refused the claim; its message and the fix: {TROUBLESHOOTING}",
    ),
    (
        "FailedPrepareDynamicResources",
        "",
        f"kubelet could not prepare the pod's claims (it retries): {TROUBLESHOOTING}",
    ),
    (
        "",
        "unresolvable CDI devices",
        "the runtime cannot find the claim's CDI spec: CDI off in the runtime, or its CDI dirs are "
        f"not /var/run/cdi ({TROUBLESHOOTING})",
    ),
)


@dataclass(frozen=True)
class PodEvent:
    """One Warning event of the pod, as ``explain`` shows it."""

    reason: str
    message: str
    source: str
    count: int
    last_seen: str
    hint: str

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "source": self.source,
            "count": self.count,
            "lastSeen": self.last_seen,
            "hint": self.hint,
        }


def hint(reason: str, message: str) -> str:
    """What to do about an event, or "" when nothing specific is known."""
    for wanted, words, what in HINTS:
        if (not wanted or wanted == reason) and words in message:
            return what
    return ""


def _last_seen(event: Mapping[str, Any]) -> str:
    series = event.get("series") or {}
    return str(
        event.get("lastTimestamp")
        or series.get("lastObservedTime")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def pod_warnings(events: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], driver: str) -> list[PodEvent]:
    """The pod's Warning events from anyone but our controller (``<driver>/controller``: its
    reasons are the condition's, which explain shows already), newest last, at most
    :data:`SHOWN`. Events of an earlier pod of the same name (another UID) are left out."""
    metadata = pod.get("metadata") or {}
    name, uid = metadata.get("name"), metadata.get("uid")
    picked = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind", "Pod") != "Pod" or involved.get("name") != name:
            continue
        if uid and involved.get("uid") and involved["uid"] != uid:
            continue
        if event.get("type") != "Warning":
            continue
        source = str((event.get("source") or {}).get("component") or event.get("reportingComponent") or "")
        if source == f"{driver}/controller":
            continue
        reason, message = str(event.get("reason") or ""), str(event.get("message") or "")
        count = int(event.get("count") or (event.get("series") or {}).get("count") or 1)
        picked.append(PodEvent(reason, message, source, count, _last_seen(event), hint(reason, message)))
    picked.sort(key=lambda e: e.last_seen)
    return picked[-SHOWN:]
