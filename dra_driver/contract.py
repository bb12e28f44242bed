"""The names and units the webhook, the controller and the kubelet plugin must agree on.

Each is written by one component and read by another (the gate the webhook adds and the
controller lifts, the finalizer the controller owns, the capacities the plugin publishes and the
controller consumes, the taint only the controller tolerates), so each is defined once, here.
The rest of the slices' vocabulary (device names ``gpu-<n>``, the other attribute names, the
capacities' request policies) and how a published device reads are defined once in
``dra_driver/resource/slices.py``; what an allocation result consumes, in
``dra_driver/resource/capacity.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.quantity import MIB

#: Scheduling gate the webhook puts on pods of our classes; the controller lifts it once placed.
GATE_NAME = "gpu.hami.io/allocation"
#: Finalizer the controller puts on claims it allocates, removed when it releases them.
FINALIZER = "gpu.hami.io/allocation"

#: Capacities every device publishes in its ResourceSlice and every allocation consumes.
MEMORY = "memory"  # bytes, in steps of 1Mi
CORES = "cores"  # percent of one GPU's compute
SLOTS = "slots"  # tenants
CAPACITY_NAMES = (MEMORY, CORES, SLOTS)
#: Capacity requests that make a claim's GPUs shares whose limits HAMi-core enforces per container.
LIMITED_CAPACITIES = (MEMORY, CORES)

#: Slice attribute saying whether a share's memory/cores limits are enforced on the GPU's node,
#: written by the kubelet plugin (is HAMi-core installed there?), read by the controller, which
#: by default gives GPUs of ``none`` only whole (``allowUnenforcedShares`` in a DeviceClass opts in).
ISOLATION_ATTRIBUTE = "isolation"
ISOLATION_HAMI_CORE = "hami-core"
ISOLATION_NONE = "none"
#: Simulated GPUs: no process runs on them, so there is nothing to enforce; shares are handed out.
ISOLATION_SIMULATED = "simulated"
ISOLATION_VALUES = (ISOLATION_HAMI_CORE, ISOLATION_NONE, ISOLATION_SIMULATED)
#: The isolation values under which a DeviceClass hands out shares without opting in.
SHARES_ENFORCED = frozenset({ISOLATION_HAMI_CORE, ISOLATION_SIMULATED})
#: Slice attribute: the HAMi-core version enforcing shares on the node (a semantic version).
HAMI_CORE_VERSION_ATTRIBUTE = "hamiCoreVersion"


class DeviceId(NamedTuple):
    """A device as DRA names it, in its ResourceSlice and in every allocation result.

    The one identity a GPU has from the slice the plugin publishes to the controller's ledger,
    quota charges and the allocation it writes; the engine's ``(node, card index)`` is mapped to
    it in one place (``controller/inventory.py``, ``NodeInventory.device_at``).
    """

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.pool}/{self.device}"


def policy_taint_key(driver_name: str = DEFAULT_DRIVER_NAME) -> str:
    """Key of the taint that keeps kube-scheduler's first-fit allocator off our GPUs."""
    return f"{driver_name}/policy-managed"


#: A DeviceClass selector no device satisfies, which our controller skips (config/classes.py):
#: the chart puts it on every class, so kube-scheduler's first fit, which evaluates class selectors
#: only for claims it allocates itself, finds no device for a claim of ours on any version (the
#: policy taint needs device taints, 1.36+ or a feature gate), while a claim our controller has
#: allocated is scheduled as usual (kube-scheduler does not re-check an allocation's selectors).
SCHEDULER_FENCE = '"allocated by the hami-dra controller, never by kube-scheduler" == ""'


def unhealthy_taint_key(driver_name: str = DEFAULT_DRIVER_NAME) -> str:
    """Key of the taint on GPUs that failed their health check."""
    return f"{driver_name}/unhealthy"


__all__ = [
    "CAPACITY_NAMES",
    "CORES",
    "FINALIZER",
    "GATE_NAME",
    "MEMORY",
    "MIB",
    "SLOTS",
    "DeviceId",
    "policy_taint_key",
    "unhealthy_taint_key",
]

#: The Pod condition the controller writes: "False" with the reason while a pod waits, "True"
#: once its claims are allocated (``kubectl describe pod``, ``hami-dra top`` and ``explain`` read it).
ALLOCATED_CONDITION = "gpu.hami.io/Allocated"
