"""A claim's device requests, parsed (dra_driver/resource/requests.py): ours and other drivers',
capacity rounded to the slices' request policy, and what we cannot honour refused with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.resource.requests import RequestError, claim_requests

DRIVER = "gpu.hami.io"


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {"requests": list(requests)}}}


def exact(name: str, **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **body}}


def asking(**capacity: str) -> dict[str, Any]:
    return claim(exact("a", capacity={"requests": capacity}))


def test_our_requests_are_parsed_and_other_drivers_named() -> None:
    ours = exact("a", capacity={"requests": {"memory": "1000.5Mi", "cores": "30"}})
    theirs = {"name": "x", "exactly": {"deviceClassName": "other"}}
    parsed, foreign = claim_requests(claim(ours, theirs), lambda name: name == DRIVER)
    assert foreign == ["x"]
    spec = parsed[0].alternatives[0]
    assert spec.memory == 1001 * 2**20 and spec.cores == 30  # memory rounded up to whole MiB


@pytest.mark.parametrize(
    ("capacity", "reason"),
    [
        ({"cores": "150"}, "cores 150 exceeds 100"),
        ({"memory": "lots"}, "memory 'lots'"),
        ({"memory": "-1Gi"}, "memory -1Gi is negative"),
        ({"cores": "-5"}, "cores -5 is negative"),
        # kube-scheduler finds no device for a capacity our devices do not publish, and consumes
        # the slots asked for: allocating with them ignored (consumedCapacity slots "1") is wrong.
        ({"memory": "1Gi", "bogus": "1"}, "capacity bogus is not published by our devices"),
        ({"memory": "1Gi", "slots": "3"}, "slots 3 is not supported"),
    ],
    ids=["cores-over-100", "unparsable-memory", "negative-memory", "negative-cores", "unknown-capacity",
         "several-slots"],
)  # fmt: skip
def test_capacity_we_cannot_honour_is_refused_not_clamped_or_ignored(
    capacity: dict[str, str], reason: str
) -> None:
    with pytest.raises(RequestError, match=reason):
        claim_requests(asking(**capacity), lambda name: True)
