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
(``Ledger.trial`` undoes them when the attempt ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.controller.ledger import Ledger
from dra_driver.resource.objects import ClaimView, ObjectView
from dra_driver.resource.uses import Use

ASSUME_SECONDS = 30.0


class ClaimAssumptions:
    def __init__(self, ledger: Ledger, driver: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._driver = driver
        self._clock = clock
        self._in_flight: set[str] = set()
        self._written: dict[str, tuple[float, ClaimView]] = {}  # claim key -> (when, object we wrote)

    # --- in flight -------------------------------------------------------------------------------
    def begin_write(self, claim: ClaimView, uses: tuple[Use, ...]) -> None:
        """The claim's allocation is about to be written: count its planned uses from now on."""
        self._ledger.set_claim(claim.uid, uses)
        self._in_flight.add(claim.key)

    def writing(self, key: str) -> bool:
        return key in self._in_flight

    @property
    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def end_write(self, claim: ObjectView) -> None:
        """The write is over (either way); what it produced is recorded separately."""
        self._in_flight.discard(claim.key)

    # --- written ---------------------------------------------------------------------------------
    def wrote(self, claim: Mapping[str, Any]) -> ClaimView:
        """``claim`` is what the API holds after our write: assume it until the cache catches up."""
        view = ClaimView.parse(claim, self._driver)
        self._written[view.key] = (self._clock(), view)
        self._ledger.set_claim(view.uid, view.uses)
        return view

    def effective(self, key: str, cached: ClaimView | None) -> ClaimView | None:
        """The claim as the controller should see it: our written copy while the cache lags."""
        entry = self._written.get(key)
        if entry is None:
            return cached
        when, assumed = entry
        replaced = cached is not None and cached.uid != assumed.uid  # a new object, same name
        if (
            replaced
            or (cached is not None and cached.at_least(assumed))  # the cache caught up with our write
            or self._clock() - when > ASSUME_SECONDS
        ):
            del self._written[key]
            return cached
        return assumed

    def is_assumed(self, key: str) -> bool:
        return key in self._written

    # --- informer events -------------------------------------------------------------------------
    def observed(self, new: ClaimView, cached: ClaimView | None) -> None:
        """An informer event for ``new``: count the effective view, unless a write is in flight."""
        if new.key in self._in_flight:
            return
        effective = self.effective(new.key, cached) or new
        self._ledger.set_claim(effective.uid, effective.uses)

    def gone(self, claim: ObjectView) -> None:
        """The claim was deleted (or a write found it gone): nothing is counted or assumed for it."""
        self._written.pop(claim.key, None)
        self._ledger.remove_claim(claim.uid)

    def forget(self, key: str) -> None:
        """Drop what was assumed about the claim, keeping what the ledger counts."""
        self._written.pop(key, None)
