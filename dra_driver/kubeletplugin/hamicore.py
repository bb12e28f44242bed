"""HAMi-core (libvgpu.so) container edits derived from a claim's consumed capacity.

Rules (how HAMi-core reads its limits inside the container):
- ``<i>`` in ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` is the CUDA ordinal inside the container: the claim's
  GPUs sorted by PCI bus id, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA agrees with that order;
- memory is ``<MiB>m`` (``Mi`` would be read as bytes, a leading zero as octal);
- cores only when 0 < cores < 100 (0 and >= 100 mean "unlimited" to HAMi-core);
- one cache file per claim, at a deterministic path so re-preparing gives the same spec;
- never ``CUDA_VISIBLE_DEVICES`` (it breaks HAMi-core's index mapping);
- a claim of whole GPUs only gets no HAMi-core edits at all, also where every result carries a
  shareID (our devices allow multiple allocations): a result that consumes all of a GPU's memory
  and cores is a whole GPU; in a claim that mixes shares and whole GPUs the whole GPUs get their
  full memory as the limit, because a preloaded libvgpu with no limit reports 0 bytes of memory;
- ``/tmp/vgpulock`` of the host is mounted with the library, as HAMi does: libvgpu up to v2.8.0
  serialises host-PID detection on a lock file there (without it v2.5.0 and older hang in cuInit);
- ``GPU_CORE_UTILIZATION_POLICY``: HAMi-core throttles a cores limit even on an idle GPU unless
  HAMi's node monitor switches it off; we run no monitor, so the default leaves HAMi-core's own
  behaviour (always throttle), ``force`` says so explicitly and ``disable`` turns throttling off
  (cores become a scheduling figure only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin.claims import AllocatedDevice, ClaimError, is_kubernetes_uid
from dra_driver.kubeletplugin.inventory import NodeGpu
from dra_driver.quantity import MIB
from dra_driver.resource.capacity import Capacity

log = logging.getLogger(__name__)

CONTAINER_VGPU_DIR = "/usr/local/vgpu"
#: The node-wide lock directory of libvgpu up to v2.8.0, shared by every container on the node.
VGPU_LOCK_DIR = "/tmp/vgpulock"
#: ``--core-utilization-policy`` -> HAMi-core's GPU_CORE_UTILIZATION_POLICY (None: not set).
UTILIZATION_POLICIES: dict[str, str | None] = {"default": None, "force": "FORCE", "disable": "DISABLE"}
CONTAINER_LIB = f"{CONTAINER_VGPU_DIR}/libvgpu.so"
PRELOAD_CONTENT = CONTAINER_LIB + "\n"


@dataclass(frozen=True)
class HamiCoreConfig:
    """Where HAMi-core artefacts live on the host; ``library`` None means "do not preload"."""

    state_dir: Path
    library: Path | None = None
    utilization_policy: str = "default"
    #: The host's lock directory (the chart mounts it at the same path, created by kubelet).
    lock_dir: Path = Path(VGPU_LOCK_DIR)

    def __post_init__(self) -> None:
        if self.utilization_policy not in UTILIZATION_POLICIES:
            raise ValueError(
                f"core utilization policy must be one of {', '.join(UTILIZATION_POLICIES)}, "
                f"got {self.utilization_policy!r}"
            )

    @property
    def preload_file(self) -> Path:
        return self.state_dir / "ld.so.preload"

    def claim_dir(self, claim_uid: str) -> Path:
        """``<state>/claims/<uid>``; refuses anything but a Kubernetes UID (it is removed recursively)."""
        if not is_kubernetes_uid(claim_uid):
            raise ValueError(
                f"refusing a HAMi-core claim directory for uid {claim_uid[:64]!r}: not a Kubernetes UID"
            )
        return self.state_dir / "claims" / claim_uid

    def ensure_preload_file(self) -> None:
        """Write the ld.so.preload that names libvgpu's container path, and make sure the lock
        directory that every share's spec mounts exists (idempotent): a missing host path would
        keep the runtime from starting the container."""
        try:
            self.lock_dir.mkdir(parents=True, exist_ok=True)
            self.lock_dir.chmod(0o777)  # processes of any UID in any container take the lock
        except OSError as err:
            # Only libvgpu up to v2.8.0 needs it, and those are refused anyway: say so, go on.
            log.warning("HAMi-core lock directory %s not prepared: %s", self.lock_dir, err)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self.preload_file.exists() or self.preload_file.read_text() != PRELOAD_CONTENT:
            tmp = self.preload_file.with_suffix(".tmp")
            tmp.write_text(PRELOAD_CONTENT)
            tmp.replace(self.preload_file)


@dataclass(frozen=True)
class GpuShare:
    """What one claim uses of one GPU (all its results on that GPU added up)."""

    gpu: NodeGpu
    memory_bytes: int
    cores: int
    shared: bool


def shares_by_gpu(devices: list[tuple[AllocatedDevice, NodeGpu]]) -> list[GpuShare]:
    """Group a claim's results per GPU, in CUDA ordinal order (PCI bus id).

    Amounts are what the results take by the consumable-capacity rule
    (``dra_driver/resource/capacity.py``), as the node's overcommit check and the controller count
    them, so the limit HAMi-core enforces is the share every other tenant of the card was told of.
    """
    grouped: dict[str, list[tuple[AllocatedDevice, NodeGpu]]] = {}
    for allocated, gpu in devices:
        if not allocated.admin_access:
            grouped.setdefault(gpu.name, []).append((allocated, gpu))
    shares = []
    for items in grouped.values():
        gpu = items[0][1]
        card = Capacity(gpu.memory_bytes, gpu.cores, gpu.slots)
        taken = [allocated.consumption.of(card) for allocated, _ in items]
        memory, cores = sum(t.memory for t in taken), sum(t.cores for t in taken)
        whole = any(a.exclusive for a, _ in items) or (memory >= gpu.memory_bytes and cores >= gpu.cores)
        if whole:
            shares.append(GpuShare(gpu, gpu.memory_bytes, 100, shared=False))
            continue
        shares.append(GpuShare(gpu, min(memory, gpu.memory_bytes), min(cores, 100), shared=True))
    return sorted(shares, key=lambda share: share.gpu.sort_key)


def memory_limit(value_bytes: int) -> str:
    """HAMi-core's memory syntax: whole MiB with suffix ``m`` (at least 1)."""
    return f"{max(1, value_bytes // MIB)}m"


