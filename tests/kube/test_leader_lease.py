"""The Lease as leader election reads it (``LeaseSpec``) and its two writes as pure edits."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from dra_driver.kube.leader import LeaseSpec, released, renewed

NOW = "2024-05-01T10:00:05.000000Z"
RENEWED = "2024-05-01T10:00:00.250000Z"
RENEWED_AT = datetime(2024, 5, 1, 10, 0, 0, 250000, tzinfo=UTC).timestamp()


def lease(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hami-dra-controller", "namespace": "ns", "resourceVersion": "9"},
        "spec": spec,
    }


def held_by_a() -> dict[str, Any]:
    return lease(
        holderIdentity="a",
        leaseDurationSeconds=15,
        acquireTime="2024-05-01T09:00:00.000000Z",
        renewTime=RENEWED,
        leaseTransitions=2,
    )


def test_a_held_lease_reads_holder_renewal_duration_and_transitions() -> None:
    spec = LeaseSpec.parse(held_by_a())
    assert spec == LeaseSpec(holder="a", renew_time=RENEWED_AT, duration=15.0, transitions=2)
    assert spec.expires(99.0) == RENEWED_AT + 15.0


@pytest.mark.parametrize(
    "obj",
    [
        lease(),
        lease(holderIdentity="", leaseDurationSeconds=0, renewTime=""),
        lease(holderIdentity=None, renewTime="not a time"),
        {"metadata": {"name": "x"}},
        {"spec": None},
    ],
)
def test_a_free_lease_has_no_holder_and_expired_long_ago(obj: dict[str, Any]) -> None:
    spec = LeaseSpec.parse(obj)
    assert spec == LeaseSpec(holder=None, renew_time=0.0, duration=None)
    assert spec.expires(15.0) == 15.0  # the reader's own duration, from the epoch


def test_a_renewal_time_without_fraction_is_read_too() -> None:
    assert LeaseSpec.parse(lease(renewTime="2024-05-01T10:00:00Z")).renew_time == RENEWED_AT - 0.25


def test_renewing_our_own_lease_moves_renew_time_only() -> None:
    obj = held_by_a()
    original = copy.deepcopy(obj)
    edited = renewed(obj, "a", 10.0, NOW)
    assert edited["spec"] == {**original["spec"], "leaseDurationSeconds": 10, "renewTime": NOW}
    assert edited["metadata"] == original["metadata"], "the resourceVersion guards the write"
    assert obj == original, "the Lease read is not changed in place"


def test_taking_over_records_the_acquisition_and_counts_a_transition() -> None:
    edited = renewed(held_by_a(), "b", 15.0, NOW)
    assert edited["spec"] == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "acquireTime": NOW,
        "renewTime": NOW,
        "leaseTransitions": 3,
    }


def test_taking_a_lease_without_spec_starts_counting_at_one() -> None:
    edited = renewed({"metadata": {"name": "x"}}, "b", 15.9, NOW)
    assert edited["spec"] == {
        "acquireTime": NOW,
        "leaseTransitions": 1,
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "renewTime": NOW,
    }


def test_releasing_clears_the_holder_and_shortens_the_term() -> None:
    obj = held_by_a()
    original = copy.deepcopy(obj)
    edited = released(obj)
    assert edited["spec"] == {**original["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
    assert LeaseSpec.parse(edited).holder is None
    assert obj == original
