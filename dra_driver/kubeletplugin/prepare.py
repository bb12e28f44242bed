"""NodePrepareResources / NodeUnprepareResources, independent of the gRPC API version.

One Preparer per plugin. Concurrency design:
- ``_lock`` guards the in-memory claim map; the capacity check and the insertion of the new
  ``PrepareStarted`` entry happen in one critical section, so two claims can never both pass the
  last-line-of-defence check for the same capacity;
- API reads, CDI writes and checkpoint fsyncs happen outside it;
- checkpoint writes are group-committed (``_persist``): a caller waits until a snapshot that
  includes its change is on disk, and one write serves every change made before it;
- calls for the same claim are serialised by a striped per-claim lock; a call holds the stripes
  of all its claims, taken in ascending order, so two calls never wait on each other in a cycle.

One checkpoint write per call. A NodePrepareResources call (kubelet sends all claims of a pod
for our driver in one) admits its claims in memory (capacity check), writes each claim's record
and CDI spec (neither fsynced: ``cdi.write_spec``, ``ClaimRecords``), and then writes the
``PrepareCompleted`` entries of all of them with ONE checkpoint write before it answers: one fsync
(the file, before its rename). A NodeUnprepareResources call removes its claims' files, then their
entries with one write of two fsyncs (the file and its directory, so that the removal survives a
power loss); ``_persist`` says why an addition's rename needs no fsync of its own.

Why no durable ``PrepareStarted`` before the side effects: what must survive a crash is the share
of every claim kubelet was told is prepared, and kubelet is told only after the write above. A
crash before it leaves files of claims that were never answered; they hold no share (the
checkpoint does not know them) and nobody uses them (kubelet passes CDI IDs to the runtime only
after a successful answer). kubelet itself checkpoints every claim *before* it calls
NodePrepareResources, so it either retries the prepare (which rewrites the same files, named by
the claim UID) or, when the pod is gone, calls NodeUnprepareResources, which removes them whether
or not an entry exists. An intent record of ours would only repeat kubelet's.

Only NodeUnprepareResources removes a prepared entry. A claim deleted from the API may still back
a running container (a tenant can strip the controller's finalizer and delete the claim of a
running pod; kubelet unprepares only when the pod ends), and the plugin cannot see pods, so it
cannot prove that a deleted claim is unused. kubelet can: it unprepares every claim of an ended
pod, also one deleted from the API and after its own restart, from its own checkpoint. Until
then the entry keeps its share in the capacity check; the periodic :meth:`Preparer.report_deleted`
only reports such entries (log and gauge).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_driver.devices.nvml_mig_create import MigCreateError
from dra_driver.kubeletplugin import cdi, failpoint
from dra_driver.kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimEntry,
    ClaimRecords,
    CorruptCheckpoint,
)
from dra_driver.kubeletplugin.claims import (
    AllocatedDevice,
    ClaimError,
    ClaimNotFound,
    ClaimRef,
    ClaimSource,
    devices_for_node,
    is_kubernetes_uid,
)
from dra_driver.kubeletplugin.container_edits import EditsConflict, intel_rdt_conflict, merge_edits
from dra_driver.kubeletplugin.defence import CapacityError, GpuUsage, check_fits, usage_by_gpu
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig, claim_edits
from dra_driver.kubeletplugin.inventory import Inventory, NodeGpu
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.mig_on_demand import MigOnDemand
from dra_driver.kubeletplugin.toolkit import GENERATE_HINT, ToolkitRegistry

LOG = logging.getLogger(__name__)

#: Appended to a capacity refusal: why the room is taken although the API may show it free.
CAPACITY_HINT = (
    "a prepared claim keeps its share until kubelet unprepares it when its pod ends, "
    "also after the claim was deleted from the API"
)

#: Test hook: when set to a phase name the process kills itself there (crash-consistency tests).
FAILPOINT_ENV = failpoint.FAILPOINT_ENV
#: The phases of a NodePrepareResources call where the hook can kill it, in order: the claims are
#: admitted in memory (nothing on disk), their records and CDI specs are written (no checkpoint
#: entry yet), their ``PrepareCompleted`` entries are durable (kubelet not answered yet).
FAILPOINTS = ("after-admission", "after-side-effects", "after-checkpoint")


def device_paths(gpu: NodeGpu) -> list[str]:
    """The device nodes a container needs for ``gpu``: the card's, and for a MIG device also its two
    ``/dev/nvidia-caps`` access capabilities (GPU instance, compute instance), which are what lets
    CUDA in the container open that MIG device and no other of the card."""
    paths = [f"/dev/nvidia{gpu.minor}"]
    if gpu.mig_caps is not None:
        paths += [f"/dev/nvidia-caps/nvidia-cap{cap}" for cap in gpu.mig_caps]
    return paths


@dataclass(frozen=True)
class PreparedDevice:
    """One entry of the per-claim device list kubelet gets back."""

    request_names: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str | None = None


@dataclass
class PrepareResult:
    """Result for one claim: devices, or an error message for kubelet."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class PreparerConfig:
    """Static settings of a Preparer."""

    driver: str
    pool: str
    cdi_dir: Path
    hami: HamiCoreConfig
    simulated: bool
    boot_id: str


