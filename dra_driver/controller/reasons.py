"""Why a pod waits, as one vocabulary: the reasons the controller writes and matches.

A pending pod's reason is its condition's reason, the label of the pending-pods metric, and what
decides which changes may help it (``pod_queue.py``): a string compared in three modules is a
typo away from a pod that no change ever wakes. Every reason is a member here, written as the
string the API and the dashboards already know (``StrEnum``: a member *is* that string).
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """The reason of our ``PodScheduled``-like condition (status False) on a pod that waits."""

    #: Fits no node's free capacity: capacity released on a node retries it there.
    UNSCHEDULABLE = "Unschedulable"
    #: Its namespace's GpuQuota has no room: a quota change or a release in the namespace retries it.
    QUOTA_EXCEEDED = "GpuQuotaExceeded"
    #: Per-container GPU limits that HAMi-core cannot enforce (``containers.py``).
    LIMITS_CONFLICT = "GpuLimitsConflict"
    #: A claim's request, config or the pod's annotation is wrong, or planning it raised.
    INVALID_REQUEST = "InvalidRequest"
    #: A claim asks for a DeviceClass that does not exist (yet).
    DEVICE_CLASS_NOT_FOUND = "DeviceClassNotFound"
    #: A claim mixes requests of other drivers with ours.
    MIXED_CLAIM = "MixedClaim"
    #: The pod's claims are allocated on different nodes.
    NODE_CONFLICT = "NodeConflict"


class EventReason(StrEnum):
    """The reasons of the events the failure handler records about a pod."""

    #: Warning: why the pod waits (its message is the condition's).
    FAILED_ALLOCATION = "FailedAllocation"
    #: Warning, once per pod and text: its input names a policy nobody knows.
    UNKNOWN_POLICY = "UnknownPolicy"
