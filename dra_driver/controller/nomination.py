"""Nominations: the capacity held for a preemptor while its victims terminate, kept durably.

When the controller preempts for a pod (``preemptor.py``), the pod is *nominated* to the node:
what it would take there once its victims are gone (the devices and shares the planner chose) is
held in the ledger (``Ledger.hold``), so a pod of equal or lower priority planned meanwhile sees
that capacity as taken, while a pod of higher priority may take it (``hidden_for``), as
kube-scheduler treats nominated pods. The hold is released when the preemptor is placed
(anywhere), ends, is deleted, or stops waiting for our gate.

Nothing is lost on a crash: the nomination is written on the preemptor, as the annotation
``<driver>/nomination`` (node, devices and shares, victims, when), before any victim is evicted;
a restarted controller reads it back from the pods its informer lists (``observe``) and holds
the capacity again before its first plan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from dra_driver.contract import DeviceId
from dra_driver.controller.ledger import Ledger
from dra_driver.controller.slim import NOMINATION_SUFFIX
from dra_driver.resource.objects import PodView
from dra_driver.resource.uses import Use

log = logging.getLogger("dra_driver.controller")


def nomination_annotation(driver: str) -> str:
    """The preemptor's annotation that records its nomination (the informer keeps it)."""
    return f"{driver}{NOMINATION_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Nomination:
    """A preemptor's node, the uses held for it there, and the victims evicted for it."""

    node: str
    uses: tuple[Use, ...]
    victims: tuple[str, ...]
    at: str = ""

    def encode(self) -> str:
        uses = [
            {"pool": use.device.pool, "device": use.device.device, "memory": use.memory,
             "cores": use.cores, "slots": use.slots}
            for use in self.uses
        ]  # fmt: skip
        body = {"node": self.node, "devices": uses, "victims": list(self.victims), "at": self.at}
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, value: str, driver: str) -> Nomination:
        """The annotation's value read back; ValueError when it is not one we wrote."""
        try:
            body = json.loads(value)
            uses = tuple(
                Use(
                    DeviceId(driver, str(item["pool"]), str(item["device"])),
                    _amount(item.get("memory")),
                    _amount(item.get("cores")),
                    _amount(item.get("slots")),
                )
                for item in body["devices"]
            )
            victims = tuple(str(victim) for victim in body.get("victims") or ())
            return cls(str(body["node"]), uses, victims, str(body.get("at") or ""))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"unreadable nomination {value[:200]!r}: {err}") from None


def _amount(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"not an amount: {value!r}")
    return value


def hold_key(uid: str) -> str:
    """The ledger key of the hold of the pod with ``uid``."""
    return f"nominated/{uid}"


@dataclass(frozen=True, slots=True)
class _Held:
    uid: str
    priority: int
    nomination: Nomination


class Nominations:
    """The nominated pods (by key) and their holds in the ledger (worker thread only)."""

    def __init__(self, ledger: Ledger, driver: str) -> None:
        self.ledger = ledger
        self.annotation = nomination_annotation(driver)
        self.driver = driver
        self._held: dict[str, _Held] = {}
        #: Pods (by uid) placed since they were nominated: a copy of them that still carries the
        #: annotation and the gate (an informer event older than the gate's removal) holds nothing.
        self._placed: set[str] = set()
        #: Nodes whose held capacity was released since ``take_released`` (pods it kept out may
        #: fit there now).
        self.released: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._held

    def of(self, pod: PodView) -> Nomination | None:
        held = self._held.get(pod.key)
        return held.nomination if held is not None and held.uid == pod.uid else None

    def held(self) -> dict[str, Nomination]:
        """Pod key -> its nomination (explain, tests)."""
        return {key: held.nomination for key, held in self._held.items()}

    def hidden_for(self, pod: PodView) -> frozenset[str]:
        """The holds ``pod`` may take: its own and those of pods of lower priority (a pod of equal
        or higher priority keeps its hold against it)."""
        if not self._held:
            return frozenset()
        return frozenset(
            hold_key(held.uid)
            for held in self._held.values()
            if held.uid == pod.uid or held.priority < pod.priority
        )

    # --- changes -------------------------------------------------------------------------------
    def nominate(self, pod: PodView, nomination: Nomination) -> None:
        """Hold ``nomination``'s uses for ``pod`` (written on the pod already)."""
        self._placed.discard(pod.uid)
        self._set(pod, nomination)

    def placed(self, pod: PodView) -> None:
        """The pod was placed (on its node or another): its hold goes."""
        if pod.key in self._held:
            self._placed.add(pod.uid)
            log.info("pod %s placed: the capacity held for it is released", pod.key)
        self._drop(pod.key)

    def withdraw(self, pod: PodView) -> None:
        """No room can be made for the pod any more: its hold goes (its annotation was removed)."""
        self._drop(pod.key)

    def observe(self, key: str, pod: PodView | None) -> None:
        """The pod ``key`` as the cache now has it (None: gone): hold what its annotation records
        while it waits for our gate, else release it."""
        if pod is None:
            held = self._held.get(key)
            if held is not None:
                self._placed.discard(held.uid)
            self._drop(key)
            return
        waiting = pod.gated and pod.active and not pod.deleting and not pod.bound_to
        value = pod.annotations.get(self.annotation)
        if not waiting or value is None or pod.uid in self._placed:
            self._drop(key)
            return
        try:
            nomination = Nomination.decode(value, self.driver)
        except ValueError as err:
            log.warning("pod %s: %s; no capacity is held for it", key, err)
            self._drop(key)
            return
        self._set(pod, nomination)

    def take_released(self) -> set[str]:
        released, self.released = self.released, set()
        return released

    def forget(self, uids: Iterable[str]) -> None:
        """Pods that no longer exist: what was kept about them goes."""
        self._placed.difference_update(uids)

    def _set(self, pod: PodView, nomination: Nomination) -> None:
        previous = self._held.get(pod.key)
        if previous is not None and previous.uid != pod.uid:
            self.ledger.unhold(hold_key(previous.uid))
        self._held[pod.key] = _Held(pod.uid, pod.priority, nomination)
        self.ledger.hold(hold_key(pod.uid), nomination.uses)

    def _drop(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self.ledger.unhold(hold_key(held.uid))
            self.released.add(held.nomination.node)
