"""Lease-based leader election (coordination.k8s.io/v1), like client-go's leaderelection.

A replica leads while it holds an unexpired Lease: it renews every ``retry_period`` and gives up
leadership itself when it could not renew within ``renew_deadline`` (before others may take over
after ``lease_duration``), so two replicas never both believe they lead. Every write to the Lease
carries its resourceVersion: of two candidates racing for an expired lease, exactly one wins.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_driver.kube.api import LEASES, KubeApi, Obj
from dra_driver.kube.errors import KubeError

log = logging.getLogger(__name__)


def _format(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Clock:
    """Where time comes from: the monotonic clock for our own deadlines, the wall clock for what
    the Lease records and other replicas compare with (a fake in tests, so races are stepped)."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        try:
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return 0.0


@dataclass(frozen=True, slots=True)
class LeaseSpec:
    """What election reads of a Lease's ``spec``: who holds it, and since when it was renewed."""

    #: ``holderIdentity``; None when nobody holds the Lease (absent or empty).
    holder: str | None
    #: ``renewTime`` as wall-clock seconds; 0 when absent or unreadable (long expired).
    renew_time: float
    #: ``leaseDurationSeconds``; None when absent or 0 (the reader's own duration applies).
    duration: float | None
    #: ``leaseTransitions``: how often the Lease changed hands.
    transitions: int = 0

    @classmethod
    def parse(cls, lease: Mapping[str, Any]) -> LeaseSpec:
        spec = lease.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        holder, seconds = spec.get("holderIdentity"), spec.get("leaseDurationSeconds")
        return cls(
            holder=str(holder) if holder else None,
            renew_time=_parse(spec.get("renewTime")),
            duration=float(seconds) if seconds else None,
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def expires(self, default_duration: float) -> float:
        """When the holder's term ends (wall clock), counted from its last renewal."""
        return self.renew_time + (default_duration if self.duration is None else self.duration)


def _edited_spec(lease: Mapping[str, Any], **fields: object) -> Obj:
    edited: Obj = copy.deepcopy(dict(lease))
    spec = edited.get("spec")
    edited["spec"] = {**(spec if isinstance(spec, Mapping) else {}), **fields}
    return edited


def renewed(lease: Mapping[str, Any], identity: str, duration: float, now: str) -> Obj:
    """The Lease held by ``identity`` for ``duration`` seconds from ``now``; taking it over from
    another holder (or from nobody) also records the acquisition and counts a transition."""
    spec = LeaseSpec.parse(lease)
    fields: dict[str, object] = {}
    if spec.holder != identity:
        fields = {"acquireTime": now, "leaseTransitions": spec.transitions + 1}
    return _edited_spec(
        lease, **fields, holderIdentity=identity, leaseDurationSeconds=int(duration), renewTime=now
    )


def released(lease: Mapping[str, Any]) -> Obj:
    """The Lease given up: no holder, and a 1 s duration, so the next candidate takes over at its
    next retry instead of waiting out our term."""
    return _edited_spec(lease, holderIdentity=None, leaseDurationSeconds=1)


class LeaderElector:
    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        identity: str,
        *,
        name: str = "hami-dra-controller",
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock or Clock()
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change
        self._leading = threading.Event()
        self._last_renew = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        if self._leading.is_set() and self.clock.monotonic() - self._last_renew > self.renew_deadline:
            self._set(False)
        return self._leading.is_set()

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        return self._leading.wait(timeout)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if release and self._leading.is_set():
            try:
                lease = self.kube.get(LEASES, self.namespace, self.name)
                if LeaseSpec.parse(lease).holder == self.identity:
                    self.kube.update(LEASES, released(lease))
            except KubeError as err:
                log.info("could not release lease: %s", err)
        self._set(False)

    def _set(self, leading: bool) -> None:
        if leading == self._leading.is_set():
            return
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        log.warning(
            "%s %s leadership of lease %s/%s",
            self.identity,
            "acquired" if leading else "lost",
            self.namespace,
            self.name,
        )
        if self.on_change is not None:
            self.on_change(leading)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.retry_period)

    def step(self) -> None:
        """One round: acquire or renew the Lease, then decide whether we still lead."""
        try:
            # The Lease records renewTime as of the request, and other replicas count its expiry
            # from there: so must we, or a slow renewal would stretch our leadership past it.
            sent = self.clock.monotonic()
            if self.try_acquire_or_renew():
                self._last_renew = sent
                self._set(self.clock.monotonic() - sent <= self.renew_deadline)
            else:
                self._set(False)
        except KubeError as err:
            log.info("leader election: %s", err)
        self.is_leader()  # drop leadership once the renew deadline passed without a renewal

    def try_acquire_or_renew(self) -> bool:
        now = _format(self.clock.wall())
        try:
            lease: Obj = self.kube.get(LEASES, self.namespace, self.name)
        except KubeError as err:
            if not err.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": int(self.lease_duration),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                self.kube.create(LEASES, self.namespace, body)
            except KubeError as create_err:
                if create_err.status == 409:
                    return False
                raise
            return True
        spec = LeaseSpec.parse(lease)
        if spec.holder not in (None, self.identity) and self.clock.wall() < spec.expires(self.lease_duration):
            return False  # another replica holds it, and its term has not run out
        try:
            self.kube.update(LEASES, renewed(lease, self.identity, self.lease_duration, now))
        except KubeError as err:
            if err.conflict:
                return False
            raise
        return True
