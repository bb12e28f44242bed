"""What the controller assumes about the claims it writes: the one owner of that state.

Between planning a claim and the informer showing the result, the controller knows more than its
cache (kube-scheduler keeps the same in its assume cache):

* **in flight**: the allocation is being written; the ledger already counts the planned uses, so
  the next pod is planned with them, and events of our own intermediate writes (the finalizer
  update) must not replace them;
* **written**: the object our write returned (or the API's copy after a failed write), newer than
  the cache until the watch catches up, or until ``ASSUME_SECONDS`` pass (a watch that missed
  the event must not pin an old view forever);
* neither: the informer's copy is the truth.

Every change of those states also sets what the ledger counts for the claim, so the two cannot
drift apart. Not owned here: the planner's tentative placements while it compares nodes
(``Planner.plan`` undoes them itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.controller.kube import Obj
from dra_driver.controller.ledger import Ledger, Use, claim_uses

ASSUME_SECONDS = 30.0


def claim_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid"))


def caught_up(cached: Mapping[str, Any], assumed: Mapping[str, Any]) -> bool:
    """Whether the cache has caught up with what we wrote (resourceVersions compared as numbers,
    as etcd issues them; opaque ones only by equality)."""
    left = str((cached.get("metadata") or {}).get("resourceVersion", ""))
    right = str((assumed.get("metadata") or {}).get("resourceVersion", ""))
    if left.isdigit() and right.isdigit():
        return int(left) >= int(right)
    return left == right


class ClaimAssumptions:
    def __init__(self, ledger: Ledger, driver: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._driver = driver
        self._clock = clock
        self._in_flight: set[str] = set()
        self._written: dict[str, tuple[float, Obj]] = {}  # claim key -> (when, object we wrote)

    # --- in flight -------------------------------------------------------------------------------
    def begin_write(self, claim: Mapping[str, Any], uses: tuple[Use, ...]) -> None:
        """The claim's allocation is about to be written: count its planned uses from now on."""
        self._ledger.set_claim(_uid(claim), uses)
        self._in_flight.add(claim_key(claim))

    def writing(self, key: str) -> bool:
        return key in self._in_flight

    @property
    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def end_write(self, claim: Mapping[str, Any]) -> None:
        """The write is over (either way); what it produced is recorded separately."""
        self._in_flight.discard(claim_key(claim))

    # --- written ---------------------------------------------------------------------------------
    def wrote(self, claim: Obj) -> None:
        """``claim`` is what the API holds after our write: assume it until the cache catches up."""
        self._written[claim_key(claim)] = (self._clock(), claim)
        self._ledger.set_claim(_uid(claim), claim_uses(claim, self._driver))

    def effective(self, key: str, cached: Obj | None) -> Obj | None:
        """The claim as the controller should see it: our written copy while the cache lags."""
        entry = self._written.get(key)
        if entry is None:
            return cached
        when, assumed = entry
        replaced = cached is not None and _uid(cached) != _uid(assumed)  # a new object, same name
        if (
            replaced
            or (cached is not None and caught_up(cached, assumed))
            or self._clock() - when > ASSUME_SECONDS
        ):
            del self._written[key]
            return cached
        return assumed

    def is_assumed(self, key: str) -> bool:
        return key in self._written

    # --- informer events -------------------------------------------------------------------------
    def observed(self, new: Obj, cached: Obj | None) -> None:
        """An informer event for ``new``: count the effective view, unless a write is in flight."""
        key = claim_key(new)
        if key in self._in_flight:
            return
        effective = self.effective(key, cached) or new
        self._ledger.set_claim(_uid(effective), claim_uses(effective, self._driver))

    def gone(self, claim: Mapping[str, Any]) -> None:
        """The claim was deleted (or a write found it gone): nothing is counted or assumed for it."""
        self._written.pop(claim_key(claim), None)
        self._ledger.remove_claim(_uid(claim))

    def forget(self, key: str) -> None:
        """Drop what was assumed about the claim, keeping what the ledger counts."""
        self._written.pop(key, None)
