"""MIG on demand in the kubelet plugin: create the instance a claim was given, destroy it after.

A claim allocated a placement device of a card in MIG on demand (``gpu-0-mig-1g10gb-at-3``,
:mod:`dra_driver.devices.mig_on_demand`) needs that GPU instance and a compute instance spanning
it before its container can start. :meth:`MigOnDemand.ensure` makes them at prepare;
:meth:`MigOnDemand.release` destroys them at unprepare.

Crash safety. The instances outlive the plugin (they are the kernel driver's), so what the plugin
did must be on disk before it does it: a journal (``mig-on-demand.json`` next to the checkpoint,
written to a temporary file, fsynced, renamed, directory fsynced) gets an *intent* record
(``creating``: claim, card, profile, placement) before NVML is asked to create anything, and the
record becomes ``created`` (with the instance ids and the MIG UUID) once the instance exists. On
start, :meth:`MigOnDemand.reconcile` compares the journal with what NVML has:

* ``creating``: the plugin died between create and record. An instance at that placement is
  destroyed (nobody was told of it: the prepare never answered) and the intent dropped; kubelet
  retries the prepare, which creates it again.
* ``created`` but missing (GPU reset, reboot): created again at the same placement, which has the
  same GPU instance id and so the same ``/dev/nvidia-caps`` nodes; logged. If that fails the record
  stays and the failure is logged: the next prepare of the claim tries again.
* Instances the journal does not know are not this driver's (an admin's static instance on a card
  switched to on-demand): left alone; the publisher does not offer their slices.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dra_driver.devices.mig import MigDevice, mig_caps_minors
from dra_driver.devices.mig_on_demand import MigOnDemandError, parse_placement_device_name, placement_by_name
from dra_driver.devices.mig_profiles import mig_model
from dra_driver.devices.model import Gpu
from dra_driver.devices.nvml_mig_create import LiveInstance, MigCreateError, MigDriver
from dra_driver.kubeletplugin import failpoint
from dra_driver.kubeletplugin.claims import ClaimError
from dra_driver.kubeletplugin.inventory import NodeGpu, node_gpu

LOG = logging.getLogger(__name__)

JOURNAL_NAME = "mig-on-demand.json"
CREATING = "creating"
CREATED = "created"
#: Test hook (as ``prepare.FAILPOINT_ENV``): ``mig-after-create`` kills the process once the
#: instance exists and before its record says so, the window reconcile must close.
FAILPOINT_ENV = failpoint.FAILPOINT_ENV


@dataclass(frozen=True)
class InstanceRecord:
    """One instance this driver creates or created, by its placement device name."""

    claim: str
    parent_uuid: str
    profile_id: int
    slices: int
    start: int
    size: int
    state: str = CREATING
    gpu_instance: int | None = None
    compute_instance: int | None = None
    uuid: str = ""


class Journal:
    """The records, durable before anything acts on them (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, InstanceRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise MigOnDemandError(
                f"{self.path}: unreadable MIG on demand journal ({err}); move it away only after "
                "checking `nvidia-smi mig -lgi` for instances of this driver's claims"
            ) from err
        return {device: InstanceRecord(**fields) for device, fields in (raw.get("instances") or {}).items()}

    def save(self, records: Mapping[str, InstanceRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        data = json.dumps({"instances": {d: asdict(r) for d, r in sorted(records.items())}}, indent=1)
        with open(temporary, "w") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


@dataclass(frozen=True)
class CreatedInstance:
    """An instance this driver created that exists now, as metrics and ``top`` show it."""

    device: str
    uuid: str
    profile: str
    parent: str
    memory_bytes: int
    claim: str


@dataclass(frozen=True)
class ReconcileReport:
    """What :meth:`MigOnDemand.reconcile` did, for the log and the tests."""

    destroyed: tuple[str, ...] = ()
    recreated: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


class MigOnDemand:
    """The instances of this node's on-demand cards: created at prepare, destroyed at unprepare."""

    def __init__(
        self,
        gpus: Iterable[Gpu],
        driver: MigDriver,
        journal: Journal,
        mig_minors: Mapping[str, int] | None = None,
    ) -> None:
        self.cards = {gpu.name: gpu for gpu in gpus if gpu.mig_on_demand}
        self.driver = driver
        self.journal = journal
        self.mig_minors = dict(mig_minors or {})
        self._lock = threading.Lock()
        self._records = journal.load()
        #: Per card, the instances NVML has that the journal does not know (found by reconcile).
        self.foreign: dict[str, tuple[MigDevice, ...]] = {}

    def owns(self, device: str) -> bool:
        """Is ``device`` a placement of one of this node's on-demand cards?"""
        parsed = parse_placement_device_name(device)
        return parsed is not None and parsed[0] in self.cards

    def ours(self) -> set[str]:
        """MIG UUIDs of the instances this driver created (not foreign to the publisher)."""
        with self._lock:
            return {r.uuid for r in self._records.values() if r.uuid}

    def records(self) -> dict[str, InstanceRecord]:
        with self._lock:
            return dict(self._records)

    def created(self) -> list[CreatedInstance]:
        """The instances created for claims (an intent whose instance is not recorded yet is not
        one), by placement device name: what ``hami_dra_kubelet_plugin_mig_instance_memory_bytes``
        shows at each scrape."""
        with self._lock:
            records = sorted(self._records.items())
        found = []
        for device, record in records:
            parsed = parse_placement_device_name(device)
            gpu = self.cards.get(parsed[0]) if parsed else None
            if record.state != CREATED or gpu is None:
                continue
            try:
                placement = placement_by_name(gpu, device)
            except MigOnDemandError:
                continue  # a record of a card whose model changed: reconcile logs it
            found.append(
                CreatedInstance(
                    device,
                    record.uuid,
                    placement.profile.name,
                    gpu.name,
                    placement.memory_bytes,
                    record.claim,
                )
            )
        return found

    # -- prepare / unprepare ------------------------------------------------------------------

    def ensure(self, claim_uid: str, device: str) -> NodeGpu:
        """The instance of placement ``device`` for ``claim_uid``, created now unless it exists.

        Raises :class:`ClaimError` (the prepare of that claim fails, nothing is left behind) when
        another claim holds the placement or NVML refuses.
        """
        parsed = parse_placement_device_name(device)
        gpu = self.cards.get(parsed[0]) if parsed else None
        if gpu is None:
            raise ClaimError(f"device {device} is no MIG on demand placement of this node")
        try:
            placement = placement_by_name(gpu, device)
        except MigOnDemandError as err:
            raise ClaimError(str(err)) from err
        with self._lock:
            record = self._records.get(device)
            if record is not None and record.claim != claim_uid:
                raise ClaimError(
                    f"MIG placement {device} is held by claim {record.claim} ({record.state}); it is "
                    "given to one claim at a time"
                )
            if record is not None and record.state == CREATED and self._live(record) is not None:
                return self._node_gpu(gpu, device, record)
            intent = InstanceRecord(
                claim=claim_uid,
                parent_uuid=gpu.uuid,
                profile_id=placement.profile.profile_id,
                slices=placement.profile.slices,
                start=placement.start,
                size=placement.size,
            )
            self._records[device] = intent
            self.journal.save(self._records)  # the intent is durable before the instance exists
            try:
                live = self.driver.create(
                    gpu.uuid, intent.profile_id, intent.slices, intent.start, intent.size
                )
            except MigCreateError as err:
                del self._records[device]
                self.journal.save(self._records)
                raise ClaimError(f"MIG placement {device} could not be created: {err}") from err
            failpoint.hit("mig-after-create")
            created = self._created(intent, live)
            self._records[device] = created
            self.journal.save(self._records)
            LOG.info(
                "created MIG instance %s (%s at memory slice %d of %s, GPU instance %d) for claim %s",
                created.uuid, placement.profile.name, placement.start, gpu.name, live.gpu_instance, claim_uid,
            )  # fmt: skip
            return self._node_gpu(gpu, device, created)

    def release(self, claim_uid: str) -> list[str]:
        """Destroy the instances of ``claim_uid``; the placement device names released.

        Raises :class:`MigCreateError` when NVML cannot destroy one (a process still on it): the
        record stays, so the unprepare fails and kubelet retries it.
        """
        released = []
        with self._lock:
            for device, record in sorted(self._records.items()):
                if record.claim != claim_uid:
                    continue
                live = self._live(record)
                if live is not None:
                    self.driver.destroy(record.parent_uuid, live.gpu_instance)
                del self._records[device]
                self.journal.save(self._records)
                released.append(device)
                LOG.info("destroyed MIG instance %s (%s) of claim %s", record.uuid or "?", device, claim_uid)
        return released

    # -- start-up -----------------------------------------------------------------------------

    def reconcile(self) -> ReconcileReport:
        """Make NVML and the journal agree after a start (see the module docstring)."""
        destroyed, recreated, lost = [], [], []
        with self._lock:
            for device, record in sorted(self._records.items()):
                live = self._live(record)
                if record.state == CREATING:
                    if live is not None:
                        try:
                            self.driver.destroy(record.parent_uuid, live.gpu_instance)
                        except MigCreateError as err:
                            LOG.error("orphan MIG instance %s could not be destroyed: %s", device, err)
                            continue
                        destroyed.append(device)
                        LOG.warning(
                            "destroyed MIG instance at %s: created for claim %s by a plugin that stopped "
                            "before recording it (the prepare was never answered; kubelet retries it)",
                            device, record.claim,
                        )  # fmt: skip
                    del self._records[device]
                elif live is None:
                    try:
                        made = self.driver.create(
                            record.parent_uuid, record.profile_id, record.slices, record.start, record.size
                        )
                    except MigCreateError as err:
                        lost.append(device)
                        LOG.error(
                            "MIG instance %s of claim %s is gone (GPU reset or reboot?) and could not be "
                            "created again: %s; the claim's next prepare tries again",
                            device, record.claim, err,
                        )  # fmt: skip
                        continue
                    self._records[device] = self._created(record, made)
                    recreated.append(device)
                    LOG.warning(
                        "MIG instance %s of claim %s was gone (GPU reset or reboot?): created again as %s",
                        device, record.claim, self._records[device].uuid,
                    )  # fmt: skip
            self.journal.save(self._records)
            self.foreign = {name: self._foreign(gpu) for name, gpu in self.cards.items()}
        return ReconcileReport(tuple(destroyed), tuple(recreated), tuple(lost))

    def _foreign(self, gpu: Gpu) -> tuple[MigDevice, ...]:
        """Instances of ``gpu`` this driver did not create: their slices are not offered."""
        model = mig_model(gpu.product_name)
        known = {(r.start, r.size, r.profile_id) for r in self._records.values() if r.parent_uuid == gpu.uuid}
        found = []
        for live in self.driver.instances(gpu.uuid):
            if (live.start, live.size, live.profile_id) in known:
                continue
            profile = model.by_id(live.profile_id) if model else None
            ci, uuid = live.compute_instances[0] if live.compute_instances else (0, "")
            found.append(
                MigDevice(
                    uuid=uuid or f"{gpu.uuid}/gi{live.gpu_instance}",
                    profile=profile.name if profile else f"profile-{live.profile_id}",
                    gpu_instance=live.gpu_instance,
                    compute_instance=ci,
                    memory_bytes=(profile.memory_mib if profile else 1) << 20,
                    slices=profile.slices if profile else 1,
                    gpu_instance_slices=profile.slices if profile else 1,
                    placement_start=live.start,
                    placement_size=live.size,
                )
            )
        if found:
            LOG.warning(
                "GPU %s (MIG on demand) has %d instance(s) this driver did not create (%s): their memory "
                "slices are not offered; destroy them (nvidia-smi mig -dci / -dgi) and restart the plugin "
                "to offer the whole card",
                gpu.name, len(found), ", ".join(f"{m.profile}@{m.placement_start}" for m in found),
            )  # fmt: skip
        return tuple(sorted(found, key=lambda m: (m.gpu_instance, m.compute_instance)))

    # -- helpers ------------------------------------------------------------------------------

    def _live(self, record: InstanceRecord) -> LiveInstance | None:
        """The instance NVML has at the record's placement and profile, if any."""
        for live in self.driver.instances(record.parent_uuid):
            if (live.start, live.size, live.profile_id) == (record.start, record.size, record.profile_id):
                return live
        return None

    @staticmethod
    def _created(record: InstanceRecord, live: LiveInstance) -> InstanceRecord:
        ci, uuid = live.compute_instances[0] if live.compute_instances else (0, "")
        return replace(record, state=CREATED, gpu_instance=live.gpu_instance, compute_instance=ci, uuid=uuid)

    def _node_gpu(self, gpu: Gpu, device: str, record: InstanceRecord) -> NodeGpu:
        parent = node_gpu(gpu)
        gi, ci = record.gpu_instance or 0, record.compute_instance or 0
        gi_cap, ci_cap = mig_caps_minors(parent.minor, gi, ci)
        prefix = f"gpu{parent.minor}/gi{gi}"
        caps = (
            self.mig_minors.get(f"{prefix}/access", gi_cap),
            self.mig_minors.get(f"{prefix}/ci{ci}/access", ci_cap),
        )
        placement = placement_by_name(gpu, device)
        return replace(
            parent, name=device, uuid=record.uuid, memory_bytes=placement.memory_bytes, slots=1, mig_caps=caps
        )