@dataclass(frozen=True)
class _Admitted:
    """A claim of the current call that passed the capacity check and holds its room in memory."""

    ref: ClaimRef
    entry: ClaimEntry  # PrepareStarted, with the devices and CDI IDs it will answer
    spec: dict[str, Any]
    previous: ClaimEntry | None  # what the map held for the claim before (an earlier boot's entry)
    done: ClaimEntry  # the entry once prepared (PrepareCompleted): its record and checkpoint entry


def _write_error(ref: ClaimRef, err: OSError) -> str:
    return f"writing state for claim {ref}: {err}"


class Preparer:
    """Prepares and unprepares claims; owns the checkpoint and the per-claim CDI specs."""

    def __init__(
        self,
        config: PreparerConfig,
        inventory: Inventory,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        metrics: PluginMetrics | None = None,
        records: ClaimRecords | None = None,
        toolkit: ToolkitRegistry | None = None,
        mig: MigOnDemand | None = None,
    ) -> None:
        self.config = config
        #: Cards in MIG on demand: their placements' instances are created at prepare
        #: (``mig_on_demand.py``), destroyed at unprepare; None when the node has none.
        self.mig = mig
        #: Where real GPUs' edits come from (``toolkit.py``); None: device nodes only, no libraries.
        self.toolkit = toolkit
        self.inventory = inventory
        self.claims = claims
        self.checkpoint = checkpoint
        self.metrics = metrics
        self.records = records or ClaimRecords(checkpoint.path.parent / "prepared")
        self.names = cdi.CdiNames(config.driver)
        self._lock = threading.Lock()
        self._entries: dict[str, ClaimEntry] = {}  # entries are replaced, never mutated in place
        self._version = 0  # bumped on every change of _entries
        self._io_lock = threading.Lock()
        self._written_version = 0  # on disk, contents fsynced (guarded by _io_lock)
        self._durable_version = 0  # and its rename fsynced too (guarded by _io_lock)
        self._claim_locks = [threading.Lock() for _ in range(64)]
        self._usage_cache: tuple[int, int, dict[str, GpuUsage]] | None = None
        self._deleted: set[str] = set()  # prepared claims the API no longer has (guarded by _lock)

    def use_hami_core_library(self, library: Path | None) -> None:
        """Preload ``library`` (None: nothing) in the specs of claims prepared from now on; the
        plugin calls it when HAMi-core arrives, changes or goes while it runs."""
        self.config = replace(self.config, hami=replace(self.config.hami, library=library))

    # -- start-up ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the checkpoint; a corrupt one is quarantined and rebuilt from the claim records."""
        with self._lock:
            try:
                self._entries = self.checkpoint.load()
            except CorruptCheckpoint as err:
                moved = self.checkpoint.quarantine()
                LOG.error(
                    "corrupt checkpoint (%s); moved to %s, rebuilding from the claim records", err, moved
                )
                self._entries = self._rebuild_from_node()
                self.checkpoint.save(self._entries)
            self._backfill_records()
            stale = sum(1 for e in self._entries.values() if e.boot_id != self.config.boot_id)
            if stale:
                LOG.info("%d checkpoint entries are from an earlier boot; they will be re-prepared", stale)
        self._bind_gauges()

    def _rebuild_from_node(self) -> dict[str, ClaimEntry]:
        """Entries from the claim records; a record counts as prepared in this boot only with its spec.

        No API call: the API cannot describe a claim deleted while its pod runs (its entry must
        keep its share), and listing claims is a right the plugin does not have. The periodic
        :meth:`report_deleted` then reads each claim with ``get`` and reports the deleted ones.
        """
        entries = self.records.load_all()
        for uid, entry in entries.items():
            spec = self.config.cdi_dir / self.names.spec_file_name(uid)
            done = entry.boot_id == self.config.boot_id and spec.is_file()
            entries[uid] = replace(entry, state=PREPARE_COMPLETED if done else PREPARE_STARTED)
            LOG.info(
                "rebuilt checkpoint entry for claim %s/%s (%s) from its record: %s",
                entry.namespace, entry.name, uid, entries[uid].state,
            )  # fmt: skip
        for uid in self._spec_uids() - set(entries):
            LOG.error(
                "CDI spec of claim %s has no claim record (written by an older plugin version?): its "
                "share is not counted until kubelet unprepares it, which removes the spec",
                uid,
            )
        return entries

    def _spec_uids(self) -> set[str]:
        """Claim UIDs of our CDI spec files on the node."""
        if not self.config.cdi_dir.is_dir():
            return set()
        uids = (self.names.claim_uid(path.name) for path in self.config.cdi_dir.iterdir())
        return {uid for uid in uids if uid is not None}

    def _backfill_records(self) -> None:
        """Write the record of every entry that lacks one (entries prepared by an older version)."""
        for uid, entry in self._entries.items():
            if is_kubernetes_uid(uid) and not self.records.exists(uid):
                self.records.write(uid, entry)

    # -- prepare ----------------------------------------------------------------------------

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; failures are per claim and leave nothing behind.

        Answers are in kubelet's order, one per UID; the claims that need preparing share one
        checkpoint write (see the module docstring).
        """
        order: list[str] = []
        refused: dict[str, PrepareResult] = {}
        wanted: list[ClaimRef] = []
        for ref in refs:
            if ref.uid in order:
                continue  # kubelet named the claim twice: one answer per UID
            order.append(ref.uid)
            problem = ref.problem()
            if problem is not None:
                LOG.warning("prepare: refusing claim reference %s: %s", ref, problem)
                refused[ref.uid] = PrepareResult(error=f"invalid claim reference {ref}: {problem}")
            else:
                wanted.append(ref)
        prepared = self._prepare_all(wanted) if wanted else {}
        answers = {uid: refused[uid] if uid in refused else prepared[uid] for uid in order}
        if self.metrics is not None:
            for answer in answers.values():
                self.metrics.requests.labels("prepare").inc()
                if answer.error:
                    self.metrics.errors.labels("prepare").inc()
        return answers

    @contextlib.contextmanager
    def _claims_locked(self, claim_uids: list[str]) -> Iterator[None]:
        """Hold the stripes of ``claim_uids``, taken in ascending order (no lock-order cycles)."""
        stripes = sorted({hash(uid) % len(self._claim_locks) for uid in claim_uids})
        with contextlib.ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._claim_locks[stripe])
            yield

    def _cached(self, ref: ClaimRef) -> list[PreparedDevice] | None:
        """Result of an earlier prepare in this boot; re-creates a missing spec file from the entry."""
        with self._lock:
            entry = self._entries.get(ref.uid)
        if entry is None or entry.state != PREPARE_COMPLETED or entry.boot_id != self.config.boot_id:
            return None
        path = self.config.cdi_dir / self.names.spec_file_name(ref.uid)
        if not path.exists():
            # The spec is a pure function of the devices and the inventory: rebuild it (no API call).
            LOG.info("CDI spec of claim %s missing; writing it again", ref)
            resolved = self._resolve(ref, entry.devices)
            spec, _ = self._build_spec(ref.uid, resolved)
            self._write_side_effects(ref.uid, spec)
        return self._response(entry.devices, entry.cdi_ids)

    def _prepare_all(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Well-formed, distinct claims of one call: each one's errors are its own result."""
        results: dict[str, PrepareResult] = {}
        with self._claims_locked([ref.uid for ref in refs]):
            admitted: list[_Admitted] = []
            for ref in refs:
                try:
                    cached = self._cached(ref)
                    if cached is not None:
                        results[ref.uid] = PrepareResult(devices=cached)
                    else:
                        admitted.append(self._admit(ref))
                except ClaimError as err:
                    LOG.warning("prepare %s (%s) failed: %s", ref, ref.uid, err)
                    results[ref.uid] = PrepareResult(error=str(err))
                except OSError as err:
                    LOG.error("prepare %s (%s) failed: %s", ref, ref.uid, err)
                    results[ref.uid] = PrepareResult(error=_write_error(ref, err))
            if not admitted:
                return results
            failpoint.hit("after-admission")
            written = []
            for claim in admitted:
                try:
                    # The record before the spec: every spec of ours on the node has a record.
                    self.records.write(claim.ref.uid, claim.done)
                    self._write_side_effects(claim.ref.uid, claim.spec)
                    written.append(claim)
                except OSError as err:
                    LOG.error("prepare %s (%s) failed: %s", claim.ref, claim.ref.uid, err)
                    results[claim.ref.uid] = PrepareResult(error=_write_error(claim.ref, err))
                    self._withdraw(claim)
            if written:
                with self._lock:
                    for claim in written:
                        self._entries[claim.ref.uid] = claim.done
                    version = self._changed()
                failpoint.hit("after-side-effects")
                try:
                    self._persist(version, removal=False)  # the call's one write, before any answer
                except OSError as err:
                    LOG.error("prepare: writing the checkpoint failed: %s", err)
                    with self._lock:  # not durable: a retry prepares them again
                        for claim in written:
                            self._entries[claim.ref.uid] = claim.entry
                        self._changed()
                    for claim in written:
                        results[claim.ref.uid] = PrepareResult(error=_write_error(claim.ref, err))
                    written = []
                failpoint.hit("after-checkpoint")
            for claim in written:
                devices = self._response(claim.entry.devices, claim.entry.cdi_ids)
                results[claim.ref.uid] = PrepareResult(devices=devices)
        return results

    def _admit(self, ref: ClaimRef) -> _Admitted:
        """Read and check the claim, then take its room: a ``PrepareStarted`` entry, in memory only."""
        claim = self.claims.get(ref)
        devices = devices_for_node(claim, ref, self.config.driver, self.config.pool)
        try:
            resolved = self._resolve(ref, devices)
            spec, cdi_ids = self._build_spec(ref.uid, resolved)
            gpus = {g.name: g for g in self.inventory.all()}
            gpus.update({gpu.name: gpu for _, gpu in resolved})  # MIG on demand: not in the inventory
            entry = ClaimEntry(
                ref.namespace, ref.name, PREPARE_STARTED, self.config.boot_id, devices, cdi_ids
            )
            with self._lock:
                self._check_room(ref, resolved, gpus)
                previous = self._entries.get(ref.uid)
                self._entries[ref.uid] = entry
                self._changed()
        except Exception:
            self._release_mig(ref)  # a refused prepare leaves no instance behind
            raise
        return _Admitted(ref, entry, spec, previous, entry.completed())

    def _release_mig(self, ref: ClaimRef) -> None:
        """Destroy the MIG on demand instances of a claim whose prepare failed (logged, not raised)."""
        if self.mig is None:
            return
        try:
            self.mig.release(ref.uid)
        except Exception as err:
            LOG.error("prepare %s (%s): its MIG instances could not be destroyed: %s", ref, ref.uid, err)

    def _withdraw(self, claim: _Admitted) -> None:
        """Undo an admission whose files could not be written: its entry is what it was before."""
        self._release_mig(claim.ref)
        with self._lock:
            if claim.previous is None:
                self._entries.pop(claim.ref.uid, None)
            else:
                self._entries[claim.ref.uid] = claim.previous
            self._changed()

    def _check_room(
        self, ref: ClaimRef, resolved: list[tuple[AllocatedDevice, NodeGpu]], gpus: dict[str, NodeGpu]
    ) -> None:
        """check_fits against every other entry (caller holds ``_lock``); a refusal names the holders.

        Every entry counts, those of claims deleted from the API and of earlier boots too: only
        kubelet knows when their pods have ended, and it says so with NodeUnprepareResources.
        """
        # Only the GPUs the claim asks for are checked: the others' usage is not summed at all.
        wanted = {gpu.name for _, gpu in resolved}
        others = [
            (uid, d)
            for uid, e in self._entries.items()
            if uid != ref.uid
            for d in e.devices
            if d.device in wanted
        ]
        try:
            check_fits(ref.uid, resolved, others, gpus)
        except CapacityError as err:
            holders = [
                f"{e.namespace}/{e.name} ({uid}{', deleted from the API' if uid in self._deleted else ''})"
                for uid, e in sorted(self._entries.items())
                if uid != ref.uid and any(d.device in wanted for d in e.devices)
            ]
            LOG.warning(
                "prepare %s (%s) refused: %s; prepared there: %s", ref, ref.uid, err, ", ".join(holders)
            )
            raise CapacityError(f"{err} ({CAPACITY_HINT})") from err

    def _resolve(
        self, ref: ClaimRef, devices: list[AllocatedDevice]
    ) -> list[tuple[AllocatedDevice, NodeGpu]]:
        resolved = []
        for device in devices:
            gpu = self.inventory.get(device.device)
            if gpu is None and self.mig is not None and self.mig.owns(device.device):
                gpu = self.mig.ensure(ref.uid, device.device)  # creates the instance (intent first)
            if gpu is None:
                raise ClaimError(f"ResourceClaim {ref}: device {device.device} does not exist on this node")
            resolved.append((device, gpu))
        return resolved

    def _build_spec(
        self, claim_uid: str, resolved: list[tuple[AllocatedDevice, NodeGpu]]
    ) -> tuple[dict[str, Any], list[list[str]]]:
        """The claim's complete spec and, per result, the CDI IDs kubelet gets (ours only).

        Every ID names a device of this spec, so it resolves wherever the spec was written; what a
        real GPU needs besides (libraries, hooks, control nodes) is composed in from the toolkit's
        spec (``toolkit.py``) rather than referenced by a name that spec may not define.
        """
        common, gpu_edits = self._gpu_edits(resolved)
        cdi_devices: list[dict[str, Any]] = []
        cdi_ids: list[list[str]] = []
        for device, gpu in resolved:
            name = self.names.device_name(claim_uid, device.device, device.share_id)
            edits = merge_edits(gpu_edits[gpu.name], {"env": [f"HAMI_DRA_GPU_{gpu.index}_UUID={gpu.uuid}"]})
            if all(d["name"] != name for d in cdi_devices):
                cdi_devices.append({"name": name, "containerEdits": edits})
            cdi_ids.append([self.names.qualified(name)])
        try:
            common = merge_edits(common, claim_edits(claim_uid, resolved, self.config.hami))
        except EditsConflict as err:
            raise ClaimError(f"claim {claim_uid}: {err}") from err
        # The runtime keeps the last intelRdt it meets: settings that differ between the claim's
        # devices would be resolved silently, so such a claim is refused.
        conflict = intel_rdt_conflict([common, *(d["containerEdits"] for d in cdi_devices)])
        if conflict:
            raise ClaimError(f"claim {claim_uid}: the toolkit's edits of its GPUs differ: {conflict}")
        return cdi.make_spec(self.names.kind, cdi_devices, common), cdi_ids

    def _gpu_edits(
        self, resolved: list[tuple[AllocatedDevice, NodeGpu]]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Spec-level edits every GPU container needs, and each GPU's own edits by name."""
        gpus = {gpu.name: gpu for _, gpu in resolved}
        if self.config.simulated:
            # No GPU here: the host's /dev/null stands in, so a real runtime can start the container.
            stand_in = {
                name: {"deviceNodes": [{"path": path, "hostPath": "/dev/null"} for path in device_paths(gpu)]}
                for name, gpu in gpus.items()
            }
            control = [{"path": p, "hostPath": "/dev/null"} for p in ("/dev/nvidiactl", "/dev/nvidia-uvm")]
            return {"deviceNodes": control}, stand_in
        if self.toolkit is None:
            # Composition turned off by the admin: the device nodes alone, as the host names them.
            nodes: dict[str, dict[str, Any]] = {
                name: {"deviceNodes": [{"path": path} for path in device_paths(gpu)]}
                for name, gpu in gpus.items()
            }
            control = [{"path": p} for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")]
            return {"deviceNodes": control}, nodes
        toolkit, errors = self.toolkit.current()
        if toolkit is None:
            read = f" ({'; '.join(errors)})" if errors else ""
            raise ClaimError(f"no NVIDIA Container Toolkit CDI spec on this node{read}: {GENERATE_HINT}")
        edits: dict[str, dict[str, Any]] = {}
        for name, gpu in gpus.items():
            found = (
                toolkit.for_minor(gpu.minor)
                if gpu.mig_caps is None
                else toolkit.for_mig(gpu.minor, gpu.mig_caps)
            )
            if found is None:
                raise ClaimError(f"GPU {name} cannot be given to a container: {toolkit.problem(gpu.minor)}")
            edits[name] = found
        # Control nodes the spec lacks (nvidia-uvm loaded after it was generated) come from the host.
        completed = toolkit.control(sorted(gpu.minor for gpu in gpus.values()))
        if completed.problem is not None:
            names = ", ".join(sorted(gpus))
            raise ClaimError(f"GPU(s) {names} cannot be given to a container: {completed.problem}")
        return merge_edits(toolkit.common, completed.edits), edits

    def _write_side_effects(self, claim_uid: str, spec: dict[str, Any]) -> None:
        if spec.get("containerEdits", {}).get("mounts"):
            claim_dir = self.config.hami.claim_dir(claim_uid)
            claim_dir.mkdir(parents=True, exist_ok=True)
            claim_dir.chmod(0o777)  # processes of any UID in the container share the HAMi-core cache
        cdi.write_spec(self.config.cdi_dir / self.names.spec_file_name(claim_uid), spec)

    @staticmethod
    def _response(devices: list[AllocatedDevice], cdi_ids: list[list[str]]) -> list[PreparedDevice]:
        return [
            PreparedDevice([d.base_request], d.pool, d.device, list(ids), d.share_id)
            for d, ids in zip(devices, cdi_ids, strict=True)
        ]

    # -- unprepare --------------------------------------------------------------------------

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        """Undo prepare; unknown claims succeed. Returns an error message per claim UID ('' = ok).

        The claims of one call share one checkpoint write.
        """
        order: list[str] = []
        refused: dict[str, str] = {}
        wanted: list[ClaimRef] = []
        for ref in refs:
            if ref.uid in order:
                continue  # one answer per UID
            order.append(ref.uid)
            problem = ref.problem()
            if problem is not None:
                # Nothing of ours can be named by it: refuse, touch no file.
                LOG.warning("unprepare: refusing claim reference %s: %s", ref, problem)
                refused[ref.uid] = f"invalid claim reference {ref}: {problem}"
            else:
                wanted.append(ref)
        done = self._unprepare_all(wanted) if wanted else {}
        answers = {uid: refused[uid] if uid in refused else done[uid] for uid in order}
        if self.metrics is not None:
            for error in answers.values():
                self.metrics.requests.labels("unprepare").inc()
                if error:
                    self.metrics.errors.labels("unprepare").inc()
        return answers

    def _unprepare_all(self, refs: list[ClaimRef]) -> dict[str, str]:
        # Side effects first, then the entries: a crash in between leaves entries whose unprepare
        # is simply repeated, never a CDI spec that nothing remembers. The record goes last of
        # the files, so every spec on the node keeps one.
        results: dict[str, str] = {}
        with self._claims_locked([ref.uid for ref in refs]):
            cleared: list[ClaimRef] = []
            for ref in refs:
                try:
                    if self.mig is not None:
                        self.mig.release(ref.uid)  # raises while the instance cannot go: retried
                    cdi.remove_spec(self.config.cdi_dir / self.names.spec_file_name(ref.uid))
                    shutil.rmtree(self.config.hami.claim_dir(ref.uid), ignore_errors=True)
                    self.records.remove(ref.uid)
                    cleared.append(ref)
                except (OSError, MigCreateError) as err:
                    LOG.error("unprepare %s (%s) failed: %s", ref, ref.uid, err)
                    results[ref.uid] = f"removing state of claim {ref}: {err}"
            removed: dict[str, tuple[ClaimEntry, bool]] = {}
            with self._lock:
                for ref in cleared:
                    entry = self._entries.pop(ref.uid, None)
                    if entry is not None:
                        removed[ref.uid] = (entry, ref.uid in self._deleted)
                        self._deleted.discard(ref.uid)
                version = self._changed() if removed else 0
            try:
                if version:
                    self._persist(version, removal=True)  # the call's one durable write
            except OSError as err:
                LOG.error("unprepare: writing the checkpoint failed: %s", err)
                with self._lock:  # still on disk: keep them, kubelet repeats the unprepare
                    for uid, (entry, was_deleted) in removed.items():
                        self._entries.setdefault(uid, entry)
                        if was_deleted:
                            self._deleted.add(uid)
                    self._changed()
                for ref in cleared:
                    results[ref.uid] = f"removing state of claim {ref}: {err}"
                return results
        for ref in cleared:
            results[ref.uid] = ""
        for uid, (entry, was_deleted) in removed.items():
            if was_deleted:
                LOG.info(
                    "claim %s/%s (%s), deleted from the API earlier, is unprepared by kubelet: share freed",
                    entry.namespace, entry.name, uid,
                )  # fmt: skip
        return results

    def report_deleted(self) -> list[str]:
        """Report prepared claims that no longer exist in the API; never removes an entry.

        Such a claim may still back a running container (see the module docstring), so its entry
        keeps its share until kubelet unprepares it. Each one is logged once, when first seen (a
        deleted UID never comes back, so it is not read again), and counted by the
        ``hami_dra_kubelet_plugin_deleted_claims_prepared`` gauge. Returns the UIDs of all of them.
        """
        with self._lock:
            unchecked = [
                (uid, e.namespace, e.name) for uid, e in self._entries.items() if uid not in self._deleted
            ]
        found = [(uid, ns, name) for uid, ns, name in unchecked if self._is_deleted(uid, ns, name)]
        with self._lock:
            new = [(uid, ns, name) for uid, ns, name in found if uid in self._entries]  # not unprepared since
            # Logged before it is reported (deleted_claims, the gauge): whoever sees the UID there
            # finds the warning that explains it already in the log.
            for uid, namespace, name in new:
                LOG.warning(
                    "claim %s/%s (%s) no longer exists in the API but is still prepared on this node: its "
                    "pod may still run, so its share stays counted until kubelet unprepares it",
                    namespace, name, uid,
                )  # fmt: skip
            self._deleted.update(uid for uid, _, _ in new)
            return sorted(self._deleted)

    def _is_deleted(self, uid: str, namespace: str, name: str) -> bool:
        """True only when the API says the claim is gone (404 or another UID); errors say nothing."""
        if not is_kubernetes_uid(uid):
            LOG.warning("report: checkpoint entry %r (%s/%s) is not a Kubernetes UID", uid, namespace, name)
            return False
        try:
            return not self.claims.exists(namespace, name, uid)
        except ClaimError as err:
            LOG.debug("report: cannot check claim %s/%s: %s", namespace, name, err)
            return False

    # -- state ------------------------------------------------------------------------------

    def prepared(self) -> dict[str, ClaimEntry]:
        """A copy of the current entries (for tests, health and metrics)."""
        with self._lock:
            return dict(self._entries)

    def deleted_claims(self) -> set[str]:
        """UIDs of prepared claims :meth:`report_deleted` found deleted from the API, not yet unprepared."""
        with self._lock:
            return set(self._deleted)

    def _changed(self) -> int:
        """Record a change of ``_entries`` (caller holds ``_lock``); returns its version."""
        self._version += 1
        return self._version

    def _persist(self, version: int, *, removal: bool) -> None:
        """Return once a checkpoint containing change ``version`` is on disk (group commit).

        Every write fsyncs the file before the rename, so the checkpoint on disk is always whole.
        The rename is made durable (fsync of the directory) only for a change that ``removal``s
        entries: losing it to a power loss would bring back entries kubelet has unprepared and
        never unprepares again, shares lost for good. A lost rename of added entries costs
        nothing: a power loss ends every container, and kubelet, which does not keep across its
        restarts whether a claim was prepared, prepares every claim again after the reboot (and
        the entries of an earlier boot are not trusted anyway). A process crash sees either rename.
        """
        with self._io_lock:
            if self._durable_version >= version or (not removal and self._written_version >= version):
                return  # another caller's write already included our change
            if self._written_version < version:
                with self._lock:
                    snapshot, current = dict(self._entries), self._version
                self.checkpoint.save(snapshot, sync_directory=removal)
                self._written_version = current
                if removal:
                    self._durable_version = current
            else:  # written by a caller that did not need the rename durable: only that is left
                self.checkpoint.sync_directory()
                self._durable_version = self._written_version

    def _usage(self) -> tuple[int, dict[str, GpuUsage]]:
        """Prepared device count and per-GPU usage, computed once per version of ``_entries``.

        Gauges read this at scrape time instead of being recomputed on every change: the
        aggregation is O(prepared claims) and ran under ``_lock`` on every prepare/unprepare.
        """
        with self._lock:
            cached = self._usage_cache
            if cached is not None and cached[0] == self._version:
                return cached[1], cached[2]
            pairs = [(uid, d) for uid, e in self._entries.items() for d in e.devices]
            version = self._version
        usage = usage_by_gpu(pairs, {g.name: g for g in self.inventory.all()})
        with self._lock:
            self._usage_cache = (version, len(pairs), usage)
        return len(pairs), usage

    def _gpu_usage(self, name: str, attribute: str) -> float:
        used = self._usage()[1].get(name)
        return float(getattr(used, attribute)) if used is not None else 0.0

    def _bind_gauges(self) -> None:
        """Point the allocation gauges at :meth:`_usage` (evaluated when /metrics is scraped)."""
        if self.metrics is None:
            return
        self.metrics.prepared_devices.set_function(lambda: float(self._usage()[0]))
        self.metrics.deleted_claims.set_function(lambda: float(len(self.deleted_claims())))
        for gpu in self.inventory.all():
            self.metrics.gpu(self.metrics.prepared_memory, gpu.name).set_function(
                functools.partial(self._gpu_usage, gpu.name, "memory")
            )
            self.metrics.gpu(self.metrics.prepared_cores, gpu.name).set_function(
                functools.partial(self._gpu_usage, gpu.name, "cores")
            )


__all__ = ["ClaimNotFound", "PrepareResult", "PreparedDevice", "Preparer", "PreparerConfig"]
