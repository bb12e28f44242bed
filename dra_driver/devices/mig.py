"""GPUs in MIG mode are not published: this driver does not allocate MIG instances yet.

A card with MIG enabled cannot run CUDA work as a whole GPU, and the NVIDIA Container Toolkit's
CDI spec names no full-GPU device for it, so offering it whole or as shares would only produce
pods that fail at start. Both sources (:mod:`dra_driver.devices.nvml` and the devices file of
:mod:`dra_driver.devices.simulated`) leave such cards out through :func:`without_mig` and say so in
the log; links to them are dropped from the other GPUs' NVLink peers, since nothing can be placed
on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from dra_driver.devices.model import Gpu

log = logging.getLogger(__name__)


def without_mig(gpus: Sequence[Gpu]) -> list[Gpu]:
    """``gpus`` without those whose MIG mode is enabled, each left out with a warning."""
    left_out = [gpu for gpu in gpus if gpu.mig_enabled]
    if not left_out:
        return list(gpus)
    for gpu in left_out:
        log.warning(
            "GPU %s (index %d, %s) is in MIG mode: not published, neither whole nor as shares",
            gpu.uuid, gpu.index, gpu.product_name,
        )  # fmt: skip
    log.warning(
        "MIG instances are not allocated by this driver yet; to offer %s, disable MIG on the node "
        "(nvidia-smi -i <index> -mig 0, then reset the GPU) and restart the plugin",
        "this GPU" if len(left_out) == 1 else f"these {len(left_out)} GPUs",
    )
    gone = {gpu.index for gpu in left_out}
    return [
        replace(gpu, nvlink_peers=tuple(peer for peer in gpu.nvlink_peers if peer[0] not in gone))
        for gpu in gpus
        if not gpu.mig_enabled
    ]
