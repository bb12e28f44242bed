"""The one small interface behind which GPU sources sit, and the factory that picks one.

Like dra-example-driver's device profiles, the kubelet plugin and ``hami-dra discover`` only ever
hold a :class:`DeviceSource`; they never ask whether it is NVML or simulated. The source is always
chosen explicitly (``--source nvml|simulated``): production never falls back to simulated GPUs
silently, because a node that advertises fake GPUs would attract real workloads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from dra_driver.devices.model import Gpu

SourceKind = Literal["nvml", "simulated"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("nvml", "simulated")


class DeviceSourceError(Exception):
    """Discovery failed in a way the user can fix; the message is one actionable line."""


class DriverNotReady(DeviceSourceError):
    """NVML cannot be loaded or initialised (yet): no driver root, no ``libnvidia-ml.so.1`` in it,
    or ``nvmlInit`` failing. The kubelet plugin waits on this one (``kubeletplugin/driver_wait.py``),
    because the GPU Operator installs the driver after the plugin's pod starts."""


@runtime_checkable
class DeviceSource(Protocol):
    """Anything that can list this node's GPUs."""

    def discover(self) -> list[Gpu]:
        """Return the node's GPUs sorted by index; raise :class:`DeviceSourceError` on failure."""
        ...


def open_source(
    kind: str,
    *,
    node_name: str,
    profile: str | None = None,
    gpus: int | None = None,
    devices_file: Path | None = None,
    driver_root: Path | None = None,
) -> DeviceSource:
    """Build the source the command line asked for, checking that the options fit together.

    ``simulated`` needs exactly one of ``profile`` (with an optional ``gpus`` count) or
    ``devices_file``; ``nvml`` takes neither, and loads NVML from ``driver_root`` when given (the
    host's driver root as mounted in the container; without it, from the loader's usual places).
    Errors are :class:`DeviceSourceError`.
    """
    if kind == "nvml":
        if profile is not None or gpus is not None or devices_file is not None:
            raise DeviceSourceError("--profile, --gpus and --devices-file only apply to --source simulated")
        from dra_driver.devices.nvml import NvmlSource

        if driver_root is not None:
            from dra_driver.devices.nvml_library import use_driver_root
            from dra_driver.devices.nvml_session import load_pynvml

            use_driver_root(driver_root, load_pynvml())
        return NvmlSource()
    if driver_root is not None:
        raise DeviceSourceError("--nvidia-driver-root only applies to --source nvml")
    if kind == "simulated":
        from dra_driver.devices.simulated import DevicesFileSource, SimulatedSource

        if devices_file is not None:
            if profile is not None or gpus is not None:
                raise DeviceSourceError("give either --devices-file or --profile/--gpus, not both")
            return DevicesFileSource(devices_file, node_name=node_name)
        if profile is None:
            raise DeviceSourceError(
                "--source simulated needs --profile NAME (with --gpus N) or --devices-file F"
            )
        return SimulatedSource(profile, node_name=node_name, gpus=gpus)
    raise DeviceSourceError(f"unknown device source {kind!r}; use one of: {', '.join(SOURCE_KINDS)}")
