"""GPUs this node has but must not publish, and why: a pod placed on them could not start, or the
same GPU would be booked twice.

Two causes, both of the node rather than of a claim, so the plugin checks them at start-up and
again every few seconds (``plugin.py``) and publishes a GPU again as soon as its cause is gone:

- **no CDI path**: the NVIDIA Container Toolkit's spec does not define the GPU, or names host files
  that are gone (``toolkit.py``). Publishing it would let pods be scheduled that fail at container
  start with "unresolvable CDI devices"; withheld, they stay pending and the reason is on the Node.
- **no control device node**: neither the spec nor the host has ``/dev/nvidiactl`` or
  ``/dev/nvidia-uvm`` (``control_nodes.py``): containers would start and ``cuInit`` fail in them.
- **NVIDIA's device plugin on the same node**: it advertises ``nvidia.com/gpu`` in the Node's
  allocatable and hands the same GPUs to pods that never asked us. Until the admin moves the
  node over (``README.md``, "Migrating from NVIDIA's device plugin") nothing is published, unless
  the admin says the two use different GPUs (``--allow-device-plugin``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_driver.kubeletplugin.inventory import NodeGpu
from dra_driver.kubeletplugin.toolkit import GENERATE_HINT, ToolkitEdits
from dra_driver.quantity import floor_quantity

#: The extended resource NVIDIA's device plugin (and the GPU Operator's) advertises.
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"

NO_CDI_SPEC = "NvidiaCdiSpecMissing"
NO_CONTROL_NODES = "NvidiaControlNodesMissing"
DEVICE_PLUGIN = "NvidiaDevicePluginPresent"

MIGRATE_HINT = (
    "move the node over: stop NVIDIA's device plugin there (GPU Operator: label the node "
    "nvidia.com/gpu.deploy.device-plugin=false; a plain DaemonSet: exclude the node by its "
    "nodeSelector or affinity) and let its pods end; the GPUs are published once the node's "
    "allocatable has no nvidia.com/gpu, or run the plugin with --allow-device-plugin "
    "(kubeletPlugin.allowDevicePlugin) if the two use different GPUs"
)


@dataclass(frozen=True)
class Withheld:
    """Why one GPU is not published: a CamelCase reason (events, metrics) and a message for people."""

    reason: str
    message: str


def cdi_withheld(
    gpus: Iterable[NodeGpu], toolkit: ToolkitEdits | None, errors: list[str]
) -> dict[str, Withheld]:
    """The GPUs the toolkit's spec cannot inject, by name."""
    gpus = list(gpus)
    if toolkit is None:
        read = f" ({'; '.join(errors)})" if errors else ""
        message = f"no NVIDIA Container Toolkit CDI spec in the node's CDI dirs{read}: {GENERATE_HINT}"
        return {gpu.name: Withheld(NO_CDI_SPEC, message) for gpu in gpus}
    withheld = {}
    for gpu in gpus:
        if gpu.mig_caps is None:
            problem = toolkit.problem(gpu.minor)
        else:
            problem = toolkit.mig_problem(gpu.minor, gpu.mig_caps)
        if problem is not None:
            withheld[gpu.name] = Withheld(NO_CDI_SPEC, f"{problem}: {GENERATE_HINT}")
            continue
        control = toolkit.control([gpu.minor]).problem
        if control is not None:
            withheld[gpu.name] = Withheld(NO_CONTROL_NODES, control)
    return withheld


def device_plugin_gpus(allocatable: Mapping[str, str] | None) -> int:
    """How many ``nvidia.com/gpu`` the Node's allocatable holds (0 when absent or unparsable)."""
    return floor_quantity((allocatable or {}).get(DEVICE_PLUGIN_RESOURCE)) or 0


def device_plugin_withheld(gpus: Iterable[NodeGpu], advertised: int) -> dict[str, Withheld]:
    """Every GPU, while NVIDIA's device plugin advertises any on the node."""
    if advertised <= 0:
        return {}
    message = (
        f"NVIDIA's device plugin advertises {advertised} {DEVICE_PLUGIN_RESOURCE} on this node, so "
        f"publishing its GPUs would book them twice; {MIGRATE_HINT}"
    )
    return {gpu.name: Withheld(DEVICE_PLUGIN, message) for gpu in gpus}