def claim_edits(
    claim_uid: str, devices: list[tuple[AllocatedDevice, NodeGpu]], config: HamiCoreConfig
) -> dict[str, Any]:
    """Spec-level container edits for one claim (empty when it has whole GPUs only)."""
    shares = shares_by_gpu(devices)
    if not any(share.shared for share in shares):
        return {}
    empty = [share.gpu.name for share in shares if share.shared and share.memory_bytes == 0]
    if empty:
        # Only a hand-written allocation lists no memory (our slices' request policy defaults to
        # the whole card): every tenant of the card counts it as taking none.
        raise ClaimError(
            f"the claim's share of {', '.join(empty)} takes no memory (its consumedCapacity lists "
            "none), so HAMi-core could not let it allocate any: allocate it with a memory request "
            "(capacity.requests.memory) or without a shareID (the whole card)"
        )
    env = ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    for ordinal, share in enumerate(shares):
        env.append(f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}={memory_limit(share.memory_bytes)}")
        if share.shared and 0 < share.cores < 100:
            env.append(f"CUDA_DEVICE_SM_LIMIT_{ordinal}={share.cores}")
    policy = UTILIZATION_POLICIES[config.utilization_policy]
    if policy is not None and any(share.shared and 0 < share.cores < 100 for share in shares):
        env.append(f"GPU_CORE_UTILIZATION_POLICY={policy}")
    cache_dir = f"{CONTAINER_VGPU_DIR}/claims/{claim_uid}"
    env.append(f"CUDA_DEVICE_MEMORY_SHARED_CACHE={cache_dir}/cudevshr.cache")
    mounts: list[dict[str, Any]] = [
        {
            "hostPath": str(config.claim_dir(claim_uid)),
            "containerPath": cache_dir,
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]
    if config.library is not None:
        mounts += [
            {
                "hostPath": str(config.library),
                "containerPath": CONTAINER_LIB,
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": str(config.preload_file),
                "containerPath": "/etc/ld.so.preload",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": str(config.lock_dir),
                "containerPath": VGPU_LOCK_DIR,
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
        ]
    return {"env": env, "mounts": mounts}
