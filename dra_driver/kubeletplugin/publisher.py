"""Keeps this node's ResourceSlice pool in the API server equal to what the node has.

- Re-creates slices when they disappear (kubelet deletes a node's slices at start-up, and after
  the plugin has been deregistered for 30 s).
- On a change (device list, health) bumps the pool generation and updates every slice; obsolete
  slices are deleted *before* the updates so a consumer never sees two complete generations.
- Writes only when the content changed: the hash of what we wrote is kept in an annotation,
  because the API server normalises quantities and a field-by-field compare would flap.
- A device taint keeps the ``timeAdded`` the API server gave it first, across updates and
  re-creations: the server stamps "now" on any taint sent without one, and a ``NoExecute``
  toleration's ``tolerationSeconds`` counts from that time, so a republish must not restart it.
- Feature gates: if the API server dropped ``allowMultipleAllocations``/``requestPolicy`` from what
  we wrote, consumable capacity is off (``DRAConsumableCapacity``): log one warning saying how to
  turn it on. If it dropped device taints, fall back to the plain ``healthy`` attribute. If it
  dropped ``sharedCounters``/``consumesCounters`` (``DRAPartitionableDevices`` off, as by default on
  1.34/1.35), cards marked for MIG on demand fall back to static MIG (their existing instances)
  and one warning says so; where counter sets may sit follows the server's version
  (:func:`~dra_driver.resource.mig_on_demand_slices.layout_for`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from dra_driver.devices.model import Gpu
from dra_driver.kube.api import Kube
from dra_driver.kubeletplugin.node import NodeReader
from dra_driver.resource.mig_on_demand_slices import layout_for
from dra_driver.resource.slice_builder import build_resource_slices
from dra_driver.resource.slices import slice_devices, slice_place

LOG = logging.getLogger(__name__)

HASH_ANNOTATION = "gpu.hami.io/content-hash"


def _content_hash(slice_: dict[str, Any]) -> str:
    spec = dict(slice_["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


#: A taint of one device, as the publisher remembers when it was added: (device, key, value, effect).
TaintKey = tuple[str, str, str, str]


def _device_taints(slices: list[dict[str, Any]]) -> list[tuple[TaintKey, dict[str, Any]]]:
    return [
        (
            (
                device.get("name") or "",
                taint.get("key") or "",
                taint.get("value") or "",
                taint.get("effect") or "",
            ),
            taint,
        )
        for slice_ in slices
        for device in slice_devices(slice_)
        for taint in device.get("taints") or ()
    ]


def _generation(slice_: dict[str, Any]) -> int:
    place = slice_place(slice_)
    return place.generation if place is not None else 0


class SlicePublisher:
    """Publishes the pool of ``node_name``; call :meth:`sync` after any change, or :meth:`start`."""

    def __init__(
        self,
        api_client: Any,
        *,
        driver_name: str,
        node_name: str,
        gpus: Callable[[], list[Gpu]],
        policy_taint: bool = True,
        resync_seconds: float = 30.0,
        node_uid: Callable[[], str | None] | None = None,
    ) -> None:
        from kubernetes import client

        self._api: Any = client.ResourceV1Api(api_client)
        self._version_api: Any = client.VersionApi(api_client)
        #: The Node's UID for the slices' owner reference (the plugin shares its NodeReader).
        self._node_uid = node_uid or NodeReader(Kube(api_client), node_name).uid
        self._exception = client.exceptions.ApiException
        self.driver_name = driver_name
        self.node_name = node_name
        self._gpus = gpus
        self.policy_taint = policy_taint
        self.taints_supported = True
        self.consumable_capacity_supported = True
        #: False once the API server dropped counters: on-demand MIG cards publish as static MIG.
        self.partitionable_supported = True
        self._layout: str | None = None
        self.resync_seconds = resync_seconds
        self._generation = 0
        #: When each taint we publish was first stored (the server's ``timeAdded``), kept across
        #: republishes; a taint no longer published is forgotten at the next write.
        self._taint_times: dict[TaintKey, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: Set once the API holds this node's slices as desired (the plugin's readiness).
        self.published = threading.Event()

    # -- reconcile --------------------------------------------------------------------------

    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"

    def _existing(self) -> list[dict[str, Any]]:
        response = self._api.list_resource_slice(field_selector=self._selector(), _preload_content=False)
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return [s for s in items if getattr(slice_place(s), "driver", None) == self.driver_name]

    def mig_on_demand_layout(self, gpus: list[Gpu]) -> str | None:
        """Where counter sets go for this API server, or None (no on-demand card, or not served)."""
        if not self.partitionable_supported or not any(gpu.mig_on_demand for gpu in gpus):
            return None
        if self._layout is None:
            info = self._version_api.get_code()
            minor = int("".join(ch for ch in str(info.minor) if ch.isdigit()) or "0")
            self._layout = layout_for(minor)
            LOG.info("API server 1.%d: MIG on demand publishes counters in layout %s", minor, self._layout)
        return self._layout

    def desired(self, generation: int) -> list[dict[str, Any]]:
        gpus = self._gpus()
        slices = build_resource_slices(
            gpus,
            driver_name=self.driver_name,
            node_name=self.node_name,
            generation=generation,
            node_uid=self._node_uid(),
            policy_taint=self.policy_taint and self.taints_supported,
            taint_unhealthy=self.taints_supported,
            mig_on_demand_layout=self.mig_on_demand_layout(gpus),
        )
        for slice_ in slices:
            slice_["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = _content_hash(slice_)
        return slices

    def sync(self) -> bool:
        """Make the API match; True if anything was written."""
        with self._lock:
            existing = {s["metadata"]["name"]: s for s in self._existing()}
            self._remember_taint_times(list(existing.values()))
            generations = {name: _generation(s) for name, s in existing.items()}
            current_generation = max([*generations.values(), self._generation])
            desired = self.desired(current_generation)
            unchanged = len(existing) == len(desired) and all(
                (existing.get(s["metadata"]["name"]) or {})
                .get("metadata", {})
                .get("annotations", {})
                .get(HASH_ANNOTATION)
                == s["metadata"]["annotations"][HASH_ANNOTATION]
                and generations[s["metadata"]["name"]] == current_generation
                for s in desired
            )
            if unchanged and existing:
                return False
            generation = current_generation + 1 if existing else max(current_generation, 1)
            desired = self.desired(generation)
            self._keep_taint_times(desired)
            self._generation = generation
            wanted = {s["metadata"]["name"] for s in desired}
            for name, old in existing.items():  # obsolete slices first
                if name not in wanted:
                    self._delete(name, old)
            written = []
            for slice_ in desired:
                name = slice_["metadata"]["name"]
                if name in existing:
                    slice_["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                    written.append(self._call(self._api.replace_resource_slice, name, slice_))
                else:
                    written.append(self._call(self._api.create_resource_slice, slice_))
            LOG.info(
                "published %d ResourceSlice(s) of pool %s, generation %d",
                len(desired),
                self.node_name,
                generation,
            )
            self._check_feature_gates(desired, written)
            self._taint_times = {}
            self._remember_taint_times(written)
            return True

    def _remember_taint_times(self, stored: list[dict[str, Any]]) -> None:
        for key, taint in _device_taints(stored):
            if taint.get("timeAdded"):
                self._taint_times[key] = taint["timeAdded"]  # what the server holds wins

    def _keep_taint_times(self, desired: list[dict[str, Any]]) -> None:
        """Send each taint with the time it was first stored (after the content hash, which a
        time must not change); a new taint goes without one and the server stamps it."""
        for key, taint in _device_taints(desired):
            if key in self._taint_times:
                taint["timeAdded"] = self._taint_times[key]

    def _call(self, method: Callable[..., Any], *args: Any) -> dict[str, Any]:
        response = method(*args, _preload_content=False)
        data: dict[str, Any] = json.loads(response.data)
        return data

    def _delete(self, name: str, old: dict[str, Any]) -> None:
        from kubernetes import client

        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(
                uid=old["metadata"].get("uid"), resource_version=old["metadata"].get("resourceVersion")
            )
        )
        try:
            self._api.delete_resource_slice(name, body=body, _preload_content=False)
        except self._exception as err:
            if err.status != 404:
                raise

    def _check_feature_gates(self, sent: list[dict[str, Any]], stored: list[dict[str, Any]]) -> None:
        sent_devices = [d for s in sent for d in slice_devices(s)]
        stored_devices = [d for s in stored for d in slice_devices(s)]
        wanted_multi = any(d.get("allowMultipleAllocations") for d in sent_devices)
        got_multi = any(d.get("allowMultipleAllocations") for d in stored_devices)
        if wanted_multi and not got_multi and self.consumable_capacity_supported:
            self.consumable_capacity_supported = False
            LOG.warning(
                "the API server dropped allowMultipleAllocations/requestPolicy from our ResourceSlices: "
                "the DRAConsumableCapacity feature gate is off, so GPUs can only be allocated exclusively. "
                "Enable it with --feature-gates=DRAConsumableCapacity=true on kube-apiserver, "
                "kube-scheduler, kube-controller-manager and kubelet (alpha in 1.34/1.35, on from 1.36)."
            )
        wanted_taints = any(d.get("taints") for d in sent_devices)
        got_taints = any(d.get("taints") for d in stored_devices)
        if wanted_taints and not got_taints and self.taints_supported:
            self.taints_supported = False
            LOG.warning(
                "the API server dropped device taints (DRADeviceTaints gate off): unhealthy GPUs are "
                "marked only by the attribute healthy=false"
            )
            self._wake.set()
        wanted_counters = any((s.get("spec") or {}).get("sharedCounters") for s in sent)
        got_counters = any((s.get("spec") or {}).get("sharedCounters") for s in stored) and any(
            d.get("consumesCounters") for d in stored_devices
        )
        if wanted_counters and not got_counters and self.partitionable_supported:
            self.partitionable_supported = False
            LOG.warning(
                "the API server dropped sharedCounters/consumesCounters from our ResourceSlices: the "
                "DRAPartitionableDevices feature gate is off, so cards marked for MIG on demand are "
                "published as static MIG (their existing instances only; none is created on demand). "
                "Enable it with --feature-gates=DRAPartitionableDevices=true on kube-apiserver, "
                "kube-scheduler, kube-controller-manager and kubelet (alpha in 1.34/1.35, on from 1.36)."
            )
            self._wake.set()

    # -- loop -------------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask the loop to sync soon (health change, device change)."""
        self._wake.set()

    def _watch_deletions(self) -> None:
        """Wake the loop on any change to our slices made by someone else (e.g. kubelet's delete)."""
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                # List first and watch from that resourceVersion: a deletion before the list is
                # caught by the sync we trigger here, one after it arrives as an event.
                listed = self._api.list_resource_slice(
                    field_selector=self._selector(), _preload_content=False
                )
                version = json.loads(listed.data).get("metadata", {}).get("resourceVersion")
                self._wake.set()
                watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
                stream = watcher.stream(
                    self._api.list_resource_slice,
                    field_selector=self._selector(),
                    resource_version=version,
                    timeout_seconds=30,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    if event.get("type") in ("DELETED", "MODIFIED"):
                        self._wake.set()
            except Exception as err:  # watch errors: back off and re-establish
                LOG.debug("ResourceSlice watch ended: %s", err)
                self._stop.wait(1.0)

    def run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self.sync()
                self.published.set()
                backoff = 1.0
                self._wake.wait(self.resync_seconds)
            except Exception as err:
                LOG.error("publishing ResourceSlices failed (retrying in %.0fs): %s", backoff, err)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            self._wake.clear()

    def start(self) -> None:
        threading.Thread(target=self.run, name="slice-publisher", daemon=True).start()
        threading.Thread(target=self._watch_deletions, name="slice-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
