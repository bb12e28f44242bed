"""A running claim keeps its share: a claim deleted past our finalizer (a tenant stripped it) while
a bound pod still names it stays booked in the ledger and the quota until that pod ends.

The admission policy (charts/hami-dra/templates/tenant-policies.yaml) refuses stripping the
finalizer of an allocated claim; this is the controller's own defence where it is not installed.
"""

from __future__ import annotations

from dra_driver.kube.api import PODS, RESOURCE_CLAIMS
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import claim, request

SIXTY_GIB = 60 * 1024**3


class OneCard(FakeCluster):
    """One H100 80GB; claims of 60Gi, so two cannot share it."""

    def place(self, name: str) -> None:
        self.pod(name, claim(name, request(memory="60Gi")))
        self.run()

    def strip_and_delete_claim(self, name: str) -> None:
        """The tenant's attack: with our finalizer stripped, the deletion goes through at once and
        the informer delivers the claim's last state, allocation intact."""
        self.remove(RESOURCE_CLAIMS, name)
        self.run()


def test_a_deleted_claim_of_a_running_pod_stays_booked_until_the_pod_ends() -> None:
    card = OneCard()
    card.place("runner")
    assert not card.gated("runner")
    card.bind("runner")
    card.run()
    card.strip_and_delete_claim("runner")
    assert card.booked_memory() == SIXTY_GIB
    card.place("second")
    assert card.gated("second"), "the card still holds the running pod's 60Gi"
    card.remove(PODS, "runner")
    card.run()
    assert card.booked_memory() == SIXTY_GIB  # now the second pod's
    assert not card.gated("second")
    assert card.controller.cache.orphans == {}


def test_a_deleted_claim_of_a_pod_that_never_ran_is_not_kept() -> None:
    card = OneCard()
    card.place("runner")
    # The gate is lifted but kube-scheduler never bound it: no container can hold the card.
    card.strip_and_delete_claim("runner")
    assert card.booked_memory() == 0
    card.place("second")
    assert not card.gated("second")
